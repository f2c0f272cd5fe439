// ringflow's CUDA kernels, compiled at run time with NVRTC (once per device, see kernels.rs).
//
// Conventions: every tensor is dense, row-major float32; `n` is an element count; kernels use
// grid-stride loops so any grid size is correct. The arithmetic mirrors the CPU backend
// (backend/cpu/*.rs) operation for operation, so the two agree to float32 rounding.

#define MAX_DIMS 8

// A shape and two sets of element strides (for two inputs, or an input and an output).
struct Strided {
    int ndim;
    int dims[MAX_DIMS];
    long long sa[MAX_DIMS];
    long long sb[MAX_DIMS];
};

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

__device__ __forceinline__ float sigmoid_f(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    float e = expf(x);
    return e / (1.0f + e);
}

#define SQRT_2_OVER_PI 0.7978846f
#define GELU_CUBIC 0.044715f

// Operation codes: the order of UnaryOp in backend/mod.rs.
__device__ __forceinline__ float unary_f(int op, float x) {
    switch (op) {
        case 0: return -x;
        case 1: return expf(x);
        case 2: return logf(x);
        case 3: return fmaxf(x, 0.0f);
        case 4: return tanhf(x);
        case 5: return sigmoid_f(x);
        case 6: {
            float u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
            return 0.5f * x * (1.0f + tanhf(u));
        }
        case 7: return sqrtf(x);
        default: return x * x;
    }
}

__device__ __forceinline__ float derivative_f(int op, float x, float y) {
    switch (op) {
        case 0: return -1.0f;
        case 1: return y;
        case 2: return 1.0f / x;
        case 3: return x > 0.0f ? 1.0f : 0.0f;
        case 4: return 1.0f - y * y;
        case 5: return y * (1.0f - y);
        case 6: {
            float u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
            float t = tanhf(u);
            return 0.5f * (1.0f + t) +
                   0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x * x);
        }
        case 7: return 0.5f / y;
        default: return 2.0f * x;
    }
}

// Operation codes: the order of BinaryOp in backend/mod.rs.
__device__ __forceinline__ float binary_f(int op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        default: return a / b;
    }
}

extern "C" __global__ void unary_fwd(int op, long long n, const float* x, float* y) {
    GRID_STRIDE(i, n) { y[i] = unary_f(op, x[i]); }
}

extern "C" __global__ void unary_bwd(int op, long long n, const float* x, const float* y,
                                     const float* g, float* out) {
    GRID_STRIDE(i, n) {
        if (op == 3) {
            out[i] = x[i] > 0.0f ? g[i] : 0.0f;
        } else {
            out[i] = g[i] * derivative_f(op, x[i], y[i]);
        }
    }
}

extern "C" __global__ void binary_same(int op, long long n, const float* a, const float* b,
                                       float* out) {
    GRID_STRIDE(i, n) { out[i] = binary_f(op, a[i], b[i]); }
}

// `a` has the output's shape; `row` (length `cols`) repeats down the rows: a bias.
extern "C" __global__ void binary_row(int op, long long n, long long cols, const float* a,
                                      const float* row, float* out) {
    GRID_STRIDE(i, n) { out[i] = binary_f(op, a[i], row[i % cols]); }
}

// The offsets through strides `s.sa` and `s.sb` of element `i` of the index space `s.dims`
// (row-major).
__device__ __forceinline__ void strided_offsets(long long i, const Strided& s, long long* oa,
                                                long long* ob) {
    long long rest = i, a = 0, b = 0;
    for (int d = s.ndim - 1; d >= 0; --d) {
        long long c = rest % s.dims[d];
        rest /= s.dims[d];
        a += c * s.sa[d];
        b += c * s.sb[d];
    }
    *oa = a;
    *ob = b;
}

// General broadcasting: `s.dims` is the output shape, `s.sa`/`s.sb` the strides of `a`/`b`
// in it (0 along broadcast dimensions).
extern "C" __global__ void binary_bcast(int op, long long n, Strided s, const float* a,
                                        const float* b, float* out) {
    GRID_STRIDE(i, n) {
        long long oa, ob;
        strided_offsets(i, s, &oa, &ob);
        out[i] = binary_f(op, a[oa], b[ob]);
    }
}

