// Matrix products against weights in their file format.
//
// y[r, o] = sum_i W[o, i] * x[r, i], W row-major [out, in] in GGML type `type`.
//
// f32 activations: eight lanes per output row. Lane j of the eight owns the
// elements i = j (mod 8) and sums them in increasing i, then the eight
// partial sums combine as ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7)): the exact
// order of the CPU reference's 8-accumulator dot product, with unfused
// multiply-adds, so the kernel's output is the CPU's bit for bit. A (row, o)
// result never depends on how many rows share the launch either: a batched
// decode equals its slots run alone, and two runs are identical.

// With `staged`, the block first copies its weight rows (contiguous in W)
// and its rows of x into shared memory, every thread loading at once: one
// round trip to memory instead of one per unrolled step of every lane's
// chain. Where the data is read from never changes the order of the sums.
template <int TYPE>
__device__ void matmul_f32_body(const u8* w, const float* x, float* y, int rows, int in, int out,
                                int staged, int bx) {
    extern __shared__ __align__(16) u8 smem[];
    int lane = threadIdx.x & 31;
    int j = lane & 7;
    int o0 = bx * WARPS * OUTS_PER_WARP;
    int o = o0 + (threadIdx.x >> 5) * OUTS_PER_WARP + (lane >> 3);
    // Lanes past the last row still take part in the shuffles below.
    bool live = o < out;
    size_t row_bytes = (size_t)(in / block_size(TYPE)) * type_size(TYPE);
    // Each grid row (blockIdx.y) takes one pass of ROWS_PER_PASS rows.
    int r0 = blockIdx.y * ROWS_PER_PASS;
    int nr = min(ROWS_PER_PASS, rows - r0);
    const u8* wr = w + (size_t)(live ? o : 0) * row_bytes;
    const float* xp = x;
    int xr0 = r0;
    if (staged) {
        int n_out = min(WARPS * OUTS_PER_WARP, out - o0);
        size_t bytes = (size_t)n_out * row_bytes;
        const u8* src = w + (size_t)o0 * row_bytes;
        stage_bytes(smem, src, bytes);
        float* xs = (float*)(smem + staged_x_offset(row_bytes));
        stage_bytes((u8*)xs, (const u8*)(x + (size_t)r0 * in), (size_t)nr * in * 4);
        __syncthreads();
        wr = smem + (size_t)(live ? o - o0 : 0) * row_bytes;
        xp = xs;
        xr0 = 0;
    }
    float acc[ROWS_PER_PASS];
#pragma unroll
    for (int k = 0; k < ROWS_PER_PASS; ++k) acc[k] = 0.0f;
    if (live) partial_sums_rows<TYPE>(wr, xp, xr0, nr, in, j, acc);
#pragma unroll
    for (int k = 0; k < ROWS_PER_PASS; ++k) {
        float a = combine_lanes(acc[k]);
        if (live && j == 0 && k < nr) y[(size_t)(r0 + k) * out + o] = a;
    }
}

__device__ void matmul_f32_dispatch(int type, const u8* w, const float* x, float* y, int rows,
                                    int in, int out, int staged, int bx) {
    switch (type) {
        case T_F32: matmul_f32_body<T_F32>(w, x, y, rows, in, out, staged, bx); break;
        case T_F16: matmul_f32_body<T_F16>(w, x, y, rows, in, out, staged, bx); break;
        case T_BF16: matmul_f32_body<T_BF16>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q4_0: matmul_f32_body<T_Q4_0>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q4_1: matmul_f32_body<T_Q4_1>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q5_0: matmul_f32_body<T_Q5_0>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q8_0: matmul_f32_body<T_Q8_0>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q2_K: matmul_f32_body<T_Q2_K>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q3_K: matmul_f32_body<T_Q3_K>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q4_K: matmul_f32_body<T_Q4_K>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q5_K: matmul_f32_body<T_Q5_K>(w, x, y, rows, in, out, staged, bx); break;
        case T_Q6_K: matmul_f32_body<T_Q6_K>(w, x, y, rows, in, out, staged, bx); break;
    }
}

