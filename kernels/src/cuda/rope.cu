// RoPE of q and k in one launch: heads [0, n_q) of q, then [0, n_k) of k
// (n_k may be 0: q alone). Interleaved pairs (2i, 2i+1) of each head rotate
// together by pos * base^(-2i/head_dim) (GGUF's Q/K row order); with
// `halves` (Gemma 3, NeoX) dimension i of a head rotates with i + head_dim /
// 2 instead, by the same angle, as the CPU's `rope_halves` (its `hi c + lo
// s` is the same sum: a rounded add commutes).
// q: [rows, n_q * head_dim], k: [rows, n_k * head_dim], in place; row r is
// at position pos[r]. The arithmetic is `rope_rotate` (common.cuh).

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
        rope_rotate(v, v + partner, pos[r], i, head_dim, base);
    }
}