// out[offset(sb)] = x[offset(sa)] over the index space `s.dims`: broadcast_to, permute,
// narrow, concat and expand_axis are all this copy with different strides.
extern "C" __global__ void strided_copy(long long n, Strided s, const float* x, float* out) {
    GRID_STRIDE(i, n) {
        long long ox, oo;
        strided_offsets(i, s, &ox, &oo);
        out[oo] = x[ox];
    }
}

extern "C" __global__ void affine(long long n, float mul, float add, const float* x, float* y) {
    GRID_STRIDE(i, n) { y[i] = x[i] * mul + add; }
}

extern "C" __global__ void add_assign(long long n, float* d, const float* s) {
    GRID_STRIDE(i, n) { d[i] += s[i]; }
}

extern "C" __global__ void fill(long long n, float v, float* d) {
    GRID_STRIDE(i, n) { d[i] = v; }
}

extern "C" __global__ void scale(long long n, float f, float* d) {
    GRID_STRIDE(i, n) { d[i] *= f; }
}

// Sums of [rows, cols] down the rows into [cols] (a bias gradient), one thread per column.
extern "C" __global__ void sum_rows(long long rows, long long cols, const float* x, float* out,
                                    int accumulate) {
    GRID_STRIDE(c, cols) {
        float acc = 0.0f;
        for (long long r = 0; r < rows; ++r) {
            acc += x[r * cols + c];
        }
        out[c] = accumulate ? out[c] + acc : acc;
    }
}

// The general reduction to a broadcast shape: `s.dims` is the input shape, `s.sa` its
// contiguous strides, and `s.sb[d]` is 1 where dimension `d` is summed away. One thread per
// output element walks the `reduced` input elements that map to it.
extern "C" __global__ void sum_to_shape(long long n_out, long long reduced, Strided s,
                                        const float* x, float* out, int accumulate) {
    GRID_STRIDE(o, n_out) {
        // The kept coordinates of this output element.
        long long base = 0, rest = o;
        for (int d = s.ndim - 1; d >= 0; --d) {
            if (s.sb[d] == 0) {
                long long c = rest % s.dims[d];
                rest /= s.dims[d];
                base += c * s.sa[d];
            }
        }
        float acc = 0.0f;
        for (long long r = 0; r < reduced; ++r) {
            long long off = base, rr = r;
            for (int d = s.ndim - 1; d >= 0; --d) {
                if (s.sb[d] != 0) {
                    long long c = rr % s.dims[d];
                    rr /= s.dims[d];
                    off += c * s.sa[d];
                }
            }
            acc += x[off];
        }
        out[o] = accumulate ? out[o] + acc : acc;
    }
}

// Sums along the middle axis of [outer, len, inner], one thread per (outer, inner) pair,
// consecutive threads reading consecutive addresses.
extern "C" __global__ void sum_axis(long long outer, long long len, long long inner,
                                    const float* x, float* out) {
    GRID_STRIDE(t, outer * inner) {
        long long o = t / inner, i = t % inner;
        const float* p = x + o * len * inner + i;
        float acc = 0.0f;
        for (long long l = 0; l < len; ++l) {
            acc += p[l * inner];
        }
        out[t] = acc;
    }
}

// Block-wide sum of one double per thread; every thread gets the total. blockDim.x must be a
// multiple of 32 and at most 1024.
__device__ double block_sum(double v) {
    __shared__ double partial[32];
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, off);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    v = threadIdx.x < warps ? partial[threadIdx.x] : 0.0;
    if (warp == 0) {
        for (int off = 16; off > 0; off >>= 1) {
            v += __shfl_down_sync(0xffffffffu, v, off);
        }
        if (lane == 0) partial[0] = v;
    }
    __syncthreads();
    return partial[0];
}

// out[r] = scale * sum(x[r, :]) for each of `rows` contiguous rows of `len`, one block per row,
// accumulated in double (the CPU's full sum is f64 too).
extern "C" __global__ void sum_lanes(long long rows, long long len, float scale, const float* x,
                                     float* out) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* p = x + r * len;
        double acc = 0.0;
        for (long long j = threadIdx.x; j < len; j += blockDim.x) {
            acc += (double)p[j];
        }
        acc = block_sum(acc);
        if (threadIdx.x == 0) out[r] = (float)(acc * (double)scale);
    }
}

