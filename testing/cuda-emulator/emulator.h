// What the parts of the emulator share: device memory bookkeeping and the kernel table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace emu {

struct uint3;

// Whether `address` lies inside a live allocation of the emulated device memory.
bool is_device_address(uintptr_t address);
// Whether [address, address + bytes) lies inside one live allocation.
bool is_device_range(uintptr_t address, size_t bytes);
// Whether the calling OS thread has a current context (CUDA calls need one).
bool has_current_context();

// Runs a kernel over a grid with cuLaunchKernel's parameter array; returns nullptr or the fault.
using Launcher = const char* (*)(void** params, uint3 grid, uint3 block);

struct KernelEntry {
    const char* name;
    Launcher launch;
};

const KernelEntry* find_kernel(const char* name);

}  // namespace emu
