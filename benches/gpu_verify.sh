#!/usr/bin/env bash
# Verifies the CUDA engine on a machine with an NVIDIA GPU, in one command, and prints the figures
# docs/gpu.md asks for. It needs no Rust toolchain there: build on any machine with
#
#   cargo build --release --features cuda
#   cargo test -p ringflow-ml --features cuda --no-run    # prints the conformance binary's path
#
# and run, from the repository root of the GPU machine (Python with torch for the peer):
#
#   benches/gpu_verify.sh target/release/ringflow target/debug/deps/conformance-<hash>
#
# Steps, each printed under its own `==` header; the first that fails stops the script (exit 1):
#   1. the GPU as the driver sees it (nvidia-smi);
#   2. the conformance suite with RINGFLOW_REQUIRE_GPU=1, so a CUDA case fails instead of skipping;
#   3. MNIST (examples/mnist.toml, 2 epochs, 2 executors) on cuda and on the CPU, test accuracies
#      side by side (cuda must come within 0.01 of the CPU);
#   4. the wide MLP against PyTorch on the same GPU (benches/gpu_mlp.py, SGD and Adam; exit 2 when
#      ringflow is below 0.8x PyTorch's samples/s);
#   5. the gradient staging of the ring: examples/mnist_wide.toml at batch 1024 on 1 and on 4
#      executors sharing the GPU, milliseconds per step and the all-reduce share of each;
#   6. the staging's time per step of each rank and the caching allocator's hit rate, from the
#      executors' debug log.
# Where CUDA's libraries are not on the loader path, LD_LIBRARY_PATH is extended with those of the
# CUDA toolkit and of PyTorch's wheels, if present.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 RINGFLOW_BINARY CONFORMANCE_TEST_BINARY" >&2
    exit 64
fi
ringflow=$(realpath "$1")
conformance=$(realpath "$2")
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
echo "== all steps passed"
