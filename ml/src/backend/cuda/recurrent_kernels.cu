// The recurrent gates of ringflow's CUDA backend (backend/cuda/recurrent.rs): one LSTM or GRU
// step's elementwise work after its GEMMs, forward and backward, one thread per unit of a row.
// Compiled after kernels.cu (kernels.rs concatenates the sources), whose GRID_STRIDE and
// sigmoid_f they use. The arithmetic is the CPU's (backend/cpu/recurrent.rs) and the layout of
// what a forward pass saves for its backward pass is the contract's (backend/recurrent.rs):
// LSTM [i, f, g, o, c_prev, tanh(c)], GRU [r, z, c, u, h_prev], blocks of `hidden` per row.

// One LSTM step: gates [n, 4·hidden] (pre-activation), c_prev [n, hidden] → h, c [n, hidden]
// and saved [n, 6·hidden]. `n` counts the n·hidden units.
extern "C" __global__ void lstm_cell_fwd(long long n, long long hidden, const float* gates,
                                         const float* c_prev, float* h, float* c,
                                         float* saved) {
    GRID_STRIDE(i, n) {
        long long row = i / hidden, u = i % hidden;
        const float* g = gates + row * 4 * hidden;
        float ig = sigmoid_f(g[u]);
        float fg = sigmoid_f(g[hidden + u]);
        float gg = tanhf(g[2 * hidden + u]);
        float og = sigmoid_f(g[3 * hidden + u]);
        float cp = c_prev[i];
        float cn = fg * cp + ig * gg;
        float tc = tanhf(cn);
        float* s = saved + row * 6 * hidden;
        s[u] = ig;
        s[hidden + u] = fg;
        s[2 * hidden + u] = gg;
        s[3 * hidden + u] = og;
        s[4 * hidden + u] = cp;
        s[5 * hidden + u] = tc;
        c[i] = cn;
        h[i] = og * tc;
    }
}

// The LSTM step's gradients: saved [n, 6·hidden], dh and dc [n, hidden] → dgates
// [n, 4·hidden] and dc_prev [n, hidden].
extern "C" __global__ void lstm_cell_bwd(long long n, long long hidden, const float* saved,
                                         const float* dh, const float* dc, float* dgates,
                                         float* dc_prev) {
    GRID_STRIDE(i, n) {
        long long row = i / hidden, u = i % hidden;
        const float* s = saved + row * 6 * hidden;
        float ig = s[u], fg = s[hidden + u], gg = s[2 * hidden + u], og = s[3 * hidden + u];
        float cp = s[4 * hidden + u], tc = s[5 * hidden + u];
        float dct = dc[i] + dh[i] * og * (1.0f - tc * tc);
        float* d = dgates + row * 4 * hidden;
        d[u] = dct * gg * (ig * (1.0f - ig));
        d[hidden + u] = dct * cp * (fg * (1.0f - fg));
        d[2 * hidden + u] = dct * ig * (1.0f - gg * gg);
        d[3 * hidden + u] = dh[i] * tc * (og * (1.0f - og));
        dc_prev[i] = dct * fg;
    }
}

// One GRU step: x_gates and h_gates [n, 3·hidden], h_prev [n, hidden] → h [n, hidden] and
// saved [n, 5·hidden].
extern "C" __global__ void gru_cell_fwd(long long n, long long hidden, const float* x_gates,
                                        const float* h_gates, const float* h_prev, float* h,
                                        float* saved) {
    GRID_STRIDE(i, n) {
        long long row = i / hidden, u = i % hidden;
        const float* x = x_gates + row * 3 * hidden;
        const float* hg = h_gates + row * 3 * hidden;
        float r = sigmoid_f(x[u] + hg[u]);
        float z = sigmoid_f(x[hidden + u] + hg[hidden + u]);
        float uc = hg[2 * hidden + u];
        float cand = tanhf(x[2 * hidden + u] + r * uc);
        float hp = h_prev[i];
        float* s = saved + row * 5 * hidden;
        s[u] = r;
        s[hidden + u] = z;
        s[2 * hidden + u] = cand;
        s[3 * hidden + u] = uc;
        s[4 * hidden + u] = hp;
        h[i] = cand + z * (hp - cand);
    }
}

// The GRU step's gradients: saved [n, 5·hidden] and dh [n, hidden] → dx_gates and dh_gates
// [n, 3·hidden] and the direct part of dh_prev [n, hidden].
extern "C" __global__ void gru_cell_bwd(long long n, long long hidden, const float* saved,
                                        const float* dh, float* dx_gates, float* dh_gates,
                                        float* dh_prev) {
    GRID_STRIDE(i, n) {
        long long row = i / hidden, u = i % hidden;
        const float* s = saved + row * 5 * hidden;
        float r = s[u], z = s[hidden + u], cand = s[2 * hidden + u], uc = s[3 * hidden + u];
        float hp = s[4 * hidden + u];
        float dc = dh[i] * (1.0f - z) * (1.0f - cand * cand);
        float dr = dc * uc * (r * (1.0f - r));
        float dz = dh[i] * (hp - cand) * (z * (1.0f - z));
        float* dx = dx_gates + row * 3 * hidden;
        float* dg = dh_gates + row * 3 * hidden;
        dx[u] = dr;
        dx[hidden + u] = dz;
        dx[2 * hidden + u] = dc;
        dg[u] = dr;
        dg[hidden + u] = dz;
        dg[2 * hidden + u] = dc * r;
        dh_prev[i] = dh[i] * z;
    }
}
