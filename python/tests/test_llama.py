"""The Llama family from Python: mt.train, mt.generate and mt.rl on the models the command line
builds, with its bits."""

import json
import re

import pytest

import meshtensor as mt

MODEL = "llama:layers=2,heads=4,kv_heads=2,dim=16,ffn=32,context=16,qk_norm=1"
RUN = dict(model=MODEL, steps=3, batch=6, seed=2, lr=3e-3, warmup=1, mode="exact", eval_every=0)


def test_train_gives_the_cli_digest_on_any_layout(cli, text):
    corpus = mt.load_text(text)
    one = mt.run_threads(1, lambda world: mt.train(corpus, **RUN))[0]
    spread = mt.run_threads(4, lambda world: mt.train(corpus, **RUN, mesh=(2, 2),
                                                      names=("fsdp", "tp"),
                                                      sequence_parallel=True))
    assert {r["digest"] for r in spread} == {one["digest"]}
    assert {r["logits_digest"] for r in spread} == {one["logits_digest"]}
    plan = dict(spread[0]["parallel_plan"])
    assert plan["blocks.0.attn.q_norm"].startswith("HeadParallel")
    assert plan["blocks.0.mlp.gate_up"].startswith("ColwiseParallel")
    shown = cli("train", "--data", text, "--ranks", 1, *[a for k, v in RUN.items()
                                                         for a in (f"--{k.replace('_', '-')}", v)])
    assert re.search(r"weights digest ([0-9a-f]{16})", shown).group(1) == one["digest"]
    with pytest.raises(mt.InvalidArgument, match="does not divide the model's 2 key/value heads"):
        mt.run_threads(4, lambda world: mt.train(corpus, **RUN, mesh=(4,), names=("tp",)))
    with pytest.raises(mt.ParseError, match="3 kv_heads do not divide the 4 heads"):
        mt.train(corpus, **dict(RUN, model="llama:heads=4,kv_heads=3"))


def test_generate_and_rl_run_on_a_llama_checkpoint(cli, text, tmp_path):
    corpus = mt.load_text(text)
    save = str(tmp_path / "ckpt")
    mt.run_threads(2, lambda world: mt.train(corpus, **RUN, mesh=(2,), names=("tp",), save=save))
    options = dict(max_new_tokens=6, temperature=0.9, top_k=10, seed=3, mode="exact")
    made = mt.run_threads(1, lambda world: mt.generate(save, "fortune", **options))[0]
    shown = json.loads(cli("generate", "--checkpoint", save, "--prompt", "fortune", "--json",
                           "--ranks", 2, *[a for k, v in options.items()
                                           for a in (f"--{k.replace('_', '-')}", v)]))
    assert shown["tokens"] == made[0]["tokens"] and shown["logprobs"] == made[0]["logprobs"]
    run = dict(steps=2, prompts=2, samples=2, new_tokens=4, prompt_bytes=8, lr=1e-3, seed=3)
    result = mt.run_threads(2, lambda world: mt.rl(save, **run, strategy="fsdp",
                                                   generator_tp=2))[0]
    assert result["parity"]["identical"] == result["parity"]["tokens"] == 2 * 2 * 2 * 4
