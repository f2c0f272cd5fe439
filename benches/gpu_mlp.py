"""ringflow against PyTorch on the same device: MLP training steps per second, side by side.

    cargo build --release --features cuda
    python3 benches/gpu_mlp.py                       # the wide MLP 784-1024-1024-10, batch 1024, cuda
    python3 benches/gpu_mlp.py --device cpu --steps 20 --warmup 2

Runs `target/release/ringflow bench train --json` and `benches/torch_mlp.py --json` with the same
settings (model, optimizer, learning rate, batch, warm-up and timed steps), alternating them
`--repeats` times, and prints a Markdown table of the median samples/s and step times of each,
with the ratio ringflow / PyTorch. Both time the same work per step: forward, cross-entropy,
backward, optimizer step, zeroed gradients and the loss read back to the host, on batches that
were uploaded to the device before timing. `--min-ratio 0.8` makes the exit status 2 when
ringflow is slower than that fraction of PyTorch.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N (default cuda)")
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=None, help="default: 0.01 for sgd, 0.001 for adam")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each (median kept)")
    p.add_argument("--ringflow", default=os.path.join(ROOT, "target", "release", "ringflow"))
    p.add_argument("--python", default=sys.executable, help="the Python that has torch")
    p.add_argument("--min-ratio", type=float, default=None,
                   help="exit 2 when ringflow's samples/s is below this fraction of PyTorch's")
    p.add_argument("--json-out", default=None, help="write every run's report to this file")
    return p.parse_args()


def common(args):
    out = [
        "--device", args.device, "--layers", args.layers, "--batch", str(args.batch),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--optimizer", args.optimizer,
        "--batches", str(args.batches), "--seed", str(args.seed), "--json",
    ]
    if args.lr is not None:
        out += ["--lr", repr(args.lr)]
    return out


def run_json(cmd, name):
    print(f"$ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit(f"{name} failed (exit {p.returncode})")
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"{name} printed no JSON report:\n{p.stdout}{p.stderr}")
    return json.loads(lines[-1])


def main():
    args = parse_args()
    if not os.path.exists(args.ringflow):
        sys.exit(f"build first: cargo build --release --features cuda ({args.ringflow} is missing)")
    rf_cmd = [args.ringflow, "bench", "train", *common(args)]
    pt_cmd = [args.python, os.path.join(ROOT, "benches", "torch_mlp.py"), *common(args)]
    runs = {"ringflow": [], "pytorch": []}
    for _ in range(max(1, args.repeats)):
        runs["ringflow"].append(run_json(rf_cmd, "ringflow bench train"))
        runs["pytorch"].append(run_json(pt_cmd, "benches/torch_mlp.py"))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(runs, f, indent=1)

    def summary(reports):
        return {
            "samples_per_s": statistics.median(r["samples_per_s"] for r in reports),
            "ms_median": statistics.median(r["ms_per_step_median"] for r in reports),
            "ms_mean": statistics.median(r["ms_per_step_mean"] for r in reports),
            "final_loss": reports[-1]["final_loss"],
            "all": [round(r["samples_per_s"]) for r in reports],
        }

    rf, pt = summary(runs["ringflow"]), summary(runs["pytorch"])
    torch_info = runs["pytorch"][0]
    ratio = rf["samples_per_s"] / pt["samples_per_s"]
    print(f"MLP {args.layers.replace(',', '-')}, {args.optimizer}"
          f" (lr {runs['ringflow'][0]['lr']:g}), batch {args.batch}, {args.steps} timed steps after"
          f" {args.warmup} warm-up, median of {len(runs['ringflow'])} alternating runs;"
          f" device {args.device} ({torch_info['device_name']}), PyTorch {torch_info['framework_version']}")
    print()
    print("| framework | device | batch | samples/s | ms/step (median) | ms/step (mean) | final loss | runs (samples/s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, s in (("ringflow", rf), ("PyTorch", pt)):
        print(f"| {name} | {args.device} | {args.batch} | {s['samples_per_s']:,.0f} | {s['ms_median']:.3f} |"
              f" {s['ms_mean']:.3f} | {s['final_loss']:.4f} | {', '.join(map(str, s['all']))} |")
    print()
    print(f"ringflow / PyTorch: {ratio:.2f}x samples/s")
    if args.min_ratio is not None and ratio < args.min_ratio:
        print(f"below the goal of {args.min_ratio:.2f}x", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
