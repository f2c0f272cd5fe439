// ringflow's kernels.cu, image_kernels.cu and recurrent_kernels.cu compiled for the host, and the
// table cuModuleGetFunction looks them up in. The source is included unchanged: what runs here is
// the CUDA C that NVRTC compiles.
#include "emulator.h"
#include "threads.h"

#include "../../ml/src/backend/cuda/kernels.cu"
#include "../../ml/src/backend/cuda/image_kernels.cu"
#include "../../ml/src/backend/cuda/recurrent_kernels.cu"

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace emu {
namespace {

// A launch's argument of type T, read from cuLaunchKernel's `kernelParams[i]` and, for a pointer,
// checked to point into memory the emulated driver allocated.
template <typename T>
T argument(const char* kernel, void** params, size_t i, std::string& error) {
    T value;
    std::memcpy(&value, params[i], sizeof(T));
    if constexpr (std::is_pointer_v<T>) {
        if (error.empty() && !is_device_address(reinterpret_cast<uintptr_t>(value))) {
            error = std::string(kernel) + ": argument " + std::to_string(i) +
                    " is not an address of device memory";
        }
    }
    return value;
}

template <typename... A, size_t... I>
Work prepare(const char* name, bool cooperative, void (*kernel)(A...), void** params,
             uint3 grid, uint3 block, std::string& error, std::index_sequence<I...>) {
    std::tuple<A...> args{argument<A>(name, params, I, error)...};
    return [=]() -> std::string {
        const char* fault =
            run_grid(cooperative, grid, block, [&] { std::apply(kernel, args); });
        return fault ? std::string(name) + ": " + fault : std::string();
    };
}

#define KERNEL(name, cooperative)                                                            \
    {#name, [](void** params, uint3 grid, uint3 block, std::string& error) {                 \
         return prepare(#name, cooperative, &::name, params, grid, block, error,             \
                        std::make_index_sequence<std::tuple_size_v<                          \
                            decltype(arguments_of(&::name))>>{});                            \
     }}

template <typename... A>
std::tuple<A...> arguments_of(void (*)(A...));

// Kernels with barriers or shuffles are cooperative; the rest run as loops (and fail loudly if
// they ever synchronize).
const KernelEntry TABLE[] = {
    KERNEL(unary_fwd, false),
    KERNEL(unary_bwd, false),
    KERNEL(binary_same, false),
    KERNEL(binary_row, false),
    KERNEL(binary_bcast, false),
    KERNEL(strided_copy, false),
    KERNEL(affine, false),
    KERNEL(add_assign, false),
    KERNEL(fill, false),
    KERNEL(scale, false),
    KERNEL(sum_rows, false),
    KERNEL(sum_to_shape, false),
    KERNEL(sum_axis, false),
    KERNEL(sum_lanes, true),
    KERNEL(sum_squares, true),
    KERNEL(softmax_fwd, true),
    KERNEL(softmax_bwd, true),
    KERNEL(cross_entropy_fwd, true),
    KERNEL(cross_entropy_bwd, false),
    KERNEL(bce_terms, false),
    KERNEL(bce_bwd, false),
    KERNEL(index_select, false),
    KERNEL(index_add, false),
    KERNEL(dropout_mask, false),
    KERNEL(sgd_plain, false),
    KERNEL(sgd_momentum, false),
    KERNEL(adagrad, false),
    KERNEL(adam, false),
    KERNEL(im2col, false),
    KERNEL(col2im, false),
    KERNEL(conv_direct_fwd, false),
    KERNEL(conv_direct_bwd_input, false),
    KERNEL(conv_direct_bwd_weight, true),
    KERNEL(max_pool_fwd, false),
    KERNEL(max_pool_bwd, false),
    KERNEL(avg_pool_fwd, false),
    KERNEL(avg_pool_bwd, false),
    KERNEL(channel_sum, true),
    KERNEL(channel_bias_add, false),
    KERNEL(bn_stats, true),
    KERNEL(bn_forward, false),
    KERNEL(bn_backward_sums, true),
    KERNEL(bn_backward_dx, false),
    KERNEL(lstm_cell_fwd, false),
    KERNEL(lstm_cell_bwd, false),
    KERNEL(gru_cell_fwd, false),
    KERNEL(gru_cell_bwd, false),
};

}  // namespace

const KernelEntry* find_kernel(const char* name) {
    for (const KernelEntry& k : TABLE) {
        if (std::strcmp(k.name, name) == 0) return &k;
    }
    return nullptr;
}

}  // namespace emu
