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
#define FRAC_1_SQRT_2 0.70710677f
#define FRAC_1_SQRT_2PI 0.3989423f

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
        case 8: return x * x;
        default: return 0.5f * x * (1.0f + erff(x * FRAC_1_SQRT_2));  // 9: GELU, exact
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
        case 8: return 2.0f * x;
        default:  // 9: GELU, exact: Φ(x) + x·φ(x)
            return 0.5f * (1.0f + erff(x * FRAC_1_SQRT_2)) +
                   x * FRAC_1_SQRT_2PI * expf(-0.5f * x * x);
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