extern "C" __global__ void matmul_f32(const u8* w, int type, const float* x, float* y,
                                      int rows, int in, int out, int staged) {
    matmul_f32_dispatch(type, w, x, y, rows, in, out, staged, blockIdx.x);
}

// Up to three matrices against the same x in one launch (q, k and v; gate
// and up): blocks [0, b0) take W0, the next b1 take W1, the rest W2. One
// launch instead of three at one row, where a launch costs more than the
// work; each output is computed exactly as by matmul_f32.
extern "C" __global__ void matmul_f32_x3(const u8* w0, const u8* w1, const u8* w2, int t0,
                                         int t1, int t2, float* y0, float* y1, float* y2,
                                         int n0, int n1, int n2, int s0, int s1, int s2,
                                         const float* x, int rows, int in) {
    int per = WARPS * OUTS_PER_WARP;
    int b0 = (n0 + per - 1) / per, b1 = (n1 + per - 1) / per;
    int bx = blockIdx.x;
    if (bx < b0) {
        matmul_f32_dispatch(t0, w0, x, y0, rows, in, n0, s0, bx);
    } else if (bx < b0 + b1) {
        matmul_f32_dispatch(t1, w1, x, y1, rows, in, n1, s1, bx - b0);
    } else {
        matmul_f32_dispatch(t2, w2, x, y2, rows, in, n2, s2, bx - b0 - b1);
    }
}

// The q8 precision mode: activations quantized to int8 per 32-element block
// in f32, as llama.cpp's quantize_row_q8_0/q8_1 (and the CPU reference):
// scale = amax / 127, quants round(x * (1 / scale)) half away from zero, the
// scale stored as f16. Per block also the integer sum of the quants (Q4_0's
// offset term) and block_q8_1's `s`, f16(sum * scale) (Q4_1's min term).

// x rounded to the nearest f16 (ties to even), as a float.
__device__ __forceinline__ float round_to_f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return f16_to_f32(h);
}

extern "C" __global__ void quantize_q8(const float* x, i8* q, float* scales, int* sums,
                                       float* s_f16, int nblocks) {
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (b >= nblocks) return;
    float v = x[(size_t)b * QK + lane];
    float amax = warp_max(fabsf(v));
    float scale = amax / 127.0f;
    float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    int qi = (int)fminf(127.0f, fmaxf(-127.0f, roundf(__fmul_rn(v, inv))));
    q[(size_t)b * QK + lane] = (i8)qi;
    int s = qi;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
        scales[b] = round_to_f16(scale);
        sums[b] = s;
        s_f16[b] = round_to_f16(__fmul_rn((float)s, scale));
    }
}

// Integer dot product of one 32-element weight block with one quantized
// activation block, as a float contribution. DP4A for the 4- and 8-bit types;
// the other types fall back to dequantized weights times dequantized
// activations.
__device__ __forceinline__ float block_dot_q8(const u8* wr, int type, int b, const i8* aq,
                                              float ad, int asum, float a_s) {
    const int* a = (const int*)aq;  // 32 int8, 4-aligned (QK-byte blocks)
    switch (type) {
        case T_Q8_0: {
            const u8* blk = wr + (size_t)b * 34;
            float d = f16_to_f32(load_u16(blk));
            int isum = 0;
            for (int k = 0; k < 8; ++k) isum = __dp4a(load_i32_unaligned(blk + 2 + 4 * k), a[k], isum);
            return d * ad * (float)isum;
        }
        case T_Q4_1: {
            const u8* blk = wr + (size_t)b * 20;
            float d = f16_to_f32(load_u16(blk));
            float m = f16_to_f32(load_u16(blk + 2));
            const int* qs = (const int*)(blk + 4);
            int isum = 0;
            for (int k = 0; k < 4; ++k) {
                int v = qs[k];
                isum = __dp4a(v & 0x0F0F0F0F, a[k], isum);
                isum = __dp4a((v >> 4) & 0x0F0F0F0F, a[k + 4], isum);
            }
            return d * ad * (float)isum + m * a_s;
        }
        case T_Q4_0: {
            const u8* blk = wr + (size_t)b * 18;
            float d = f16_to_f32(load_u16(blk));
            int isum = 0;
            for (int k = 0; k < 4; ++k) {
                int v = load_i32_unaligned(blk + 2 + 4 * k);
                isum = __dp4a(v & 0x0F0F0F0F, a[k], isum);
                isum = __dp4a((v >> 4) & 0x0F0F0F0F, a[k + 4], isum);
            }
            return d * ad * (float)(isum - 8 * asum);
        }
        default: {
            float s = 0.0f;
            for (int j = 0; j < QK; ++j) s += dequant_elem(wr, type, b * QK + j) * ((float)aq[j] * ad);
            return s;
        }
    }
}

