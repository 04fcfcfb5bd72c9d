"""Hostile use of the module: interrupts, sizes past the machine, contradictory arguments and
mistakes inside rank functions each end in an exception of meshtensor's classes naming the value,
never a crash, a silent choice or an allocation that the machine cannot hold."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import meshtensor as mt

SMALL_GPT = dict(model="gpt:layers=1,heads=2,dim=16,context=16", steps=2, batch=4, eval_every=0)


def interrupted_run(body_source, delay, tmp_path):
    """Runs `body_source` (defines body(world)) on 2 thread ranks in a fresh interpreter that
    SIGINT interrupts after `delay` seconds; returns the finished process."""
    script = textwrap.dedent("""
        import os, signal, sys, threading
        import meshtensor as mt
        # A runner started in the background passes SIGINT on as ignored: take it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        corpus = mt.load_text(sys.argv[1])
        """) + textwrap.dedent(body_source) + textwrap.dedent("""
        threading.Timer(float(sys.argv[2]), lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            mt.run_threads(2, body)
            print("finished")
        except KeyboardInterrupt:
            print("interrupted")
        """)
    return subprocess.run([sys.executable, "-c", script, str(tmp_path / "text.txt"), str(delay)],
                          capture_output=True, text=True, timeout=120)


def test_ctrl_c_during_training_ends_in_keyboard_interrupt_never_a_crash(text, tmp_path):
    body = """
        def body(world):
            return mt.train(corpus, model="gpt:layers=2,heads=2,dim=32,context=32", steps=100000,
                            batch=8, eval_every=0, strategy="fsdp")
    """
    for delay in (0.2, 0.35, 0.5, 0.8, 1.1, 1.5):
        done = interrupted_run(body, delay, tmp_path)
        assert done.returncode == 0 and "interrupted" in done.stdout, (delay, done)


def test_ctrl_c_stops_a_long_generation_at_once(text, tmp_path):
    save = str(tmp_path / "ckpt")
    mt.run_threads(1, lambda world: mt.train(mt.load_text(text), **SMALL_GPT, save=save))
    body = f"""
        def body(world):
            return mt.generate({save!r}, ["a"] * 200000, max_new_tokens=14)
    """
    start = time.monotonic()
    done = interrupted_run(body, 0.5, tmp_path)
    assert done.returncode == 0 and "interrupted" in done.stdout, done
    assert time.monotonic() - start < 8


def test_an_infinite_timeout_waits_for_the_late_rank():
    def body(world):
        if world.rank == 1:
            time.sleep(0.3)
        world.barrier(timeout=math.inf)
        return True

    assert mt.run_threads(2, body) == [True, True]
    with pytest.raises(mt.InvalidArgument, match="timeout must be a positive number of seconds"):
        mt.run_threads(1, lambda world: world.barrier(timeout=0))


def test_text_windows_and_samples_refuse_bad_sizes(text):
    corpus = mt.load_text(text)
    for context in (0, -1):
        with pytest.raises(mt.InvalidArgument, match=f"a context of {context} tokens"):
            corpus.samples(context)
    with pytest.raises(mt.ResourceError, match="windows: 100000000000 windows of 16 tokens"):
        corpus.windows(16, 0, 0, 0, 10**11)


def test_models_too_big_for_the_machine_are_refused_before_allocating(text):
    with pytest.raises(mt.ResourceError, match=r"the GPT gpt:layers=256,heads=4,dim=8192"):
        mt.GPT(layers=256, heads=4, dim=8192)
    with pytest.raises(mt.ResourceError, match=r"an MLP 65536 -> \[65536\] -> 10"):
        mt.MLP(65536, [65536])
    corpus = mt.load_text(text)
    with pytest.raises(mt.ResourceError, match="training model gpt layers=64"):
        mt.run_threads(2, lambda world: mt.train(corpus, model="gpt:layers=64,dim=8192,context=16",
                                                 steps=1))


def test_contradictory_arguments_are_refused(text, tmp_path):
    corpus = mt.load_text(text)
    with pytest.raises(mt.InvalidArgument, match=r"model='mlp:16' and hidden=\[0\]"):
        mt.train(mt.load_dataset(), model="mlp:16", hidden=[0])
    with pytest.raises(mt.InvalidArgument, match="sequence parallelism .* has none"):
        mt.run_threads(2, lambda world: mt.train(corpus, **SMALL_GPT, mesh=(2,), names=("fsdp",),
                                                 sequence_parallel=True))
    with pytest.raises(mt.InvalidArgument, match="disagree on train\\(\\)'s model"):
        mt.run_threads(2, lambda world: mt.train(
            corpus, **SMALL_GPT, mesh=(2,), names=("fsdp",) if world.rank == 0 else ("dp",)))
    with pytest.raises(mt.ParseError, match="mesh dim name ' tp' is not an identifier"):
        mt.run_threads(2, lambda world: mt.train(corpus, **SMALL_GPT, mesh="2", names=" tp"))


def test_argument_errors_inside_a_rank_function_name_that_function():
    with pytest.raises(mt.ArgumentTypeError,
                       match=r"^ops.matmul\(\): argument 'a' must be DTensor, got NoneType None$"):
        mt.run_threads(2, lambda world: mt.ops.matmul(None, None))
    with pytest.raises(mt.ArgumentTypeError,
                       match=r"^epoch_order\(\): argument 'seed' is 1180591620717411303424, outside"):
        mt.epoch_order(4, 2**70, 0)


def test_a_text_without_validation_records_says_so(tmp_path):
    path = tmp_path / "few.txt"
    path.write_text("".join(f"record {i} with some words\n%\n" for i in range(12)))
    result = mt.run_threads(1, lambda world: mt.train(mt.load_text(str(path)), **SMALL_GPT))[0]
    assert result["logits_digest"] is None
    assert any("there is no validation set" in w for w in result["warnings"])


def test_generate_refuses_native_mode(text, tmp_path):
    save = str(tmp_path / "ckpt")
    mt.run_threads(1, lambda world: mt.train(mt.load_text(text), **SMALL_GPT, save=save))
    with pytest.raises(mt.InvalidArgument, match="mode='native': generation runs in"):
        mt.run_threads(1, lambda world: mt.generate(save, "a", mode="native"))

