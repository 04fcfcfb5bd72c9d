"""mt.rl: GRPO with a Python reward, the same bits as the command line, errors named."""

import json
import math

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
        (dict(prompts=0), "at least 1, got 0"),
        (dict(generator=(1, 2)), "do not share a world of 1 ranks"),
        (dict(mode="native"), "mode='native'"),
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
