"""`meshtensor train --json`'s final line and Python's mt.train() result of the same run have the
same keys (one schema, train::result_json), the same settings and the same digest; likewise
`meshtensor rl --json` and mt.rl() (rl::result_json).
Usage: same_result_keys.py <meshtensor> (run with an interpreter that imports meshtensor)"""
import json
import subprocess
import sys
import tempfile

import meshtensor as mt

binary = sys.argv[1]
with tempfile.TemporaryDirectory() as scratch:
    corpus = f"{scratch}/corpus.txt"
    with open(corpus, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog\n" * 200)
    model = "gpt:layers=1,heads=2,dim=16,context=16"
    cli = subprocess.run([binary, "train", "--data", corpus, "--model", model, "--steps", "2",
                          "--batch", "4", "--ranks", "2", "--json"],
                         capture_output=True, text=True, check=True)
    final = [json.loads(line) for line in cli.stdout.splitlines() if '"final"' in line][-1]
    text = mt.load_text(corpus)
    results = mt.run_threads(2, lambda world: mt.train(text, model=model, steps=2, batch=4))
    python = results[0]
    missing = sorted(set(final) ^ set(python))
    assert not missing, f"keys in one result only: {missing}"
    assert final["digest"] == python["digest"], (final["digest"], python["digest"])
    assert final["settings"] == python["settings"], (final["settings"], python["settings"])
    print(f"ok: {len(final)} keys in both train results, digest {final['digest']}")

    rl_run = dict(steps=1, prompts=2, samples=2, new_tokens=4, task="arithmetic", seed=3)
    cli = subprocess.run([binary, "rl", "--model", model, "--json"] +
                         [f"--{k.replace('_', '-')}={v}" for k, v in rl_run.items()],
                         capture_output=True, text=True, check=True)
    final = json.loads(cli.stdout.splitlines()[-1])
    python = mt.run_threads(1, lambda world: mt.rl(model=model, **rl_run))[0]
    missing = sorted(set(final) ^ set(python))
    assert not missing, f"keys in one rl result only: {missing}"
    assert final["trainer_settings"] == python["trainer_settings"]
    assert final["weights_digest"] == python["weights_digest"]
    print(f"ok: {len(final)} keys in both rl results, digest {final['weights_digest']}")
