"""mt.rl: GRPO with a Python reward, the same bits as the command line, errors named."""

import json
import math
import re
import subprocess
import sys
import textwrap

import pytest

import meshtensor as mt

RUN = dict(steps=2, prompts=2, samples=3, new_tokens=6, prompt_bytes=8, lr=1e-3, seed=3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    text = root / "text.txt"
    text.write_text("".join(f"fortune number {i}: {'ab ' * (i % 5)}the end\n%\n" for i in range(80)))
    save = str(root / "ckpt")
    corpus = mt.load_text(str(text))
    mt.run_threads(2, lambda world: mt.train(corpus, model="gpt:layers=1,heads=4,dim=16,context=24",
                                             steps=2, batch=4, mode="exact", eval_every=0,
                                             strategy="fsdp", save=save))
    return save


def vowels(prompt, completion):
    return sum(c in "aeiou" for c in completion) / len(completion)


def test_a_python_reward_runs_on_any_layout_with_the_same_bits(checkpoint, cli):
    one = mt.run_threads(1, lambda world: mt.rl(checkpoint, **RUN, reward=vowels))[0]
    assert one["parity"]["identical"] == one["parity"]["tokens"] == 2 * 2 * 3 * 6
    assert len(one["reward_mean"]) == 2
    spread = mt.run_threads(4, lambda world: mt.rl(checkpoint, **RUN, reward=vowels,
                                                   mesh="2x2", names="fsdp,tp",
                                                   sequence_parallel=True, generator=(2, 2)))
    assert {r["weights_digest"] for r in spread} == {one["weights_digest"]}
    assert spread[0]["reward_mean"] == one["reward_mean"]
    # The built-in words task matches the command line bit for bit.
    words = mt.run_threads(2, lambda world: mt.rl(checkpoint, **RUN, strategy="fsdp",
                                                  generator_tp=2))[0]
    shown = json.loads(cli("rl", "--init", checkpoint, "--steps", 2, "--prompts", 2, "--samples",
                           3, "--new-tokens", 6, "--prompt-bytes", 8, "--lr", 1e-3, "--seed", 3,
                           "--json"))
    assert shown["weights_digest"] == words["weights_digest"]
    assert shown["reward_mean"] == words["reward_mean"]


def test_on_step_sees_every_step(checkpoint):
    seen = []
    mt.run_threads(2, lambda world: mt.rl(checkpoint, **RUN, on_step=seen.append))
    assert [s["step"] for s in seen] == [1, 2]
    assert all(s["identical"] == s["tokens"] for s in seen)


@pytest.mark.parametrize("reward, words", [
    (lambda p, c: math.nan, "is nan, not a finite number"),
    (lambda p, c: math.inf, "is inf, not a finite number"),
    (lambda p, c: "good", "returned str 'good', not a number"),
    (lambda p, c: None, "returned NoneType None, not a number"),
    (lambda p, c: 1 / 0, "raised ZeroDivisionError: division by zero"),
])
def test_a_bad_reward_names_the_prompt_and_sample(checkpoint, reward, words):
    with pytest.raises(mt.DataError, match=r"prompt 0 \('.*'\), sample 0.*" + words):
        mt.run_threads(2, lambda world: mt.rl(checkpoint, **RUN, reward=reward))


def test_bad_settings_name_the_value(checkpoint):
    bad = [
        (dict(samples=1), "at least 2 samples per prompt, got 1"),
        (dict(kl=-1.0), "got -1"),
        (dict(prompts=0), "prompts: .0. is too small \\(at least 1\\)"),
        (dict(generator=(1, 2)), "do not share a world of 1 ranks"),
        (dict(mode="native"), "mode native: the generator's log-probabilities"),
        (dict(reward=42), "must be a callable"),
    ]
    for change, words in bad:
        with pytest.raises(mt.Error, match=words):
            mt.run_threads(1, lambda world: mt.rl(checkpoint, **{**RUN, **change}))
    with pytest.raises(mt.InvalidArgument, match="does not divide the model's 4 heads"):
        mt.run_threads(3, lambda world: mt.rl(checkpoint, **RUN, generator_tp=3))
    with pytest.raises(mt.InvalidArgument, match="unknown option 'epochs'"):
        mt.run_threads(1, lambda world: mt.rl(checkpoint, **RUN, epochs=2))


def test_ctrl_c_stops_a_run_at_once(checkpoint):
    import os
    import signal
    import threading
    import time

    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        mt.run_threads(2, lambda world: mt.rl(checkpoint, **{**RUN, "steps": 100000},
                                              generator=(1, 2)))
    timer.cancel()
    assert time.monotonic() - start < 30


def english_words_reward(seen):
    """The built-in words reward, written again from its documented rule, on the exact bytes of
    each completion; `seen` collects the completions' bytes."""
    with open("/usr/share/dict/words", "rb") as f:
        dictionary = {line.rstrip(b"\r\n").lower() for line in f if line.strip()}

    def reward(prompt, completion):
        text = completion.encode("utf-8", "surrogateescape")
        seen.append((prompt.encode("utf-8", "surrogateescape"), text))
        words = re.findall(rb"[A-Za-z]+(?:'[A-Za-z]+)*", text)
        if not words:
            return 0.0
        english = {w.lower() for w in words
                   if (w in (b"a", b"A", b"I") if len(w) == 1 else w.lower() in dictionary)}
        return len(english) / max(len(words), (len(text) + 5) // 6)
    return reward


def test_a_python_reward_sees_the_exact_bytes(checkpoint, tmp_path):
    # Fresh weights emit control bytes and bytes that are no UTF-8; a Python reward equal to the
    # built-in one must then give the built-in run's bits. The prompts are cut inside
    # two-byte characters.
    text = tmp_path / "accents.txt"
    text.write_text("".join(f"é{'è' * (i % 4)} café número {i} ñandú\n%\n" for i in range(120)),
                    encoding="utf-8")
    run = dict(RUN, model="gpt:layers=1,heads=4,dim=16,context=24", data=str(text),
               prompt_bytes=5, lr=3e-2, steps=2)
    builtin = mt.run_threads(2, lambda world: mt.rl(**run, strategy="fsdp"))[0]
    seen = []
    python = mt.run_threads(2, lambda world: mt.rl(**run, strategy="fsdp",
                                                   reward=english_words_reward(seen)))[0]
    assert python["weights_digest"] == builtin["weights_digest"]
    assert python["reward_mean"] == builtin["reward_mean"]
    completions = b"".join(c for _, c in seen)
    assert any(b < 0x20 and b not in b"\n\t" for b in completions), "no control byte drawn"
    with pytest.raises(UnicodeDecodeError):
        completions.decode("utf-8")
    prompts = {p for p, _ in seen}
    assert all(len(p) == 5 for p in prompts)
    assert any(not p.decode("utf-8", "ignore").encode() == p for p in prompts), \
        "no prompt was cut inside a character"
    # embeddings 4096 + 384, a block 3280, the final norm 32, the head 4096 + 256.
    assert python["parameters"] == 12144 and python["parameter_tensors"] == 18


def test_ctrl_c_stops_a_run_whose_reward_blocks(checkpoint):
    script = textwrap.dedent("""
        import os, signal, sys, threading, time
        import meshtensor as mt
        # A runner started in the background passes SIGINT on as ignored: take it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sent = []
        def blocked(prompt, completion):
            if not sent:
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(600)
            return 0.0
        try:
            mt.run_threads(2, lambda world: mt.rl(sys.argv[1], steps=2, prompts=2, samples=3,
                                                  new_tokens=6, prompt_bytes=8, reward=blocked))
            print("finished")
        except KeyboardInterrupt:
            print(f"interrupted after {time.monotonic() - sent[0]:.3f} s")
        """)
    done = subprocess.run([sys.executable, "-c", script, checkpoint], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "interrupted after" in done.stdout, done
    assert float(done.stdout.split("after ")[1].split()[0]) < 1.0, done.stdout
