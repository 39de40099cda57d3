// The f32-activation matmul's core, shared by matmul.cu and fused.cu (both
// compiled with this file after common.cuh): one lane's partial sums over
// the elements i = j (mod 8) of a weight row, in increasing i, with unfused
// multiply-adds, and the lanes' combination. Every kernel built on these
// computes an output with the same chain of operations, so its bits do not
// depend on the kernel.

#define ROWS_PER_PASS 8
#define WARPS 4
#define OUTS_PER_WARP 4

// The four weights lane j (of eight) takes from 32-element block b:
// elements j, j+8, j+16, j+24, in that (increasing) order.
template <int TYPE>
__device__ __forceinline__ void block_weights(const u8* wr, int b, int j, float w[4]) {
    if (TYPE == T_Q4_1) {
        const u8* blk = wr + (size_t)b * 20;
        float d = f16_to_f32(load_u16(blk)), m = f16_to_f32(load_u16(blk + 2));
        int lo = blk[4 + j], hi = blk[4 + j + 8];
        w[0] = __fadd_rn(__fmul_rn((float)(lo & 0x0F), d), m);
        w[1] = __fadd_rn(__fmul_rn((float)(hi & 0x0F), d), m);
        w[2] = __fadd_rn(__fmul_rn((float)(lo >> 4), d), m);
        w[3] = __fadd_rn(__fmul_rn((float)(hi >> 4), d), m);
    } else if (TYPE == T_Q8_0) {
        const u8* blk = wr + (size_t)b * 34;
        float d = f16_to_f32(load_u16(blk));
        const i8* q = (const i8*)(blk + 2);
        for (int t = 0; t < 4; ++t) w[t] = (float)q[j + 8 * t] * d;
    } else if (TYPE == T_Q4_0) {
        const u8* blk = wr + (size_t)b * 18;
        float d = f16_to_f32(load_u16(blk));
        int lo = blk[2 + j], hi = blk[2 + j + 8];
        w[0] = (float)((lo & 0x0F) - 8) * d;
        w[1] = (float)((hi & 0x0F) - 8) * d;
        w[2] = (float)((lo >> 4) - 8) * d;
        w[3] = (float)((hi >> 4) - 8) * d;
    } else {
        for (int t = 0; t < 4; ++t) w[t] = dequant_elem(wr, TYPE, b * QK + j + 8 * t);
    }
}

// One pass over up to ROWS_PER_PASS rows; acc[k] is row r0 + k's partial sum
// of lane j. The row loop is unrolled with a guard so `acc` stays in
// registers (a runtime-indexed array would live in local memory).
// NR > 0 fixes the row count at compile time (NR = 1: decode): the row
// loop then holds only live rows. With NR = 0 it is the runtime `nr`, and
// every row's instructions are issued, predicated off past `nr`, which at
// one row is most of the work. The same operations either way.
template <int TYPE, int NR>
__device__ __forceinline__ void partial_sums(const u8* wr, const float* x, int r0, int nr,
                                             int in, int j, float acc[ROWS_PER_PASS]) {
    const int R = NR > 0 ? NR : ROWS_PER_PASS;
    if (block_size(TYPE) == QK) {
        int nb = in / QK;
        // Unrolled so that several blocks' loads are in flight at once: at
        // one row a warp has little else to hide their latency with.
#pragma unroll 6
        for (int b = 0; b < nb; ++b) {
            float w[4];
            block_weights<TYPE>(wr, b, j, w);
#pragma unroll
            for (int k = 0; k < R; ++k) {
                if (NR > 0 || k < nr) {
                    const float* xr = x + (size_t)(r0 + k) * in + b * QK + j;
#pragma unroll
                    for (int t = 0; t < 4; ++t) acc[k] = mul_add_unfused(acc[k], xr[8 * t], w[t]);
                }
            }
        }
    } else {
        for (int i = j; i < in; i += 8) {
            float wv = dequant_elem(wr, TYPE, i);
#pragma unroll
            for (int k = 0; k < R; ++k)
                if (NR > 0 || k < nr) acc[k] = mul_add_unfused(acc[k], x[(size_t)(r0 + k) * in + i], wv);
        }
    }
}

// The bytes of shared memory before the staged activations: the block's
// weight rows, rounded up to 16.
// partial_sums with the row count fixed at one where it is one.
template <int TYPE>
__device__ __forceinline__ void partial_sums_rows(const u8* wr, const float* x, int r0, int nr,
                                                  int in, int j, float acc[ROWS_PER_PASS]) {
    if (nr == 1) {
        partial_sums<TYPE, 1>(wr, x, r0, nr, in, j, acc);
    } else {
        partial_sums<TYPE, 0>(wr, x, r0, nr, in, j, acc);
    }
}

__device__ __forceinline__ size_t staged_x_offset(size_t row_bytes) {
    return ((size_t)WARPS * OUTS_PER_WARP * row_bytes + 15) & ~(size_t)15;
}

// The eight lanes' partial sums of one output combined as
// ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7)): lane j == 0 of each group of eight
// ends with the output (the CPU's 8-accumulator dot product).
__device__ __forceinline__ float combine_lanes(float a) {
    a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 4));  // a0+a4, a1+a5, ...
    a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 1));  // (a0+a4)+(a1+a5), ...
    a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 2));  // the two halves
    return a;
}
