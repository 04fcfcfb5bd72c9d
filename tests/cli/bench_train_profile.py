"""`bench train --json`: every run's profile rows add up to its step_seconds (within 5%), and a
run of several rounds reports the step time and profile of one of them, the median round.
Usage: bench_train_profile.py <meshtensor>"""
import json
import subprocess
import sys

binary = sys.argv[1]
args = ["bench", "train", "--model", "gpt:layers=1,heads=2,dim=32,context=32", "--batch", "8",
        "--steps", "9", "--ranks", "1", "--rounds", "3", "--json"]
report = json.loads(subprocess.run([binary] + args, check=True, capture_output=True,
                                   text=True).stdout)
rows = {"other", "matmul", "attention", "exact_sums", "norms_activations", "loss", "optimizer",
        "communication_wait", "data"}
for run in report["runs"]:
    profile = run["profile"]
    assert set(profile) == rows, profile
    step = run["step_seconds"]
    total = sum(profile.values())
    assert step > 0 and abs(total - step) <= 0.05 * step, (run["mode"], total, step)
    assert profile["matmul"] > 0 and profile["attention"] > 0, profile
print(f"{len(report['runs'])} runs: profile rows add up to the step time")
