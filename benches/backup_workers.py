"""Step time with an injected straggler, with and without backup workers.

Runs the MNIST example on 4 local executors (release build of `ringflow`) in six settings: no
straggler, one persistent straggler (rank 3 sleeps 20 ms in every step), and random stragglers
(every rank sleeps 20 ms in 10% of its steps), each with `cluster.backup_workers` 0 and 1.
The straggler comes from the test-only RINGFLOW_TEST_STRAGGLER variable (docs/backup-workers.md).
Step time is the slowest rank's training time over the steps of epochs 2.. (epoch 1 warms up).

    cargo build --release --features test-hooks && python3 benches/backup_workers.py
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "ringflow")
EXECUTORS = int(os.environ.get("EXECUTORS", "4"))
EPOCHS = int(os.environ.get("EPOCHS", "3"))

SETTINGS = [
    ("none", ""),
    ("rank 3 +20 ms every step", "3:20"),
    ("every rank +20 ms in 10% of steps", "*:20:0.1"),
]


def run(straggler, backups, workdir):
    out = os.path.join(workdir, "summary.json")
    args = [
        BIN, "local", "examples/mnist.toml",
        "--set", f"cluster.executors={EXECUTORS}",
        "--set", f"cluster.backup_workers={backups}",
        "--set", f"train.epochs={EPOCHS}",
        "--set", f"cluster.checkpoint_dir={os.path.join(workdir, 'run')}",
        "--summary-json", out,
    ]
    env = dict(os.environ, RINGFLOW_TEST_STRAGGLER=straggler)
    subprocess.run(args, cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        s = json.load(f)
    later = s["history"][1:]
    seconds = sum(e["seconds"] for e in later)
    steps = sum(e["steps"] for e in later)
    rows = sum(e["samples"] + e.get("dropped_samples", 0) for e in later)
    dropped = sum(e.get("dropped_samples", 0) for e in later)
    return 1000.0 * seconds / steps, dropped / rows, s["test_accuracy"]


def main():
    if not os.path.exists(BIN):
        sys.exit(f"build first: cargo build --release --features test-hooks ({BIN} is missing)")
    print(f"{EXECUTORS} executors, MNIST 784-100-10, {EPOCHS} epochs (step time over epochs 2..)")
    print("| straggler | backup_workers | ms/step | rows dropped | test accuracy |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as workdir:
        for name, straggler in SETTINGS:
            for backups in (0, 1):
                ms, dropped, acc = run(straggler, backups, workdir)
                print(f"| {name} | {backups} | {ms:.2f} | {100 * dropped:.1f}% | {acc:.4f} |",
                      flush=True)


if __name__ == "__main__":
    main()
