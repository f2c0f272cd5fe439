#!/usr/bin/env bash
# Builds the CUDA emulator into DIR (default target/cuda-emulator): one shared library, reached
# under the names cudarc loads the CUDA driver and cuBLAS by. Put DIR first on LD_LIBRARY_PATH,
# with NVRTC's directory (the real NVRTC: it needs no GPU), and the `cuda` feature runs on it.
# DIR/nccl holds the same library as NCCL: add it to the path too for the `nccl` feature.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../target/cuda-emulator}"
mkdir -p "$out"
lib="$out/libringflow-cuda-emulator.so"
${CXX:-g++} -std=c++17 -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror \
    -Wno-unused-parameter -Wno-sign-compare -Wno-clobbered -o "$lib.tmp" \
    "$here/driver.cpp" "$here/cublas.cpp" "$here/kernels.cpp" "$here/threads.cpp" \
    "$here/nccl.cpp"
mv "$lib.tmp" "$lib"
for name in libcuda.so libcuda.so.1 libcublas.so libcublas.so.12 libcublas.so.13; do
    ln -sf libringflow-cuda-emulator.so "$out/$name"
done
mkdir -p "$out/nccl"
ln -sf ../libringflow-cuda-emulator.so "$out/nccl/libnccl.so"
echo "$out"
