// The CUDA driver API (libcuda) as ringflow's backend uses it through cudarc, emulated on the
// host: device memory is host memory handed out and checked by this file, and cuLaunchKernel
// runs kernels.cu's host build.
//
// Work is asynchronous as on a GPU, and lazier: kernels, SGEMMs, memsets, device-to-device copies
// and every copy from or to page-locked (registered) host memory are queued and run only when the
// host waits (cuStreamSynchronize, cuEventQuery, destroying a stream, or a copy into pageable
// memory). A host that reads a page-locked buffer before waiting for the copy into it reads stale
// values, and one that rewrites a buffer an upload still reads uploads the new values, so a
// missing synchronization changes results here instead of passing by luck. Copies from pageable
// memory take their data at the call, as the driver stages them.
//
// Only the entry points ringflow reaches through cudarc are here: cudarc panics naming a
// missing one, so a new call shows up at once. What is checked, as the real driver would refuse
// it: calls before cuInit, calls without a current context, copies and memsets outside a live
// allocation (or with a device address on the host side), double frees, launches with impossible
// dimensions, kernels missing from the loaded PTX, and host registrations that overlap or were
// never made. Every refusal is also printed to stderr with the call's name, so a test log says
// what the backend did wrong.
#include <atomic>
#include <cstdio>
#include <deque>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emulator.h"
#include "threads.h"

#define API extern "C" __attribute__((visibility("default")))

