// The block scheduler behind threads.h: plain blocks as loops, cooperative blocks as coroutines.
#include "threads.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <vector>

namespace emu {

thread_local Builtins builtins;

namespace {

constexpr size_t STACK_BYTES = 64 * 1024;
constexpr int WARP = 32;

enum class Wait { None, Block, Warp };

struct Fiber {
    ucontext_t context;
    uint3 idx;
    bool done = false;
    Wait wait = Wait::None;
    uint64_t generation = 0;  // of the barrier waited at
};

// One cooperative block in flight on this OS thread.
struct Block {
    const std::function<void()>* body = nullptr;
    ucontext_t scheduler;
    std::vector<Fiber> fibers;
    size_t running = 0;
    uint64_t block_generation = 0;
    std::vector<uint64_t> warp_generation;
    std::vector<uint64_t> slots;  // one shuffle register per thread
    const char* fault = nullptr;
};

thread_local Block* current = nullptr;
thread_local std::vector<char*> stacks;  // reused by every block of this OS thread

char* stack(size_t i) {
    while (stacks.size() <= i) {
        void* p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (p == MAP_FAILED) throw KernelFault{"cannot map a stack for a CUDA thread"};
        stacks.push_back(static_cast<char*>(p));
    }
    return stacks[i];
}

void trampoline() {
    Block* b = current;
    try {
        (*b->body)();
    } catch (const KernelFault& f) {
        if (!b->fault) b->fault = f.what;
    }
    b->fibers[b->running].done = true;
    // Returning resumes the scheduler through uc_link.
}

Block& cooperative_block(const char* primitive) {
    if (!current) {
        throw KernelFault{primitive};
    }
    return *current;
}

// Parks the running CUDA thread at a barrier until the scheduler releases it.
void wait_at(Block& b, Wait kind) {
    Fiber& f = b.fibers[b.running];
    f.wait = kind;
    f.generation = kind == Wait::Block ? b.block_generation
                                       : b.warp_generation[b.running / WARP];
    swapcontext(&f.context, &b.scheduler);
    if (b.fault) throw KernelFault{b.fault};
}

bool released(const Block& b, size_t i) {
    const Fiber& f = b.fibers[i];
    switch (f.wait) {
        case Wait::Block: return f.generation < b.block_generation;
        case Wait::Warp: return f.generation < b.warp_generation[i / WARP];
        default: return true;
    }
}

// Opens every barrier that all live threads of its scope have reached. Returns whether one
// opened, or sets a fault for a shuffle whose warp lost lanes.
bool open_barriers(Block& b) {
    bool opened = false;
    size_t live = 0, at_block = 0;
    for (size_t i = 0; i < b.fibers.size(); ++i) {
        const Fiber& f = b.fibers[i];
        if (f.done) continue;
        ++live;
        if (f.wait == Wait::Block && f.generation == b.block_generation) ++at_block;
    }
    if (live > 0 && at_block == live) {
        ++b.block_generation;
        opened = true;
    }
    for (size_t w = 0; w * WARP < b.fibers.size(); ++w) {
        size_t warp_live = 0, waiting = 0, exited = 0;
        for (size_t i = w * WARP; i < b.fibers.size() && i < (w + 1) * WARP; ++i) {
            const Fiber& f = b.fibers[i];
            if (f.done) {
                ++exited;
                continue;
            }
            ++warp_live;
            if (f.wait == Wait::Warp && f.generation == b.warp_generation[w]) ++waiting;
        }
        if (warp_live > 0 && waiting == warp_live) {
            if (exited > 0) {
                b.fault = "a full-warp shuffle ran after lanes of its warp had exited";
                return false;
            }
            ++b.warp_generation[w];
            opened = true;
        }
    }
    return opened;
}

const char* run_cooperative_block(const std::function<void()>& body, uint3 block) {
    Block b;
    b.body = &body;
    size_t threads = (size_t)block.x * block.y * block.z;
    b.fibers.resize(threads);
    b.warp_generation.assign((threads + WARP - 1) / WARP, 0);
    b.slots.assign(threads, 0);
    for (size_t i = 0; i < threads; ++i) {
        Fiber& f = b.fibers[i];
        f.idx = {(unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                 (unsigned)(i / ((size_t)block.x * block.y))};
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = stack(i);
        f.context.uc_stack.ss_size = STACK_BYTES;
        f.context.uc_link = &b.scheduler;
        makecontext(&f.context, trampoline, 0);
    }
    Block* outer = current;
    current = &b;
    size_t done = 0;
    while (done < threads && !b.fault) {
        bool ran = false;
        for (size_t i = 0; i < threads && !b.fault; ++i) {
            Fiber& f = b.fibers[i];
            if (f.done || !released(b, i)) continue;
            f.wait = Wait::None;
            b.running = i;
            builtins.thread_idx = f.idx;
            swapcontext(&b.scheduler, &f.context);
            ran = true;
            if (f.done) ++done;
        }
        if (b.fault || done == threads) break;
        if (!open_barriers(b) && !ran && !b.fault) {
            b.fault = "the block deadlocked: its threads wait at barriers that cannot all be reached";
        }
    }
    current = outer;
    return b.fault;
}

}  // namespace

void sync_threads() {
    Block& b = cooperative_block("__syncthreads in a kernel the emulator runs as plain");
    wait_at(b, Wait::Block);
}

int lane() {
    Block& b = cooperative_block("a warp shuffle in a kernel the emulator runs as plain");
    return (int)(b.running % WARP);
}

uint64_t shuffle(uint64_t bits, int src) {
    Block& b = cooperative_block("a warp shuffle in a kernel the emulator runs as plain");
    size_t me = b.running;
    size_t base = me / WARP * WARP;
    b.slots[me] = bits;
    wait_at(b, Wait::Warp);
    uint64_t out = bits;
    if (src >= 0 && src < WARP) {
        size_t from = base + (size_t)src;
        if (from >= b.fibers.size() || b.fibers[from].done) {
            throw KernelFault{"a shuffle read a lane that does not exist or has exited"};
        }
        out = b.slots[from];
    }
    // Nobody overwrites a register before the whole warp has read.
    wait_at(b, Wait::Warp);
    return out;
}

const char* run_grid(bool cooperative, uint3 grid, uint3 block, const std::function<void()>& body) {
    builtins.grid_dim = grid;
    builtins.block_dim = block;
    try {
        for (unsigned z = 0; z < grid.z; ++z)
            for (unsigned y = 0; y < grid.y; ++y)
                for (unsigned x = 0; x < grid.x; ++x) {
                    builtins.block_idx = {x, y, z};
                    if (cooperative) {
                        if (const char* fault = run_cooperative_block(body, block)) return fault;
                        continue;
                    }
                    for (unsigned tz = 0; tz < block.z; ++tz)
                        for (unsigned ty = 0; ty < block.y; ++ty)
                            for (unsigned tx = 0; tx < block.x; ++tx) {
                                builtins.thread_idx = {tx, ty, tz};
                                body();
                            }
                }
    } catch (const KernelFault& f) {
        return f.what;
    }
    return nullptr;
}

}  // namespace emu