// y = W x with x given as quantize_q8's output; one warp per output row, one
// lane per weight block, the warp's sum in a fixed order.
extern "C" __global__ void matmul_q8(const u8* w, int type, const i8* q, const float* scales,
                                     const int* sums, const float* s_f16, float* y, int rows,
                                     int in, int out) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (o >= out) return;
    int nb = in / QK;
    size_t row_bytes = (size_t)(in / block_size(type)) * type_size(type);
    const u8* wr = w + (size_t)o * row_bytes;
    {
        int r0 = blockIdx.y * ROWS_PER_PASS;
        int nr = min(ROWS_PER_PASS, rows - r0);
        float acc[ROWS_PER_PASS];
#pragma unroll
        for (int k = 0; k < ROWS_PER_PASS; ++k) acc[k] = 0.0f;
        for (int b = lane; b < nb; b += 32) {
#pragma unroll
            for (int k = 0; k < ROWS_PER_PASS; ++k) {
                if (k < nr) {
                    size_t ab = (size_t)(r0 + k) * nb + b;
                    acc[k] += block_dot_q8(wr, type, b, q + ab * QK, scales[ab], sums[ab], s_f16[ab]);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < ROWS_PER_PASS; ++k) {
            float s = warp_sum(acc[k]);
            if (lane == 0 && k < nr) y[(size_t)(r0 + k) * out + o] = s;
        }
    }
}

// Q8_K, the activation format of K-quant weights, as llama.cpp's
// quantize_row_q8_K_ref and the CPU's quant::quantize_row_q8_k: per block of
// 256, the value `max` of largest magnitude (the first, on ties) maps to
// exactly -127 through iscale = -127 / max, every value to
// nearest_int(iscale * x) (half to even) capped at 127, d = 1 / iscale in
// f32. An all-zero block is zeros with d = 0. One CTA of 256 threads per block.
extern "C" __global__ void quantize_q8_k(const float* x, i8* q, float* d, int nblocks) {
    __shared__ float s_abs[8];
    __shared__ int s_idx[8];
    int b = blockIdx.x;
    if (b >= nblocks) return;
    int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    float v = x[(size_t)b * QK_K + t];
    // (|v|, index): the larger magnitude wins, the lower index on a tie.
    float a = fabsf(v);
    int idx = t;
    for (int o = 16; o > 0; o >>= 1) {
        float a2 = __shfl_xor_sync(0xffffffffu, a, o);
        int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > a || (a2 == a && i2 < idx)) {
            a = a2;
            idx = i2;
        }
    }
    if (lane == 0) {
        s_abs[warp] = a;
        s_idx[warp] = idx;
    }
    __syncthreads();
    float amax = s_abs[0];
    int first = s_idx[0];
    for (int w = 1; w < 8; ++w) {
        if (s_abs[w] > amax) {
            amax = s_abs[w];
            first = s_idx[w];
        }
    }
    if (amax == 0.0f) {
        q[(size_t)b * QK_K + t] = 0;
        if (t == 0) d[b] = 0.0f;
        return;
    }
    float iscale = __fdiv_rn(-127.0f, x[(size_t)b * QK_K + first]);
    int qi = min(127, __float2int_rn(__fmul_rn(iscale, v)));
    q[(size_t)b * QK_K + t] = (i8)qi;
    if (t == 0) d[b] = __fdiv_rn(1.0f, iscale);
}