// The sum of squares in double, into out[0] (one block).
extern "C" __global__ void sum_squares(long long n, const float* x, double* out) {
    double acc = 0.0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        double v = (double)x[j];
        acc += v * v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[0] = acc;
}

// Softmax (or log-softmax) along the middle axis of [outer, len, inner]: one warp per lane.
extern "C" __global__ void softmax_fwd(long long outer, long long len, long long inner, int log_,
                                       const float* x, float* y) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= outer * inner) return;
    long long o = warp / inner, i = warp % inner;
    const float* px = x + o * len * inner + i;
    float* py = y + o * len * inner + i;
    float mx = -__int_as_float(0x7f800000);
    for (long long j = lane; j < len; j += 32) mx = fmaxf(mx, px[j * inner]);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (long long j = lane; j < len; j += 32) {
        float e = expf(px[j * inner] - mx);
        if (!log_) py[j * inner] = e;
        sum += e;
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (log_) {
        float log_sum = logf(sum) + mx;
        for (long long j = lane; j < len; j += 32) py[j * inner] = px[j * inner] - log_sum;
    } else {
        float inv = 1.0f / sum;
        for (long long j = lane; j < len; j += 32) py[j * inner] *= inv;
    }
}

extern "C" __global__ void softmax_bwd(long long outer, long long len, long long inner, int log_,
                                       const float* y, const float* g, float* out) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= outer * inner) return;
    long long o = warp / inner, i = warp % inner;
    long long base = o * len * inner + i;
    float acc = 0.0f;
    for (long long j = lane; j < len; j += 32) {
        long long k = base + j * inner;
        acc += log_ ? g[k] : g[k] * y[k];
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    for (long long j = lane; j < len; j += 32) {
        long long k = base + j * inner;
        out[k] = log_ ? g[k] - expf(y[k]) * acc : y[k] * (g[k] - acc);
    }
}

// Fused softmax cross-entropy, one warp per row of [n, c]: the probabilities and each row's
// loss log(sum e^x) - x[target] (the mean is taken by sum_lanes).
extern "C" __global__ void cross_entropy_fwd(long long n, long long c, const float* x,
                                             const float* targets, float* probs,
                                             float* row_loss) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* px = x + row * c;
    float* pp = probs + row * c;
    float mx = -__int_as_float(0x7f800000);
    for (long long j = lane; j < c; j += 32) mx = fmaxf(mx, px[j]);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (long long j = lane; j < c; j += 32) {
        float e = expf(px[j] - mx);
        pp[j] = e;
        sum += e;
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    float inv = 1.0f / sum;
    for (long long j = lane; j < c; j += 32) pp[j] *= inv;
    if (lane == 0) {
        long long t = (long long)targets[row];
        row_loss[row] = logf(sum) + mx - px[t];
    }
}

// d(mean cross-entropy)/d(logits) · g[0]: (probs - onehot(target)) · g[0] / n.
extern "C" __global__ void cross_entropy_bwd(long long n, long long c, const float* probs,
                                             const float* targets, const float* g, float* out) {
    float s = n == 0 ? 0.0f : g[0] / (float)n;
    GRID_STRIDE(k, n * c) {
        long long row = k / c, j = k % c;
        float v = probs[k];
        if ((long long)targets[row] == j) v -= 1.0f;
        out[k] = v * s;
    }
}

// Per-element binary cross-entropy with logits, max(x, 0) - x·z + log(1 + e^-|x|).
extern "C" __global__ void bce_terms(long long n, const float* x, const float* z, float* out) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        out[i] = fmaxf(v, 0.0f) - v * z[i] + log1pf(expf(-fabsf(v)));
    }
}

extern "C" __global__ void bce_bwd(long long n, const float* x, const float* z, const float* g,
                                   float* out) {
    float s = g[0] / (float)(n > 0 ? n : 1);
    GRID_STRIDE(i, n) { out[i] = (sigmoid_f(x[i]) - z[i]) * s; }
}

// out[r, :] = table[idx[r], :].
extern "C" __global__ void index_select(long long rows, long long row_len, const float* table,
                                        const float* idx, float* out) {
    GRID_STRIDE(k, rows * row_len) {
        long long r = k / row_len, j = k % row_len;
        out[k] = table[(long long)idx[r] * row_len + j];
    }
}

