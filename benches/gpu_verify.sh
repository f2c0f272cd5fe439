#!/usr/bin/env bash
# Verifies the CUDA engine on a machine with an NVIDIA GPU, in one command, and prints the figures
# docs/gpu.md asks for. It needs no Rust toolchain there: build on any machine with
#
#   cargo build --release --features cuda
#   cargo build --release --features cuda -p ringflow-ml --example conv_bench
#   cargo test -p ringflow-ml --features cuda --no-run    # prints the conformance binary's path
#
# and run, from the repository root of the GPU machine (Python with torch for the peer):
#
#   benches/gpu_verify.sh target/release/ringflow target/debug/deps/conformance-<hash> \
#       target/release/examples/conv_bench
#
# Steps, each printed under its own `==` header; the first that fails stops the script (exit 1):
#   1. the GPU as the driver sees it (nvidia-smi);
#   2. the conformance suite with RINGFLOW_REQUIRE_GPU=1, so a CUDA case fails instead of skipping
#      (it includes convolutions, pooling and batch norm against references and against the CPU);
#   3. MNIST (examples/mnist.toml, 2 epochs, 2 executors) on cuda and on the CPU, test accuracies
#      side by side (cuda must come within 0.01 of the CPU);
#   4. the wide MLP against PyTorch on the same GPU (benches/gpu_mlp.py, SGD and Adam; exit 2 when
#      ringflow is below 0.8x PyTorch's samples/s);
#   5. the gradient staging of the ring: examples/mnist_wide.toml at batch 1024 on 1 and on 4
#      executors sharing the GPU, milliseconds per step and the all-reduce share of each;
#   6. the staging's time per step of each rank and the caching allocator's hit rate, from the
#      executors' debug log;
#   7. convolution layers on the GPU (the ResNet-sized 64→64 3×3 on 56×56 at batch 8, LeNet's,
#      depthwise, pointwise): ringflow's forward and forward + backward GFLOP/s and the time of
#      each pass (ml/examples/conv_bench.rs with --device cuda), next to PyTorch's (cuDNN, TF32
#      off, as ringflow computes in full FP32) for the same layers on the same GPU.
# Where CUDA's libraries are not on the loader path, LD_LIBRARY_PATH is extended with those of the
# CUDA toolkit and of PyTorch's wheels, if present.
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 RINGFLOW_BINARY CONFORMANCE_TEST_BINARY CONV_BENCH_BINARY" >&2
    exit 64
