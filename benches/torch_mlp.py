"""The PyTorch peer of `ringflow bench train`: the same MLP training step, timed the same way.

    python3 benches/torch_mlp.py --device cuda --layers 784,1024,1024,10 --batch 1024 --json

An MLP of Linear layers with ReLU between them (torch.nn.Sequential), softmax cross-entropy,
and the same optimizer as ringflow's benchmark: SGD with momentum 0.9 (lr 0.01) or Adam (lr 1e-3,
betas 0.9/0.999, eps 1e-8). A few random batches (features uniform in [0, 1), integer labels)
are uploaded to the device before timing and cycled through, so no data moves in the timed loop.
Each step is zero_grad, forward, loss, backward, optimizer step and `loss.item()` (the per-step
metric download, which also waits for the GPU), exactly the work `ringflow bench train` times.
Matrix products run in full FP32 (TF32 off, PyTorch's default), as ringflow's cuBLAS SGEMM does.

On a CPU that other processes keep busy, PyTorch's OpenMP threads can slow it down many times
over: `--threads 1` avoids that there. Prints `key=value` pairs, or one JSON object with `--json` (the fields of ringflow's report).
`benches/gpu_mlp.py` runs both and prints them side by side.
"""

import argparse
import json
import statistics
import sys
import time

try:
    import torch
except ImportError:
    sys.exit("torch_mlp.py needs PyTorch: python3 -m pip install torch")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--activation", default="relu", choices=["relu"])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=None, help="default: 0.01 for sgd, 0.001 for adam")
    p.add_argument("--batches", type=int, default=4, help="distinct batches cycled through")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: PyTorch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object on one line")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    layers = [int(w) for w in args.layers.split(",")]
    if len(layers) < 2 or min(layers) < 1:
        sys.exit(f"--layers needs at least two positive widths, not {args.layers}")
    if args.batch < 1 or args.steps < 1 or args.batches < 1 or args.warmup < 0:
        sys.exit("--batch, --steps and --batches must be at least 1, --warmup at least 0")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"device {args.device} was requested, but PyTorch sees no CUDA GPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)

    modules = []
    for i, (fan_in, fan_out) in enumerate(zip(layers[:-1], layers[1:])):
        modules.append(torch.nn.Linear(fan_in, fan_out))
        if i < len(layers) - 2:
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules).to(device)
    model.train()
    if args.optimizer == "sgd":
        lr = 0.01 if args.lr is None else args.lr
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        lr = 0.001 if args.lr is None else args.lr
        opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = torch.nn.CrossEntropyLoss()

    gen = torch.Generator().manual_seed(args.seed)
    batches = [
        (
            torch.rand(args.batch, layers[0], generator=gen).to(device),
            torch.randint(0, layers[-1], (args.batch,), generator=gen).to(device),
        )
        for _ in range(args.batches)
    ]
    if device.type == "cuda":
        torch.cuda.synchronize(device)

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        if value != value or value in (float("inf"), float("-inf")):
            sys.exit(f"the loss is {value} at step {i + 1} (training diverged; try a smaller --lr)")
        return value

    first_loss = None
    for i in range(args.warmup):
        value = step(i)
        first_loss = value if first_loss is None else first_loss
    times = []
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        t = time.perf_counter()
        final_loss = step(i)
        times.append(time.perf_counter() - t)
        first_loss = final_loss if first_loss is None else first_loss
    total = time.perf_counter() - start

    report = {
        "framework": "pytorch",
        "framework_version": torch.__version__,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "layers": layers,
        "activation": args.activation,
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "optimizer": args.optimizer,
        "lr": lr,
        "warmup": args.warmup,
        "steps": args.steps,
        "samples_per_s": args.batch * args.steps / total,
        "ms_per_step_median": sorted(times)[len(times) // 2] * 1e3,  # as ringflow picks it
        "ms_per_step_mean": statistics.fmean(times) * 1e3,
        "first_loss": first_loss,
        "final_loss": final_loss,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"torch {report['framework_version']} device={args.device} "
            f"layers={'-'.join(map(str, layers))} batch={args.batch} optimizer={args.optimizer} "
            f"lr={lr} steps={args.steps} samples_per_s={report['samples_per_s']:.0f} "
            f"ms_per_step_median={report['ms_per_step_median']:.3f} "
            f"ms_per_step_mean={report['ms_per_step_mean']:.3f} "
            f"first_loss={first_loss:.4f} final_loss={final_loss:.4f}"
        )


if __name__ == "__main__":
    main()
