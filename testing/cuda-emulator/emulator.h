// What the parts of the emulator share: device memory bookkeeping and the kernel table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace emu {

struct uint3;

// Whether `address` lies inside a live allocation of the emulated device memory.
bool is_device_address(uintptr_t address);
// Whether [address, address + bytes) lies inside one live allocation.
bool is_device_range(uintptr_t address, size_t bytes);
// Whether the calling OS thread has a current context (CUDA calls need one).
bool has_current_context();

// Queued device work: runs later, in stream order, and returns "" or what went wrong.
using Work = std::function<std::string()>;

// Reads a kernel's arguments from cuLaunchKernel's parameter array now (as the driver does) and
// returns the launch as work; sets `error` instead for an argument that cannot be right.
using Launcher = Work (*)(void** params, uint3 grid, uint3 block, std::string& error);

struct KernelEntry {
    const char* name;
    Launcher prepare;
};

// Queues `work` behind everything already queued on the current context (cuBLAS's calls go
// through this). Returns false when no context is current.
bool enqueue(Work work);

const KernelEntry* find_kernel(const char* name);

// Says on stderr why `call` is refused and returns `code`, the error the caller gets: every
// refusal shows in the test's log.
template <typename Code>
Code refuse(const char* call, Code code, const std::string& why) {
    std::fprintf(stderr, "cuda-emulator: %s refused (%d): %s\n", call, (int)code, why.c_str());
    return code;
}

}  // namespace emu
