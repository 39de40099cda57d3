// RoPE on interleaved pairs: dimensions (2i, 2i+1) of each head rotate
// together by pos * base^(-2i/head_dim) (GGUF's Q/K row order).
// x: [rows, n_heads * head_dim], in place; row r is at position pos[r].
// The angle, its cosine and sine in f64 (an f32 angle at position 8000 has
// already lost three digits), the rotation in f32 without fma, as the CPU.

extern "C" __global__ void rope(float* x, const u32* pos, int n_heads, int head_dim,
                                float base) {
    int r = blockIdx.x;
    int half = head_dim / 2;
    int pairs = n_heads * half;
    float* xr = x + (size_t)r * n_heads * head_dim;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int h = p / half, i = p % half;
        double inv_freq = pow((double)base, -2.0 * (double)i / (double)head_dim);
        double theta = (double)pos[r] * inv_freq;
        float c = (float)cos(theta), s = (float)sin(theta);
        float* v = xr + h * head_dim + 2 * i;
        float a = v[0], b = v[1];
        v[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

// Q and K of one forward in one launch: heads [0, n_q) of q, then [0, n_k)
// of k, each rotated exactly as by `rope`; with `halves` (Gemma 3, NeoX)
// dimension i of a head rotates with i + head_dim / 2 instead of pair
// (2i, 2i+1), by the same angle, as the CPU's `rope_halves` (its
// `hi c + lo s` is the same sum: a rounded add commutes).
extern "C" __global__ void rope_qk(float* q, float* k, const u32* pos, int n_q, int n_k,
                                   int head_dim, float base, int halves) {
    int r = blockIdx.x;
    int half = head_dim / 2;
    int pairs = (n_q + n_k) * half;
    int partner = halves ? half : 1;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int h = p / half, i = p % half;
        int at = halves ? i : 2 * i;
        float* v = h < n_q ? q + ((size_t)r * n_q + h) * head_dim + at
                           : k + ((size_t)r * n_k + (h - n_q)) * head_dim + at;
        double inv_freq = pow((double)base, -2.0 * (double)i / (double)head_dim);
        double theta = (double)pos[r] * inv_freq;
        float c = (float)cos(theta), s = (float)sin(theta);
        float a = v[0], b = v[partner];
        v[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[partner] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}
