// The CUDA execution model on the host, enough to run ringflow's kernels.cu unchanged.
//
// A launch runs, when the host waits for it (driver.cpp), its blocks one after another on the
// waiting OS thread. Inside a block:
// - a *plain* kernel (no barrier, no shuffle) runs its threads one after another;
// - a *cooperative* kernel runs each CUDA thread as a coroutine (ucontext) with its own stack,
//   switched at __syncthreads() and at warp shuffles, so the block's barriers and the warp's
//   register exchanges happen exactly as the programming guide defines them.
// A plain kernel that reaches a barrier or shuffle, a shuffle that reads an exited lane, and a
// barrier that can never complete all abort the launch with a message naming the kernel: the
// emulator checks the kernels' synchronization instead of silently serializing it.
#pragma once

#include <math.h>
#include <cstdint>
#include <cstring>
#include <functional>

namespace emu {

struct uint3 {
    unsigned int x, y, z;
};

// The built-in variables of the CUDA thread running now.
struct Builtins {
    uint3 thread_idx, block_idx, block_dim, grid_dim;
};
extern thread_local Builtins builtins;

// A failure inside a kernel: the launch stops and reports `what`.
struct KernelFault {
    const char* what;
};

void sync_threads();
// Exchanges 8 bytes with lane `src` of the warp (src outside 0..31 reads the caller's own).
uint64_t shuffle(uint64_t bits, int src);
int lane();

template <typename T>
T shfl_from(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = shuffle(bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

// Runs `body` over a grid; `cooperative` kernels get coroutines (see above). Returns nullptr,
// or the fault that stopped the launch.
const char* run_grid(bool cooperative, uint3 grid, uint3 block, const std::function<void()>& body);

}  // namespace emu

// The CUDA C vocabulary kernels.cu uses, on the host.
#define __global__
#define __device__
#define __forceinline__ inline
// Blocks of one launch run one at a time on one OS thread, and launches on different OS threads
// are independent: a thread-local static is exactly a block's shared memory.
#define __shared__ static thread_local
#define threadIdx (::emu::builtins.thread_idx)
#define blockIdx (::emu::builtins.block_idx)
#define blockDim (::emu::builtins.block_dim)
#define gridDim (::emu::builtins.grid_dim)

inline void __syncthreads() { ::emu::sync_threads(); }

template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
    if (mask != 0xffffffffu) throw ::emu::KernelFault{"partial-warp shuffles are not emulated"};
    return ::emu::shfl_from(v, ::emu::lane() + (int)delta);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    if (mask != 0xffffffffu) throw ::emu::KernelFault{"partial-warp shuffles are not emulated"};
    return ::emu::shfl_from(v, ::emu::lane() ^ lane_mask);
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}

// One OS thread runs a launch, so an atomic add is a plain read-modify-write.
inline float atomicAdd(float* address, float v) {
    float old = *address;
    *address = old + v;
    return old;
}

