// cuBLAS's SGEMM and strided-batched SGEMM as its documentation defines them, on the emulated
// device memory.
//
// cuBLAS is column-major: C (m × n, leading dimension ldc) = alpha · op(A) · op(B) + beta · C,
// with op(A) m × k and op(B) k × n. A stored "N" is m × k with lda ≥ m; a stored "T" is k × m
// with lda ≥ k (likewise B with ldb). The leading dimensions are checked as cuBLAS checks them,
// every operand must lie inside device memory, and beta = 0 never reads C (which may hold NaN),
// so a backend that gets the row-major/column-major mapping wrong fails here as on a GPU. The
// strided-batched form checks every product of the batch the same way.
#include <cstdio>
#include <algorithm>
#include <string>
#include <vector>

#include "emulator.h"

#define API extern "C" __attribute__((visibility("default")))

enum cublasStatus_t : int {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
};

enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

struct Handle {
    void* stream;
};
using cublasHandle_t = Handle*;

namespace {

using emu::refuse;

// Whether the column-major matrix of `rows` × `cols` with leading dimension `ld` at `p` lies in
// device memory.
bool in_device(const float* p, int rows, int cols, int ld) {
    if (rows == 0 || cols == 0) return true;
    size_t last = (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
    return emu::is_device_range((uintptr_t)p, last * sizeof(float));
}

}  // namespace

API cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    if (!emu::has_current_context())
        return refuse("cublasCreate", CUBLAS_STATUS_NOT_INITIALIZED, "no current context");
    *handle = new Handle{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, void* stream) {
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

// C_b = alpha · op(A_b) · op(B_b) + beta · C_b for b in 0..batch, X_b lying b · stride_x floats
// after X (a plain SGEMM is one batch): checked as cuBLAS checks it, then queued.
cublasStatus_t sgemm(const char* call, cublasHandle_t handle, cublasOperation_t transa,
                     cublasOperation_t transb, int m, int n, int k, const float* alpha,
                     const float* A, int lda, long long stride_a, const float* B, int ldb,
                     long long stride_b, const float* beta, float* C, int ldc, long long stride_c,
                     int batch) {
    if (!handle) return refuse(call, CUBLAS_STATUS_NOT_INITIALIZED, "no handle");
    if (!emu::has_current_context())
        return refuse(call, CUBLAS_STATUS_NOT_INITIALIZED, "no current context on this thread");
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    int a_rows = ta ? k : m, a_cols = ta ? m : k;
    int b_rows = tb ? n : k, b_cols = tb ? k : n;
    auto at_least = [](int rows) { return rows > 1 ? rows : 1; };
    if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < at_least(a_rows) ||
        ldb < at_least(b_rows) || ldc < at_least(m))
        return refuse(call, CUBLAS_STATUS_INVALID_VALUE,
                      "m=" + std::to_string(m) + " n=" + std::to_string(n) +
                          " k=" + std::to_string(k) + " lda=" + std::to_string(lda) +
                          " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) +
                          " batch=" + std::to_string(batch));
    for (int b = 0; b < batch; ++b) {
        if (!in_device(A + b * stride_a, a_rows, a_cols, lda) ||
            !in_device(B + b * stride_b, b_rows, b_cols, ldb) ||
            !in_device(C + b * stride_c, m, n, ldc))
            return refuse(call, CUBLAS_STATUS_INVALID_VALUE,
                          "an operand of product " + std::to_string(b) +
                              " is outside device memory");
    }
    float al = *alpha, be = *beta;  // host pointer mode: read at the call
    // Queued behind the kernels that produce A and B, as on the handle's stream.
    bool queued = emu::enqueue([=]() -> std::string {
        // Column j of C from contiguous runs: an axpy down A's columns when A is stored as
        // op(A), else dot products along A's stored columns with column j of op(B) gathered.
        std::vector<float> acc((size_t)m), bj((size_t)k);
        for (int p = 0; p < batch; ++p) {
            const float* Ap = A + p * stride_a;
            const float* Bp = B + p * stride_b;
            float* Cp = C + p * stride_c;
            for (int j = 0; j < n; ++j) {
                for (int l = 0; l < k; ++l)
                    bj[l] = tb ? Bp[j + (size_t)l * ldb] : Bp[l + (size_t)j * ldb];
                if (!ta) {
                    std::fill(acc.begin(), acc.end(), 0.0f);
                    for (int l = 0; l < k; ++l) {
                        const float* a = Ap + (size_t)l * lda;
                        float b = bj[l];
                        for (int i = 0; i < m; ++i) acc[i] += a[i] * b;
                    }
                } else {
                    for (int i = 0; i < m; ++i) {
                        const float* a = Ap + (size_t)i * lda;
                        float dot = 0.0f;
                        for (int l = 0; l < k; ++l) dot += a[l] * bj[l];
                        acc[i] = dot;
                    }
                }
                float* c = Cp + (size_t)j * ldc;
                for (int i = 0; i < m; ++i)
                    c[i] = be == 0.0f ? al * acc[i] : al * acc[i] + be * c[i];
            }
        }
        return "";
    });
    if (!queued) return refuse(call, CUBLAS_STATUS_NOT_INITIALIZED, "no current context");
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                  cublasOperation_t transb, int m, int n, int k,
                                  const float* alpha, const float* A, int lda, const float* B,
                                  int ldb, const float* beta, float* C, int ldc) {
    return sgemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0,
                 beta, C, ldc, 0, 1);
}

// The same product for `batchCount` operand triples lying `stride*` floats apart (a stride of 0
// reuses one operand, as cuBLAS allows).
API cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                             cublasOperation_t transb, int m, int n, int k,
                                             const float* alpha, const float* A, int lda,
                                             long long strideA, const float* B, int ldb,
                                             long long strideB, const float* beta, float* C,
                                             int ldc, long long strideC, int batchCount) {
    return sgemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, lda,
                 strideA, B, ldb, strideB, beta, C, ldc, strideC, batchCount);
}