// y = W x with int8 activations, in the CPU q8 mode's order (cpu/matmul.rs):
// per weight block (32 or 256 elements) the quants, as floats, meet the
// dequantized weights in the 8-lane dot of matmul_f32 (lane j takes the
// block's elements i = j mod 8, the lanes combine pairwise), then
// acc += d_b * dot, blocks in order, multiplies and adds rounded apart. So
// the result is the CPU's bit for bit. `d` holds one scale per block of the
// weight's block size: Q8_K's f32 d for K-quants, Q8_0's f16-rounded scale
// for 32-blocks.
template <int TYPE>
__device__ void matmul_q8_ordered_body(const u8* w, const i8* q, const float* d, float* y,
                                       int rows, int in, int out) {
    const int B = block_size(TYPE);
    int lane = threadIdx.x & 31;
    int j = lane & 7;
    int o = blockIdx.x * WARPS * OUTS_PER_WARP + (threadIdx.x >> 5) * OUTS_PER_WARP + (lane >> 3);
    // Lanes past the last row keep to the loop: they take part in the shuffles.
    bool live = o < out;
    size_t row_bytes = (size_t)(in / B) * type_size(TYPE);
    const u8* wr = w + (size_t)(live ? o : 0) * row_bytes;
    int r0 = blockIdx.y * ROWS_PER_PASS;
    int nr = min(ROWS_PER_PASS, rows - r0);
    int nb = in / B;
    float acc[ROWS_PER_PASS];
#pragma unroll
    for (int k = 0; k < ROWS_PER_PASS; ++k) acc[k] = 0.0f;
    for (int b = 0; b < nb; ++b) {
        float part[ROWS_PER_PASS];
#pragma unroll
        for (int k = 0; k < ROWS_PER_PASS; ++k) part[k] = 0.0f;
        for (int i = b * B + j; i < (b + 1) * B; i += 8) {
            float wv = dequant_elem(wr, TYPE, i);
#pragma unroll
            for (int k = 0; k < ROWS_PER_PASS; ++k)
                if (k < nr) part[k] = mul_add_unfused(part[k], (float)q[(size_t)(r0 + k) * in + i], wv);
        }
#pragma unroll
        for (int k = 0; k < ROWS_PER_PASS; ++k) {
            float a = combine_lanes(part[k]);
            if (k < nr) acc[k] = mul_add_unfused(acc[k], d[(size_t)(r0 + k) * nb + b], a);
        }
    }
#pragma unroll
    for (int k = 0; k < ROWS_PER_PASS; ++k)
        if (live && j == 0 && k < nr) y[(size_t)(r0 + k) * out + o] = acc[k];
}

extern "C" __global__ void matmul_q8_ordered(const u8* w, int type, const i8* q, const float* d,
                                             float* y, int rows, int in, int out) {
    switch (type) {
        case T_Q4_0: matmul_q8_ordered_body<T_Q4_0>(w, q, d, y, rows, in, out); break;
        case T_Q5_0: matmul_q8_ordered_body<T_Q5_0>(w, q, d, y, rows, in, out); break;
        case T_Q8_0: matmul_q8_ordered_body<T_Q8_0>(w, q, d, y, rows, in, out); break;
        case T_Q2_K: matmul_q8_ordered_body<T_Q2_K>(w, q, d, y, rows, in, out); break;
        case T_Q3_K: matmul_q8_ordered_body<T_Q3_K>(w, q, d, y, rows, in, out); break;
        case T_Q4_K: matmul_q8_ordered_body<T_Q4_K>(w, q, d, y, rows, in, out); break;
        case T_Q5_K: matmul_q8_ordered_body<T_Q5_K>(w, q, d, y, rows, in, out); break;
        case T_Q6_K: matmul_q8_ordered_body<T_Q6_K>(w, q, d, y, rows, in, out); break;
    }
}