// dst[idx[r], :] += src[r, :] (rows may repeat: atomic adds).
extern "C" __global__ void index_add(long long rows, long long row_len, float* dst,
                                     const float* idx, const float* src) {
    GRID_STRIDE(k, rows * row_len) {
        long long r = k / row_len, j = k % row_len;
        atomicAdd(&dst[(long long)idx[r] * row_len + j], src[k]);
    }
}

// The counter-based generator of backend/cpu/random.rs, bit for bit.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void dropout_mask(long long n, float p, float keep, unsigned long long seed,
                                        float* out) {
    GRID_STRIDE(i, n) {
        unsigned long long z = mix64(seed + (unsigned long long)i * 0x9E3779B97F4A7C15ull);
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        out[i] = u < p ? 0.0f : keep;
    }
}

// Optimizer updates: the formulas of backend/cpu/optim.rs (PyTorch's).
extern "C" __global__ void sgd_plain(long long n, float* p, const float* g, float lr, float wd) {
    GRID_STRIDE(i, n) {
        float d = g[i] + wd * p[i];
        p[i] -= lr * d;
    }
}

extern "C" __global__ void sgd_momentum(long long n, float* p, const float* g, float* buf,
                                        float lr, float momentum, float dampening, float wd,
                                        int nesterov, int first) {
    GRID_STRIDE(i, n) {
        float d = g[i] + wd * p[i];
        float b = first ? d : momentum * buf[i] + (1.0f - dampening) * d;
        buf[i] = b;
        float step = nesterov ? d + momentum * b : b;
        p[i] -= lr * step;
    }
}

extern "C" __global__ void adagrad(long long n, float* p, const float* g, float* acc, float lr,
                                   float eps, float wd) {
    GRID_STRIDE(i, n) {
        float d = g[i] + wd * p[i];
        float a = acc[i] + d * d;
        acc[i] = a;
        p[i] -= lr * d / (sqrtf(a) + eps);
    }
}

extern "C" __global__ void adam(long long n, float* p, const float* g, float* m, float* v,
                                float lr, float beta1, float beta2, float eps, float wd,
                                int decoupled, float step_size, float bc2_sqrt) {
    GRID_STRIDE(i, n) {
        float d = g[i];
        float pv = p[i];
        if (decoupled) {
            pv *= 1.0f - lr * wd;
        } else {
            d += wd * pv;
        }
        float mi = beta1 * m[i] + (1.0f - beta1) * d;
        float vi = beta2 * v[i] + (1.0f - beta2) * d * d;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pv - step_size * mi / denom;
    }
}

// ----- convolution and pooling (backend/cuda/conv.rs, pool.rs) ------------------------------

// A sliding window over planes of in_h × in_w: a convolution's (over `channels` input channels)
// or a pooling's (dilation 1). Padding is zero padding for a convolution; for pooling, padded
// cells are skipped (they never win a max and are not counted in an average).
struct Window {
    int channels;
    int in_h, in_w;
    int out_h, out_w;
    int kernel_h, kernel_w;
    int stride_h, stride_w;
    int pad_h, pad_w;
    int dil_h, dil_w;
};

// The column matrix of `imgs` images of x ([imgs, channels, in_h, in_w]): row
// (c·kernel_h + ki)·kernel_w + kj, column img·out_h·out_w + oy·out_w + ox holds the input cell
// that kernel tap (ki, kj) of channel c meets at output (oy, ox) of image img, 0 in the padding.
// The images lie side by side, so one image's block is a submatrix with leading dimension
// imgs·out_h·out_w.
extern "C" __global__ void im2col(long long imgs, Window g, const float* x, float* col) {
    long long plane = (long long)g.out_h * g.out_w;
    long long cols = imgs * plane;
    long long n = (long long)g.channels * g.kernel_h * g.kernel_w * cols;
    GRID_STRIDE(i, n) {
        long long j = i % cols, row = i / cols;
        int kj = (int)(row % g.kernel_w);
        int ki = (int)(row / g.kernel_w % g.kernel_h);
        long long c = row / ((long long)g.kernel_w * g.kernel_h);
        long long img = j / plane, p = j % plane;
        int oy = (int)(p / g.out_w), ox = (int)(p % g.out_w);
        int iy = oy * g.stride_h - g.pad_h + ki * g.dil_h;
        int ix = ox * g.stride_w - g.pad_w + kj * g.dil_w;
        bool inside = iy >= 0 && iy < g.in_h && ix >= 0 && ix < g.in_w;
        col[i] = inside ? x[((img * g.channels + c) * g.in_h + iy) * g.in_w + ix] : 0.0f;
    }
}