// The values of cuda.h's CUresult that this file returns.
enum CUresult : int {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

using CUdevice = int;
using CUdeviceptr = unsigned long long;

// Queued work, and the host memory it will read or write when it runs (none: 0 bytes).
struct Pending {
    emu::Work work;
    uintptr_t host;
    size_t host_bytes;
};

struct Context {
    int device;
    std::mutex lock;
    std::deque<Pending> queue;  // every stream of the context, in call order
    std::string fault;          // the first queued work that failed: sticky, as on a GPU
};
struct Stream {
    Context* context;
};
struct Module {
    std::set<std::string> entries;
};
struct Function {
    const emu::KernelEntry* kernel;
};
struct Event {
    int unused;
};

using CUcontext = Context*;
using CUstream = Stream*;
using CUmodule = Module*;
using CUfunction = Function*;
using CUevent = Event*;

namespace {

std::atomic<bool> initialized{false};
thread_local Context* current = nullptr;

// The emulated GPUs (CUDA_EMULATOR_DEVICES, default 1), of which CUDA_VISIBLE_DEVICES leaves
// visible, as the driver does, the listed ordinals up to the first one that does not exist.
int device_count() {
    const char* n = std::getenv("CUDA_EMULATOR_DEVICES");
    int physical = n ? std::atoi(n) : 1;
    if (physical < 0) physical = 0;
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!visible) return physical;
    int count = 0;
    for (const char* p = visible; *p;) {
        char* end = nullptr;
        long ordinal = std::strtol(p, &end, 10);
        if (end == p || ordinal < 0 || ordinal >= physical) break;
        ++count;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') break;
    }
    return count;
}

// The emulated memory size per device.
size_t memory_bytes() {
    const char* mb = std::getenv("CUDA_EMULATOR_MEMORY_MB");
    return (size_t)(mb ? std::atoll(mb) : 4096) << 20;
}

Context* primary(int device) {
    static std::mutex m;
    static std::map<int, Context*> contexts;
    std::lock_guard<std::mutex> g(m);
    auto& c = contexts[device];
    if (!c) {
        c = new Context;
        c->device = device;
    }
    return c;
}

struct Memory {
    std::mutex m;
    std::map<uintptr_t, size_t> device;  // start -> bytes
    std::map<uintptr_t, size_t> host_registered;
    size_t in_use = 0;
};

Memory& memory() {
    static Memory* m = new Memory;  // never destroyed: frees may come during exit
    return *m;
}

using emu::refuse;

// The common preconditions: cuInit was called, and (for `needs_context`) a context is current.
#define REQUIRE(call, needs_context)                                                      \
    do {                                                                                  \
        if (!initialized) return refuse(call, CUDA_ERROR_NOT_INITIALIZED, "cuInit first"); \
        if ((needs_context) && !current)                                                  \
            return refuse(call, CUDA_ERROR_INVALID_CONTEXT,                               \
                          "no context is current on this thread");                        \
    } while (0)

bool inside(const std::map<uintptr_t, size_t>& blocks, uintptr_t address, size_t bytes) {
    auto it = blocks.upper_bound(address);
    if (it == blocks.begin()) return false;
    --it;
    return address >= it->first && address + bytes <= it->first + it->second &&
           address + bytes >= address;
}

CUresult allocate(const char* call, CUdeviceptr* out, size_t bytes) {
    if (!out || bytes == 0) return refuse(call, CUDA_ERROR_INVALID_VALUE, "zero bytes");
    Memory& mem = memory();
    std::lock_guard<std::mutex> g(mem.m);
    if (mem.in_use + bytes > memory_bytes()) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    // Fresh device memory holds garbage on a GPU; here it holds NaN, so a kernel that reads
    // memory nothing wrote shows up in the results.
    std::memset(p, 0xff, rounded);
    mem.device[(uintptr_t)p] = bytes;
    mem.in_use += bytes;
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult release(const char* call, CUdeviceptr ptr) {
    Memory& mem = memory();
    std::lock_guard<std::mutex> g(mem.m);
    auto it = mem.device.find((uintptr_t)ptr);
    if (it == mem.device.end())
        return refuse(call, CUDA_ERROR_INVALID_VALUE, "not the start of a live allocation");
    mem.in_use -= it->second;
    mem.device.erase(it);
    std::free((void*)(uintptr_t)ptr);
    return CUDA_SUCCESS;
}

CUresult check_stream(const char* call, CUstream s) {
    if (s && s->context != current)
        return refuse(call, CUDA_ERROR_INVALID_HANDLE, "the stream belongs to another context");
    return CUDA_SUCCESS;
}

CUresult check_device(const char* call, CUdeviceptr p, size_t bytes) {
    if (!emu::is_device_range((uintptr_t)p, bytes))
        return refuse(call, CUDA_ERROR_INVALID_VALUE,
                      std::to_string(bytes) + " bytes at " + std::to_string(p) +
                          " are not inside one device allocation");
    return CUDA_SUCCESS;
}

CUresult check_host(const char* call, const void* p) {
    if (emu::is_device_address((uintptr_t)p))
        return refuse(call, CUDA_ERROR_INVALID_VALUE, "the host pointer is device memory");
    return CUDA_SUCCESS;
}

bool registered(uintptr_t address, size_t bytes) {
    Memory& mem = memory();
    std::lock_guard<std::mutex> g(mem.m);
    return inside(mem.host_registered, address, bytes == 0 ? 1 : bytes);
}

void push(Context* ctx, emu::Work work, uintptr_t host = 0, size_t host_bytes = 0) {
    std::lock_guard<std::mutex> g(ctx->lock);
    ctx->queue.push_back({std::move(work), host, host_bytes});
}

// Runs everything queued on the current context; a failure is reported once and then returned
// by every later wait, as a GPU's sticky errors are.
CUresult drain(const char* call) {
    std::lock_guard<std::mutex> g(current->lock);
    while (!current->queue.empty()) {
        Pending p = std::move(current->queue.front());
        current->queue.pop_front();
        std::string error = p.work();
        if (!error.empty() && current->fault.empty()) {
            current->fault = error;
            refuse(call, CUDA_ERROR_LAUNCH_FAILED, "queued work failed: " + error);
        }
    }
    return current->fault.empty() ? CUDA_SUCCESS : CUDA_ERROR_LAUNCH_FAILED;
}

}  // namespace

namespace emu {

bool enqueue(Work work) {
    if (!current) return false;
    push(current, std::move(work));
    return true;
}


bool is_device_address(uintptr_t address) {
    Memory& mem = memory();
    std::lock_guard<std::mutex> g(mem.m);
    return inside(mem.device, address, 1);
}

bool is_device_range(uintptr_t address, size_t bytes) {
    Memory& mem = memory();
    std::lock_guard<std::mutex> g(mem.m);
    return inside(mem.device, address, bytes == 0 ? 1 : bytes);
}

bool has_current_context() { return current != nullptr; }

}  // namespace emu

API CUresult cuInit(unsigned flags) {
    if (flags != 0) return refuse("cuInit", CUDA_ERROR_INVALID_VALUE, "flags must be 0");
    initialized = true;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int* count) {
    REQUIRE("cuDeviceGetCount", false);
    *count = device_count();
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    REQUIRE("cuDeviceGet", false);
    if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    REQUIRE("cuDeviceGetAttribute", false);
    if (device < 0 || device >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    switch (attribute) {
        case 75: *value = 9; break;    // compute capability major: an H100
        case 76: *value = 0; break;    // minor
        case 115: *value = 1; break;   // memory pools supported: cuMemAllocAsync
        default: *value = 0; break;
    }
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
    REQUIRE("cuDeviceGetName", false);
    if (device < 0 || device >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, (size_t)len, "ringflow CUDA emulator (host CPU)");
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
    REQUIRE("cuDevicePrimaryCtxRetain", false);
    if (device < 0 || device >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *ctx = primary(device);
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    REQUIRE("cuDevicePrimaryCtxRelease", false);
    return device >= 0 && device < device_count() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuCtxSetCurrent(CUcontext ctx) {
    REQUIRE("cuCtxSetCurrent", false);
    current = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext* ctx) {
    REQUIRE("cuCtxGetCurrent", false);
    *ctx = current;
    return CUDA_SUCCESS;
}

API CUresult cuStreamCreate(CUstream* stream, unsigned flags) {
    REQUIRE("cuStreamCreate", true);
    (void)flags;
    *stream = new Stream{current};
    return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(CUstream stream) {
    REQUIRE("cuStreamDestroy", true);
    CUresult r = drain("cuStreamDestroy");  // queued work completes, as on a GPU
    delete stream;
    return r;
}

API CUresult cuStreamSynchronize(CUstream stream) {
    REQUIRE("cuStreamSynchronize", true);
    if (CUresult r = check_stream("cuStreamSynchronize", stream)) return r;
    return drain("cuStreamSynchronize");
}

API CUresult cuEventCreate(CUevent* event, unsigned) {
    REQUIRE("cuEventCreate", true);
    *event = new Event{0};
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent, CUstream stream) {
    REQUIRE("cuEventRecord", true);
    return check_stream("cuEventRecord", stream);
}

API CUresult cuEventQuery(CUevent) {
    REQUIRE("cuEventQuery", true);
    return drain("cuEventQuery");
}

API CUresult cuEventDestroy_v2(CUevent event) {
    REQUIRE("cuEventDestroy", true);
    delete event;
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocAsync(CUdeviceptr* ptr, size_t bytes, CUstream stream) {
    REQUIRE("cuMemAllocAsync", true);
    if (CUresult r = check_stream("cuMemAllocAsync", stream)) return r;
    return allocate("cuMemAllocAsync", ptr, bytes);
}

API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
    REQUIRE("cuMemFreeAsync", true);
    if (CUresult r = check_stream("cuMemFreeAsync", stream)) return r;
    if (CUresult r = check_device("cuMemFreeAsync", ptr, 1)) return r;
    push(current, [ptr]() -> std::string {
        return release("cuMemFreeAsync", ptr) ? "a queued free of a dead allocation" : "";
    });
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes,
                                  CUstream stream) {
    REQUIRE("cuMemcpyHtoDAsync", true);
    if (CUresult r = check_stream("cuMemcpyHtoDAsync", stream)) return r;
    if (CUresult r = check_device("cuMemcpyHtoDAsync", dst, bytes)) return r;
    if (CUresult r = check_host("cuMemcpyHtoDAsync", src)) return r;
    void* to = (void*)(uintptr_t)dst;
    if (registered((uintptr_t)src, bytes)) {
        // DMA from page-locked memory: reads the buffer when it runs.
        push(current, [=]() -> std::string {
            std::memcpy(to, src, bytes);
            return "";
        }, (uintptr_t)src, bytes);
    } else {
        // Pageable memory is staged at the call; the caller may reuse it at once.
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + bytes);
        push(current, [=]() -> std::string {
            std::memcpy(to, staged->data(), bytes);
            return "";
        });
    }
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    REQUIRE("cuMemcpyDtoHAsync", true);
    if (CUresult r = check_stream("cuMemcpyDtoHAsync", stream)) return r;
    if (CUresult r = check_device("cuMemcpyDtoHAsync", src, bytes)) return r;
    if (CUresult r = check_host("cuMemcpyDtoHAsync", dst)) return r;
    const void* from = (const void*)(uintptr_t)src;
    if (registered((uintptr_t)dst, bytes)) {
        // DMA into page-locked memory: the values arrive when the host waits.
        push(current, [=]() -> std::string {
            std::memcpy(dst, from, bytes);
            return "";
        }, (uintptr_t)dst, bytes);
        return CUDA_SUCCESS;
    }
    // Into pageable memory the copy completes before the call returns.
    if (CUresult r = drain("cuMemcpyDtoHAsync")) return r;
    std::memcpy(dst, from, bytes);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                  CUstream stream) {
    REQUIRE("cuMemcpyDtoDAsync", true);
    if (CUresult r = check_stream("cuMemcpyDtoDAsync", stream)) return r;
    if (CUresult r = check_device("cuMemcpyDtoDAsync", dst, bytes)) return r;
    if (CUresult r = check_device("cuMemcpyDtoDAsync", src, bytes)) return r;
    push(current, [=]() -> std::string {
        std::memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes);
        return "";
    });
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
    REQUIRE("cuMemsetD8Async", true);
    if (CUresult r = check_stream("cuMemsetD8Async", stream)) return r;
    if (CUresult r = check_device("cuMemsetD8Async", dst, n)) return r;
    push(current, [=]() -> std::string {
        std::memset((void*)(uintptr_t)dst, value, n);
        return "";
    });
    return CUDA_SUCCESS;
}

API CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned flags) {
    REQUIRE("cuMemHostRegister", true);
    if (flags != 0) return refuse("cuMemHostRegister", CUDA_ERROR_NOT_SUPPORTED, "flags");
    if (!p || bytes == 0) return refuse("cuMemHostRegister", CUDA_ERROR_INVALID_VALUE, "empty");
    Memory& mem = memory();
    std::lock_guard<std::mutex> g(mem.m);
    uintptr_t start = (uintptr_t)p;
    for (const auto& [s, n] : mem.host_registered) {
        if (start < s + n && s < start + bytes)
            return refuse("cuMemHostRegister", CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                          "overlaps a registered range");
    }
    mem.host_registered[start] = bytes;
    return CUDA_SUCCESS;
}

API CUresult cuMemHostUnregister(void* p) {
    REQUIRE("cuMemHostUnregister", true);
    uintptr_t start = (uintptr_t)p;
    size_t bytes = 0;
    {
        Memory& mem = memory();
        std::lock_guard<std::mutex> g(mem.m);
        auto it = mem.host_registered.find(start);
        if (it == mem.host_registered.end())
            return refuse("cuMemHostUnregister", CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                          "not the start of a registered range");
        bytes = it->second;
    }
    {
        std::lock_guard<std::mutex> g(current->lock);
        for (const Pending& q : current->queue) {
            if (q.host_bytes > 0 && q.host < start + bytes && start < q.host + q.host_bytes)
                return refuse("cuMemHostUnregister", CUDA_ERROR_INVALID_VALUE,
                              "a queued copy still uses this memory (synchronize first)");
        }
    }
    Memory& mem = memory();
    std::lock_guard<std::mutex> g(mem.m);
    mem.host_registered.erase(start);
    return CUDA_SUCCESS;
}

API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    REQUIRE("cuModuleLoadData", true);
    std::string ptx((const char*)image);
    if (ptx.find(".version") == std::string::npos || ptx.find(".target") == std::string::npos)
        return refuse("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE, "not PTX");
    auto* m = new Module;
    const std::string marker = ".entry ";
    for (size_t at = ptx.find(marker); at != std::string::npos; at = ptx.find(marker, at + 1)) {
        size_t start = at + marker.size();
        size_t end = ptx.find_first_of("( \n", start);
        m->entries.insert(ptx.substr(start, end - start));
    }
    *module = m;
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
    REQUIRE("cuModuleGetFunction", true);
    if (!module->entries.count(name))
        return refuse("cuModuleGetFunction", CUDA_ERROR_NOT_FOUND,
                      std::string(name) + " is not an entry of the loaded PTX");
    const emu::KernelEntry* kernel = emu::find_kernel(name);
    if (!kernel)
        return refuse("cuModuleGetFunction", CUDA_ERROR_NOT_FOUND,
                      std::string(name) + " is in the PTX but not in the emulator's table");
    *function = new Function{kernel};
    return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(CUmodule module) {
    REQUIRE("cuModuleUnload", true);
    delete module;
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared_bytes, CUstream stream,
                            void** params, void** extra) {
    REQUIRE("cuLaunchKernel", true);
    if (CUresult r = check_stream("cuLaunchKernel", stream)) return r;
    if (extra || shared_bytes != 0)
        return refuse("cuLaunchKernel", CUDA_ERROR_NOT_SUPPORTED,
                      "`extra` and dynamic shared memory are not emulated");
    unsigned long long threads = (unsigned long long)bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || threads == 0 || threads > 1024 || bz > 64 ||
        gx > 2147483647u || gy > 65535 || gz > 65535)
        return refuse("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE,
                      std::string(f->kernel->name) + ": impossible launch dimensions");
    std::string error;
    emu::Work work = f->kernel->prepare(params, {gx, gy, gz}, {bx, by, bz}, error);
    if (!error.empty()) return refuse("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE, error);
    push(current, std::move(work));
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorString(CUresult error, const char** text) {
    switch (error) {
        case CUDA_SUCCESS: *text = "no error"; break;
        case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
        case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
        case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
        case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *text = "unspecified launch failure"; break;
        default: *text = "emulated CUDA error"; break;
    }
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult error, const char** text) {
    static thread_local std::string name;
    name = "CUDA_ERROR_" + std::to_string((int)error);
    *text = name.c_str();
    return CUDA_SUCCESS;
}