fi
ringflow=$(realpath "$1")
conformance=$(realpath "$2")
conv_bench=$(realpath "$3")
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for lib in /usr/local/cuda/lib64 \
    $("$python" -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, d, "lib") for d in os.listdir(p)))' 2>/dev/null || true); do
    [ -d "$lib" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$lib"
done
export LD_LIBRARY_PATH

echo "== 1. GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

echo "== 2. conformance suite (RINGFLOW_REQUIRE_GPU=1)"
RINGFLOW_REQUIRE_GPU=1 "$conformance" --test-threads 4 2>&1 | tail -n 25

# One `ringflow local` run; the summary lands in $work/$1.json.
train() {
    local name=$1
    shift
    "$ringflow" local "$@" --ui off --summary-json "$work/$name.json" \
        --set "cluster.checkpoint_dir=$work/$name" >"$work/$name.out" 2>"$work/$name.err" || {
        echo "ringflow local $* failed:" >&2
        tail -n 20 "$work/$name.err" >&2
        exit 1
    }
}
# Prints a field of a run's summary.
field() {
    "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$work/$1.json" "$2"
}

echo "== 3. MNIST, 2 epochs, 2 executors: cuda against the CPU"
train mnist-cuda examples/mnist.toml --executors 2 --set train.epochs=2 --set cluster.device=cuda
train mnist-cpu examples/mnist.toml --executors 2 --set train.epochs=2
cuda_acc=$(field mnist-cuda test_accuracy)
cpu_acc=$(field mnist-cpu test_accuracy)
echo "test accuracy: cuda $cuda_acc, cpu $cpu_acc; samples/s: cuda $(field mnist-cuda train_samples_per_s), cpu $(field mnist-cpu train_samples_per_s)"
"$python" -c "import sys; sys.exit(0 if float('$cuda_acc') >= float('$cpu_acc') - 0.01 else 1)" || {
    echo "cuda's accuracy is more than 0.01 below the CPU's" >&2
    exit 1
}

echo "== 4. wide MLP 784-1024-1024-10, batch 1024, against PyTorch on the same GPU"
"$python" benches/gpu_mlp.py --ringflow "$ringflow" --python "$python" --device cuda --optimizer sgd --min-ratio 0.8
"$python" benches/gpu_mlp.py --ringflow "$ringflow" --python "$python" --device cuda --optimizer adam --min-ratio 0.8

echo "== 5. gradient staging: the wide MLP on 1 and 4 executors sharing the GPU"
for n in 1 4; do
    train "wide-$n" examples/mnist_wide.toml --executors "$n" --set cluster.device=cuda \
        --set train.batch_size=1024 --set train.epochs=2 \
        --log ringflow_ml=debug,ringflow_executor=debug
done
"$python" - "$work" <<'EOF'
import json, sys
for n in (1, 4):
    s = json.load(open(f"{sys.argv[1]}/wide-{n}.json"))
    last = s["history"][-1]
    p = last["phases"]
    total = sum(p.values())
    print(f"{n} executor(s): {1000 * last['seconds'] / last['steps']:.2f} ms/step in epoch 2, "
          f"all-reduce {100 * p['allreduce'] / total:.1f}% of a step "
          f"(data {p['data']:.3f} s, forward {p['forward']:.3f}, backward {p['backward']:.3f}, "
          f"all-reduce {p['allreduce']:.3f}, optimizer {p['optimizer']:.3f}), "
          f"test accuracy {s['test_accuracy']:.4f}")
EOF

echo "== 6. gradient staging per rank, and the caching allocator, from the debug log"
grep -h "gradient staging" "$work"/wide-4.err | tail -n 8 || echo "no staging report in the debug log"
grep -h "allocator:" "$work"/wide-4.err | tail -n 4 || echo "no allocator report in the debug log"
echo "== 7. convolution layers: ringflow (conv_bench --device cuda) and PyTorch on the same GPU"
"$conv_bench" --device cuda --seconds 2
"$python" - <<'EOF'
import time
import torch

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")
# The layers of ml/examples/conv_bench.rs: (name, input, weight, padding, groups).
layers = [
    ("ResNet 64→64 3×3 pad 1, 56×56, batch 8", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("LeNet conv1 1→32 5×5, 28×28, batch 64", (64, 1, 28, 28), (32, 1, 5, 5), 0, 1),
    ("LeNet conv2 32→64 5×5, 12×12, batch 64", (64, 32, 12, 12), (64, 32, 5, 5), 0, 1),
    ("depthwise 64 3×3 pad 1, 56×56, batch 8", (8, 64, 56, 56), (64, 1, 3, 3), 1, 64),
    ("pointwise 64→128 1×1, 28×28, batch 8", (8, 64, 28, 28), (128, 64, 1, 1), 0, 1),
]


def best(f, budget=2.0):
    """The fastest of the timed calls of f within about `budget` seconds (at least 3)."""
    f()
    torch.cuda.synchronize()
    start, runs, fastest = time.perf_counter(), 0, float("inf")
    while runs < 3 or time.perf_counter() - start < budget:
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        fastest = min(fastest, time.perf_counter() - t)
        runs += 1
    return fastest


print(f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
      f"{torch.cuda.get_device_name()}")
print(f"{'layer':<42} {'fwd':>8} {'fwd+bwd':>10} {'fwd':>8} {'fwd+bwd':>8}")
print(f"{'':<42} {'GFLOP/s':>8} {'GFLOP/s':>10} {'ms':>8} {'ms':>8}")
for name, xs, ws, pad, groups in layers:
    x = torch.empty(xs, device=dev).uniform_(-1, 1).requires_grad_()
    w = torch.empty(ws, device=dev).uniform_(-0.1, 0.1).requires_grad_()

    def conv():
        return torch.nn.functional.conv2d(x, w, padding=pad, groups=groups)

    def forward():
        with torch.no_grad():
            conv()

    def both():
        x.grad = w.grad = None
        conv().sum().backward()

    with torch.no_grad():
        flops = 2.0 * conv().numel() * ws[1] * ws[2] * ws[3]
    f, b = best(forward), best(both)
    print(f"{name:<42} {flops / f / 1e9:>8.1f} {3 * flops / b / 1e9:>10.1f} "
          f"{1e3 * f:>8.2f} {1e3 * b:>8.2f}")
EOF
echo "== all steps passed"