// The inverse of im2col's gather: each input cell of dx ([imgs, channels, in_h, in_w]) is the sum
// of the column entries that im2col copied from it, one thread per cell (no atomics: the sum's
// order is fixed, kernel taps in row-major order, as the CPU's col2im adds them).
extern "C" __global__ void col2im(long long imgs, Window g, const float* col, float* dx) {
    long long plane = (long long)g.out_h * g.out_w;
    long long cols = imgs * plane;
    long long n = imgs * g.channels * g.in_h * g.in_w;
    GRID_STRIDE(i, n) {
        int ix = (int)(i % g.in_w);
        int iy = (int)(i / g.in_w % g.in_h);
        long long c = i / ((long long)g.in_w * g.in_h) % g.channels;
        long long img = i / ((long long)g.in_w * g.in_h * g.channels);
        float acc = 0.0f;
        for (int ki = 0; ki < g.kernel_h; ++ki) {
            int ty = iy + g.pad_h - ki * g.dil_h;
            if (ty < 0 || ty % g.stride_h != 0 || ty / g.stride_h >= g.out_h) continue;
            int oy = ty / g.stride_h;
            for (int kj = 0; kj < g.kernel_w; ++kj) {
                int tx = ix + g.pad_w - kj * g.dil_w;
                if (tx < 0 || tx % g.stride_w != 0 || tx / g.stride_w >= g.out_w) continue;
                int ox = tx / g.stride_w;
                long long row = (c * g.kernel_h + ki) * g.kernel_w + kj;
                acc += col[row * cols + img * plane + (long long)oy * g.out_w + ox];
            }
        }
        dx[i] = acc;
    }
}

// Direct convolution for one input channel per group (depthwise, `mult` outputs per input
// channel, and any convolution of a single input channel), where an unrolled input would be
// `kernel_h · kernel_w` times the input for products too thin to pay. Weights are
// [channels · mult, 1, kernel_h, kernel_w]; output channel o reads input channel o / mult.

// One thread per output cell: the taps in row-major order.
extern "C" __global__ void conv_direct_fwd(long long batch, Window g, int mult, const float* x,
                                           const float* w, float* y) {
    long long plane = (long long)g.out_h * g.out_w;
    long long outs = (long long)g.channels * mult;
    long long n = batch * outs * plane;
    GRID_STRIDE(i, n) {
        int ox = (int)(i % g.out_w);
        int oy = (int)(i / g.out_w % g.out_h);
        long long o = i / plane % outs, img = i / (plane * outs);
        const float* xp = x + (img * g.channels + o / mult) * g.in_h * g.in_w;
        const float* wp = w + o * g.kernel_h * g.kernel_w;
        float acc = 0.0f;
        for (int ki = 0; ki < g.kernel_h; ++ki) {
            int iy = oy * g.stride_h - g.pad_h + ki * g.dil_h;
            if (iy < 0 || iy >= g.in_h) continue;
            for (int kj = 0; kj < g.kernel_w; ++kj) {
                int ix = ox * g.stride_w - g.pad_w + kj * g.dil_w;
                if (ix < 0 || ix >= g.in_w) continue;
                acc += xp[(long long)iy * g.in_w + ix] * wp[ki * g.kernel_w + kj];
            }
        }
        y[i] = acc;
    }
}

// The input's gradient, one thread per input cell gathering over its channel's outputs and the
// taps that reached it (no atomics).
extern "C" __global__ void conv_direct_bwd_input(long long batch, Window g, int mult,
                                                 const float* grad, const float* w, float* dx) {
    long long plane = (long long)g.out_h * g.out_w;
    long long outs = (long long)g.channels * mult;
    long long n = batch * g.channels * g.in_h * g.in_w;
    GRID_STRIDE(i, n) {
        int ix = (int)(i % g.in_w);
        int iy = (int)(i / g.in_w % g.in_h);
        long long c = i / ((long long)g.in_w * g.in_h) % g.channels;
        long long img = i / ((long long)g.in_w * g.in_h * g.channels);
        float acc = 0.0f;
        for (int m = 0; m < mult; ++m) {
            long long o = c * mult + m;
            const float* gp = grad + (img * outs + o) * plane;
            const float* wp = w + o * g.kernel_h * g.kernel_w;
            for (int ki = 0; ki < g.kernel_h; ++ki) {
                int ty = iy + g.pad_h - ki * g.dil_h;
                if (ty < 0 || ty % g.stride_h != 0 || ty / g.stride_h >= g.out_h) continue;
                int oy = ty / g.stride_h;
                for (int kj = 0; kj < g.kernel_w; ++kj) {
                    int tx = ix + g.pad_w - kj * g.dil_w;
                    if (tx < 0 || tx % g.stride_w != 0 || tx / g.stride_w >= g.out_w) continue;
                    int ox = tx / g.stride_w;
                    acc += gp[(long long)oy * g.out_w + ox] * wp[ki * g.kernel_w + kj];
                }
            }
        }
        dx[i] = acc;
    }
}

// dw (=|+=) the weight's gradient, one block per weight: its products over every image and
// output cell, summed in double in a fixed order.
extern "C" __global__ void conv_direct_bwd_weight(long long batch, Window g, int mult,
                                                  const float* x, const float* grad, float* dw,
                                                  int accumulate) {
    long long plane = (long long)g.out_h * g.out_w;
    long long outs = (long long)g.channels * mult;
    long long taps = (long long)g.kernel_h * g.kernel_w;
    long long count = batch * plane;
    for (long long t = blockIdx.x; t < outs * taps; t += gridDim.x) {
        long long o = t / taps;
        int ki = (int)(t % taps / g.kernel_w), kj = (int)(t % g.kernel_w);
        double acc = 0.0;
        for (long long j = threadIdx.x; j < count; j += blockDim.x) {
            long long img = j / plane, p = j % plane;
            int oy = (int)(p / g.out_w), ox = (int)(p % g.out_w);
            int iy = oy * g.stride_h - g.pad_h + ki * g.dil_h;
            int ix = ox * g.stride_w - g.pad_w + kj * g.dil_w;
            if (iy < 0 || iy >= g.in_h || ix < 0 || ix >= g.in_w) continue;
            long long at = ((img * g.channels + o / mult) * g.in_h + iy) * g.in_w + ix;
            acc += (double)grad[(img * outs + o) * plane + p] * (double)x[at];
        }
        acc = block_sum(acc);
        if (threadIdx.x == 0) dw[t] = accumulate ? dw[t] + (float)acc : (float)acc;
    }
}

// The first and one-past-last output index along one axis whose window covers input index `i`
// (windows of `k` cells every `stride`, starting at o·stride − pad).
__device__ __forceinline__ void covering(int i, int k, int stride, int pad, int out, int* first,
                                         int* last) {
    int hi = i + pad;  // o·stride <= hi
    int lo = hi - k + 1;  // o·stride >= lo
    *first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
    int l = hi / stride + 1;
    *last = l < out ? l : out;
}

// Max pooling over `planes` planes, one thread per output cell: the largest input in the window
// (the first one in row-major order on ties; NaN wins, as in PyTorch) and its index iy·in_w + ix
// within the plane.
extern "C" __global__ void max_pool_fwd(long long planes, Window g, const float* x, float* y,
                                        float* argmax) {
    long long n = planes * g.out_h * g.out_w;
    GRID_STRIDE(i, n) {
        int ox = (int)(i % g.out_w);
        int oy = (int)(i / g.out_w % g.out_h);
        const float* p = x + i / ((long long)g.out_w * g.out_h) * g.in_h * g.in_w;
        float best = 0.0f;
        int at = -1;
        for (int ky = 0; ky < g.kernel_h; ++ky) {
            int iy = oy * g.stride_h - g.pad_h + ky;
            if (iy < 0 || iy >= g.in_h) continue;
            for (int kx = 0; kx < g.kernel_w; ++kx) {
                int ix = ox * g.stride_w - g.pad_w + kx;
                if (ix < 0 || ix >= g.in_w) continue;
                float v = p[iy * g.in_w + ix];
                if (at < 0 || v > best || (v != v && best == best)) {
                    best = v;
                    at = iy * g.in_w + ix;
                }
            }
        }
        y[i] = best;
        argmax[i] = (float)at;
    }
}

// The gradient of max pooling, one thread per input cell: the sum of the output gradients of the
// windows this cell won, in output order (no atomics, the same order as the CPU's scatter).
extern "C" __global__ void max_pool_bwd(long long planes, Window g, const float* grad,
                                        const float* argmax, float* dx) {
    long long n = planes * g.in_h * g.in_w;
    long long out_plane = (long long)g.out_h * g.out_w;
    GRID_STRIDE(i, n) {
        int ix = (int)(i % g.in_w);
        int iy = (int)(i / g.in_w % g.in_h);
        long long base = i / ((long long)g.in_w * g.in_h) * out_plane;
        float me = (float)(iy * g.in_w + ix);
        int y0, y1, x0, x1;
        covering(iy, g.kernel_h, g.stride_h, g.pad_h, g.out_h, &y0, &y1);
        covering(ix, g.kernel_w, g.stride_w, g.pad_w, g.out_w, &x0, &x1);
        float acc = 0.0f;
        for (int oy = y0; oy < y1; ++oy) {
            for (int ox = x0; ox < x1; ++ox) {
                long long k = base + (long long)oy * g.out_w + ox;
                if (argmax[k] == me) acc += grad[k];
            }
        }
        dx[i] = acc;
    }
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// The number of input cells (padding excluded) in the window of output (oy, ox).
__device__ __forceinline__ int window_cells(const Window& g, int oy, int ox) {
    int y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
    int y1 = imin(y0 + g.kernel_h, g.in_h), x1 = imin(x0 + g.kernel_w, g.in_w);
    return (y1 - imax(y0, 0)) * (x1 - imax(x0, 0));
}

// Average pooling, one thread per output cell; padded cells are not counted.
extern "C" __global__ void avg_pool_fwd(long long planes, Window g, const float* x, float* y) {
    long long n = planes * g.out_h * g.out_w;
    GRID_STRIDE(i, n) {
        int ox = (int)(i % g.out_w);
        int oy = (int)(i / g.out_w % g.out_h);
        const float* p = x + i / ((long long)g.out_w * g.out_h) * g.in_h * g.in_w;
        int y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
        int y1 = imin(y0 + g.kernel_h, g.in_h), x1 = imin(x0 + g.kernel_w, g.in_w);
        float acc = 0.0f;
        for (int iy = imax(y0, 0); iy < y1; ++iy) {
            for (int ix = imax(x0, 0); ix < x1; ++ix) acc += p[iy * g.in_w + ix];
        }
        y[i] = acc / (float)window_cells(g, oy, ox);
    }
}

// The gradient of average pooling, one thread per input cell: each covering window's output
// gradient divided by the window's counted cells, summed in output order.
extern "C" __global__ void avg_pool_bwd(long long planes, Window g, const float* grad,
                                        float* dx) {
    long long n = planes * g.in_h * g.in_w;
    long long out_plane = (long long)g.out_h * g.out_w;
    GRID_STRIDE(i, n) {
        int ix = (int)(i % g.in_w);
        int iy = (int)(i / g.in_w % g.in_h);
        long long base = i / ((long long)g.in_w * g.in_h) * out_plane;
        int y0, y1, x0, x1;
        covering(iy, g.kernel_h, g.stride_h, g.pad_h, g.out_h, &y0, &y1);
        covering(ix, g.kernel_w, g.stride_w, g.pad_w, g.out_w, &x0, &x1);
        float acc = 0.0f;
        for (int oy = y0; oy < y1; ++oy) {
            for (int ox = x0; ox < x1; ++ox) {
                acc += grad[base + (long long)oy * g.out_w + ox] / (float)window_cells(g, oy, ox);
            }
        }
        dx[i] = acc;
    }
}

// ----- batch normalization (backend/cuda/norm.rs) ---------------------------------------------
//
// x is [batch, channels, rest]; channel c's values are batch runs of `rest`. The arithmetic is
// backend/cpu/norm.rs's: sums in double, statistics shifted by the channel's first value.

// Per-channel sum (a convolution's bias gradient), one block per channel, in double.
extern "C" __global__ void channel_sum(long long batch, long long channels, long long rest,
                                       const float* x, float* out) {
    long long count = batch * rest;
    for (long long c = blockIdx.x; c < channels; c += gridDim.x) {
        double s = 0.0;
        for (long long j = threadIdx.x; j < count; j += blockDim.x) {
            s += (double)x[(j / rest * channels + c) * rest + j % rest];
        }
        s = block_sum(s);
        if (threadIdx.x == 0) out[c] = (float)s;
    }
}

// y += bias per channel, in place (a convolution's bias).
extern "C" __global__ void channel_bias_add(long long n, long long channels, long long rest,
                                            const float* bias, float* y) {
    GRID_STRIDE(i, n) { y[i] += bias[i / rest % channels]; }
}

// Per-channel mean and biased variance, one block per channel.
extern "C" __global__ void bn_stats(long long batch, long long channels, long long rest,
                                    const float* x, float* mean, float* var) {
    long long count = batch * rest;
    for (long long c = blockIdx.x; c < channels; c += gridDim.x) {
        double shift = count > 0 ? (double)x[c * rest] : 0.0;
        double s1 = 0.0, s2 = 0.0;
        for (long long j = threadIdx.x; j < count; j += blockDim.x) {
            double d = (double)x[(j / rest * channels + c) * rest + j % rest] - shift;
            s1 += d;
            s2 += d * d;
        }
        s1 = block_sum(s1);
        s2 = block_sum(s2);
        if (threadIdx.x == 0) {
            double m = count > 0 ? s1 / (double)count : 0.0;
            double v = count > 0 ? s2 / (double)count - m * m : 0.0;
            mean[c] = count > 0 ? (float)(shift + m) : 0.0f;
            var[c] = (float)(v > 0.0 ? v : 0.0);
        }
    }
}

// out = x · scale + shift per channel, scale = gamma / sqrt(var + eps), shift = beta − mean·scale.
extern "C" __global__ void bn_forward(long long n, long long channels, long long rest,
                                      const float* x, const float* mean, const float* var,
                                      const float* gamma, const float* beta, float eps,
                                      float* out) {
    GRID_STRIDE(i, n) {
        long long c = i / rest % channels;
        float scale = gamma[c] / sqrtf(var[c] + eps);
        float shift = beta[c] - mean[c] * scale;
        out[i] = x[i] * scale + shift;
    }
}

// Per channel, one block each: dgamma = Σ dy·(x − mean) / σ, dbeta = Σ dy, and the coefficients
// (a, b, k) of dx = a·dy + b·x + k (b = k = 0 without batch statistics) into coeffs[3c..3c+3].
extern "C" __global__ void bn_backward_sums(long long batch, long long channels, long long rest,
                                            const float* x, const float* dy, const float* mean,
                                            const float* var, const float* gamma, float eps,
                                            int batch_stats, float* dgamma, float* dbeta,
                                            float* coeffs) {
    long long count = batch * rest;
    for (long long c = blockIdx.x; c < channels; c += gridDim.x) {
        double sdy = 0.0, sdyx = 0.0;
        for (long long j = threadIdx.x; j < count; j += blockDim.x) {
            long long at = (j / rest * channels + c) * rest + j % rest;
            double d = (double)dy[at];
            sdy += d;
            sdyx += d * (double)(x[at] - mean[c]);
        }
        sdy = block_sum(sdy);
        sdyx = block_sum(sdyx);
        if (threadIdx.x == 0) {
            double n = count > 1 ? (double)count : 1.0;
            double inv_std = 1.0 / sqrt((double)var[c] + (double)eps);
            double dg = sdyx * inv_std;
            double a = (double)gamma[c] * inv_std;
            double b = 0.0, k = 0.0;
            if (batch_stats) {
                b = -a * inv_std * dg / n;
                k = -a * sdy / n - b * (double)mean[c];
            }
            dgamma[c] = (float)dg;
            dbeta[c] = (float)sdy;
            coeffs[3 * c] = (float)a;
            coeffs[3 * c + 1] = (float)b;
            coeffs[3 * c + 2] = (float)k;
        }
    }
}

// dx = a·dy + b·x + k with channel c's coefficients from bn_backward_sums.
extern "C" __global__ void bn_backward_dx(long long n, long long channels, long long rest,
                                          const float* coeffs, const float* x, const float* dy,
                                          float* dx) {
    GRID_STRIDE(i, n) {
        long long c = i / rest % channels;
        dx[i] = coeffs[3 * c] * dy[i] + coeffs[3 * c + 1] * x[i] + coeffs[3 * c + 2];
    }
}
