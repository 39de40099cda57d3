// The fused launches of an unarmed single-sequence forward (decode's CUDA
// graph among them): a matmul that normalizes its own input and finishes
// with the op that follows it, so a layer is five launches instead of
// twelve. Every output is computed by the same chain of operations as the
// unfused kernels (`partial_sums` and `combine_lanes` from matmul_core.cuh,
// `norm_*`, `rope_rotate` and `swiglu_one` from common.cuh), so a fused
// forward gives the unfused one's bits. Its intermediate tensors (the
// norm's output, q/k/v before RoPE, gate and up) never reach global
// memory: an armed forward, whose taps need them, runs unfused.
//
// One block of WARPS warps computes FUSED_OUTS outputs (OUTS_PER_WARP per
// warp, eight lanes each) for up to ROWS_PER_PASS rows (one grid row per
// pass), with its weight rows and its input rows in shared memory.
//
// mode FUSED_PLAIN: y0 = x W0^T, or resid + x W0^T (the residual add).
// mode FUSED_SWIGLU: y0 = swiglu(x W0^T, x W1^T) (gate, up): each block
//   takes the same FUSED_OUTS / 2 rows of both.
// mode FUSED_QKV_ROPE: q = x W0^T into y0, k = x W1^T and v = x W2^T into
//   the caches y1, y2 at row pos[r] (width n1, n2); q and k rotated by
//   RoPE (interleaved pairs) first. Blocks [0, b0) take W0, then W1, W2.
//   With rope_cs, the rotation's cosines and sines come from that table
//   (`rope_table`'s, for these rows' positions) instead of being computed
//   in every block of every layer: the same f32 values, so the same bits.
// With norm_w, x is first RMS-normalized (weight norm_w, epsilon eps).
// Launched early (`ops::launch`), a block stages only its weights before
// `pdl_wait`; trigger_at says where it lets the next kernel start (0 at
// its start, 1 after the wait, 2 once its products are computed).

#define FUSED_PLAIN 0
#define FUSED_SWIGLU 1
#define FUSED_QKV_ROPE 2
#define FUSED_OUTS (WARPS * OUTS_PER_WARP)

__device__ __forceinline__ size_t row_bytes_of(int type, int in) {
    return (size_t)(in / block_size(type)) * type_size(type);
}

// One slot's output for the block's rows into res[k][slot]: lane j's
// partial sums, the lanes combined. Every lane of the warp calls it (the
// shuffles), a dead slot with `live` false.
template <int TYPE>
__device__ __forceinline__ void slot_outputs(const u8* wr, const float* xs, int nr, int in,
                                             int j, bool live, int slot,
                                             float res[ROWS_PER_PASS][FUSED_OUTS]) {
    float acc[ROWS_PER_PASS];
#pragma unroll
    for (int k = 0; k < ROWS_PER_PASS; ++k) acc[k] = 0.0f;
    if (live) partial_sums_rows<TYPE>(wr, xs, 0, nr, in, j, acc);
#pragma unroll
    for (int k = 0; k < ROWS_PER_PASS; ++k) {
        float a = combine_lanes(acc[k]);
        if (j == 0 && k < nr) res[k][slot] = a;
    }
}

__device__ void slot_outputs_any(int type, const u8* wr, const float* xs, int nr, int in, int j,
                                 bool live, int slot, float res[ROWS_PER_PASS][FUSED_OUTS]) {
    switch (type) {
        case T_F32: slot_outputs<T_F32>(wr, xs, nr, in, j, live, slot, res); break;
        case T_F16: slot_outputs<T_F16>(wr, xs, nr, in, j, live, slot, res); break;
        case T_BF16: slot_outputs<T_BF16>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q4_0: slot_outputs<T_Q4_0>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q4_1: slot_outputs<T_Q4_1>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q5_0: slot_outputs<T_Q5_0>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q8_0: slot_outputs<T_Q8_0>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q2_K: slot_outputs<T_Q2_K>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q3_K: slot_outputs<T_Q3_K>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q4_K: slot_outputs<T_Q4_K>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q5_K: slot_outputs<T_Q5_K>(wr, xs, nr, in, j, live, slot, res); break;
        case T_Q6_K: slot_outputs<T_Q6_K>(wr, xs, nr, in, j, live, slot, res); break;
    }
}

// Rows r0 .. r0 + nr of x into xs (shared), RMS-normalized with norm_w
// when it is given, exactly as the rms_norm kernel writes them. Ends with
// the block synchronized.
__device__ void stage_input(float* xs, const float* x, int r0, int nr, int in,
                            const float* norm_w, float eps, double* scratch) {
    stage_bytes((u8*)xs, (const u8*)(x + (size_t)r0 * in), (size_t)nr * in * 4);
    if (norm_w) {
        for (int k = 0; k < nr; ++k) {
            float* xr = xs + (size_t)k * in;
            // Synchronizes first (the staged rows visible) and after its
            // last read of xr: the row may then be rewritten in place.
            float scale = norm_scale(norm_sum_squares(xr, in, scratch), in, eps);
            for (int i = threadIdx.x; i < in; i += blockDim.x)
                xr[i] = norm_apply(xr[i], scale, norm_w[i]);
        }
    }
    __syncthreads();
}

extern "C" __global__ void matmul_fused(int mode, const u8* w0, const u8* w1, const u8* w2,
                                        int t0, int t1, int t2, int n0, int n1, int n2,
                                        const float* x, const float* norm_w, float eps,
                                        const float* resid, float* y0, float* y1, float* y2,
                                        const u32* pos, const float* rope_cs, int head_dim,
                                        float rope_base, int rows, int in, int staged,
                                        int trigger_at) {
    extern __shared__ __align__(16) u8 smem[];
    __shared__ double scratch[NORM_THREADS / 32];
    __shared__ float res[ROWS_PER_PASS][FUSED_OUTS];
    if (trigger_at == 0) pdl_launch_dependents();
    int lane = threadIdx.x & 31, j = lane & 7;
    int slot = (threadIdx.x >> 5) * OUTS_PER_WARP + (lane >> 3);
    int r0 = blockIdx.y * ROWS_PER_PASS;
    int nr = min(ROWS_PER_PASS, rows - r0);

    // The block's weight rows: `cnt` rows from row `first` of matrix A
    // (type ta), for slots [0, per); in FUSED_SWIGLU as many of matrix B
    // (type tb) for slots [per, 2 per).
    const u8 *wa = w0, *wb = w1;
    int ta = t0, tb = t1, per = FUSED_OUTS, region = 0, n = n0;
    if (mode == FUSED_SWIGLU) {
        per = FUSED_OUTS / 2;
    } else if (mode == FUSED_QKV_ROPE) {
        int b0 = (n0 + per - 1) / per, b1 = (n1 + per - 1) / per;
        int bx = blockIdx.x;
        if (bx >= b0 + b1) {
            region = 2, wa = w2, ta = t2, n = n2;
        } else if (bx >= b0) {
            region = 1, wa = w1, ta = t1, n = n1;
        }
    }
    int bx = blockIdx.x;
    if (region == 1) bx -= (n0 + per - 1) / per;
    if (region == 2) bx -= (n0 + per - 1) / per + (n1 + per - 1) / per;
    int first = bx * per;
    int cnt = min(per, n - first);
    size_t rba = row_bytes_of(ta, in);
    size_t rbb = mode == FUSED_SWIGLU ? row_bytes_of(tb, in) : 0;
    bool in_b = slot >= per;
    int s = in_b ? slot - per : slot;
    bool live = s < cnt;
    int type = in_b ? tb : ta;
    size_t rb = in_b ? rbb : rba;
    const u8* wr = (in_b ? wb : wa) + (size_t)(first + (live ? s : 0)) * rb;
    size_t bytes_a = (size_t)cnt * rba;
    size_t wbytes = bytes_a + (mode == FUSED_SWIGLU ? (size_t)cnt * rbb : 0);
    float* xs = (float*)(smem + (staged ? ((wbytes + 15) & ~(size_t)15) : 0));
    // The weights' copy runs while the input is staged and normalized,
    // and, launched early, while the kernel before this one finishes: the
    // weights are the only global memory read before `pdl_wait`.
    if (staged) {
        stage_bytes_async(smem, wa + (size_t)first * rba, bytes_a);
        if (mode == FUSED_SWIGLU)
            stage_bytes_async(smem + bytes_a, wb + (size_t)first * rbb, (size_t)cnt * rbb);
        wr = smem + (in_b ? bytes_a : 0) + (size_t)(live ? s : 0) * rb;
    }
    pdl_wait();
    if (trigger_at == 1) pdl_launch_dependents();
    stage_input(xs, x, r0, nr, in, norm_w, eps, scratch);
    copy_async_wait_all();
    __syncthreads();

    slot_outputs_any(type, wr, xs, nr, in, j, live, slot, res);
    if (trigger_at == 2) pdl_launch_dependents();
    __syncthreads();

    if (mode == FUSED_PLAIN) {
        for (int t = threadIdx.x; t < nr * per; t += blockDim.x) {
            int k = t / per, o = t % per;
            if (o >= cnt) continue;
            size_t at = (size_t)(r0 + k) * n0 + first + o;
            float a = res[k][o];
            // As the add kernel: one rounded add.
            y0[at] = resid ? resid[at] + a : a;
        }
    } else if (mode == FUSED_SWIGLU) {
        for (int t = threadIdx.x; t < nr * per; t += blockDim.x) {
            int k = t / per, o = t % per;
            if (o >= cnt) continue;
            y0[(size_t)(r0 + k) * n0 + first + o] = swiglu_one(res[k][o], res[k][o + per]);
        }
    } else {
        int pairs = per / 2;
        for (int t = threadIdx.x; t < nr * pairs; t += blockDim.x) {
            int k = t / pairs, o = 2 * (t % pairs);
            if (o >= cnt) continue;
            u32 p = pos[r0 + k];
            float a = res[k][o], b = res[k][o + 1];
            int col = first + o;
            if (region < 2) {
                int i = (col % head_dim) / 2;
                if (rope_cs) {
                    const float* cs = rope_cs + 2 * ((size_t)(r0 + k) * (head_dim / 2) + i);
                    rope_apply(&a, &b, cs[0], cs[1]);
                } else {
                    rope_rotate(&a, &b, p, i, head_dim, rope_base);
                }
            }
            float* dst = region == 0 ? y0 + (size_t)(r0 + k) * n0
                                     : (region == 1 ? y1 : y2) + (size_t)p * n;
            dst[col] = a;
            dst[col + 1] = b;
        }
    }
}

// The logits' matmul: FUSED_PLAIN without a residual (y0 = norm(x) W0^T),
// each output by the same chain of operations as matmul_fused's, so the
// same bits, from a grid of a few blocks per SM instead of one block per
// FUSED_OUTS outputs (3,072 blocks, two waves and the norm computed 3,072
// times for a 49,152-word vocabulary). A block normalizes its rows once,
// then takes groups of FUSED_OUTS weight rows g = blockIdx.x, g +
// gridDim.x, ... through `stages` shared-memory buffers (2 to 4): the
// copies of the next stages - 1 groups run under the current group's
// products. Only weights are read before `pdl_wait`.
__device__ __forceinline__ void stage_group(u8* dst, const u8* w, int g, int groups, int n,
                                            size_t rb) {
    if (g < groups)
        stage_bytes_async(dst, w + (size_t)g * FUSED_OUTS * rb,
                          (size_t)min(FUSED_OUTS, n - g * FUSED_OUTS) * rb);
    // Empty groups too, so that group `it` is always the it-th committed.
    copy_async_commit();
}

extern "C" __global__ void matmul_streamed(const u8* w, int type, int n, const float* x,
                                           const float* norm_w, float eps, float* y, int rows,
                                           int in, int stages, int trigger_at) {
    extern __shared__ __align__(16) u8 smem[];
    __shared__ double scratch[NORM_THREADS / 32];
    __shared__ float res[ROWS_PER_PASS][FUSED_OUTS];
    if (trigger_at == 0) pdl_launch_dependents();
    int lane = threadIdx.x & 31, j = lane & 7;
    int slot = (threadIdx.x >> 5) * OUTS_PER_WARP + (lane >> 3);
    int r0 = blockIdx.y * ROWS_PER_PASS;
    int nr = min(ROWS_PER_PASS, rows - r0);
    size_t rb = row_bytes_of(type, in);
    size_t buf = ((size_t)FUSED_OUTS * rb + 15) & ~(size_t)15;
    float* xs = (float*)(smem + stages * buf);
    int groups = (n + FUSED_OUTS - 1) / FUSED_OUTS;
    for (int s = 0; s < stages - 1; ++s)
        stage_group(smem + s * buf, w, blockIdx.x + s * gridDim.x, groups, n, rb);
    pdl_wait();
    if (trigger_at == 1) pdl_launch_dependents();
    stage_input(xs, x, r0, nr, in, norm_w, eps, scratch);
    int it = 0;
    for (int g = blockIdx.x; g < groups; g += gridDim.x, ++it) {
        // This group's copy done and every thread past the products of the
        // group before, whose buffer the next copy reuses.
        copy_async_wait_groups(stages - 2);
        __syncthreads();
        stage_group(smem + ((it + stages - 1) % stages) * buf, w,
                    g + (stages - 1) * gridDim.x, groups, n, rb);
        int first = g * FUSED_OUTS, cnt = min(FUSED_OUTS, n - first);
        bool live = slot < cnt;
        const u8* wr = smem + (it % stages) * buf + (size_t)(live ? slot : 0) * rb;
        slot_outputs_any(type, wr, xs, nr, in, j, live, slot, res);
        // res[k][slot] was written by this very lane (j == 0).
        if (j == 0 && live)
            for (int k = 0; k < nr; ++k) y[(size_t)(r0 + k) * n + first + slot] = res[k][slot];
    }
    copy_async_wait_groups(0);
    if (trigger_at == 2) pdl_launch_dependents();
}

// RoPE's cosines and sines for `rows` rows at positions pos[r], head_dim / 2
// pairs each: cs[2 (r half + i)] and cs[2 (r half + i) + 1], as
// `rope_cos_sin` gives them. One launch per forward serves every layer that
// rotates with `base`.
extern "C" __global__ void rope_table(const u32* pos, float* cs, int rows, int head_dim,
                                      float base) {
    int half = head_dim / 2;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < rows * half; t += gridDim.x * blockDim.x) {
        int r = t / half, i = t % half;
        rope_cos_sin(pos[r], i, head_dim, base, cs + 2 * (size_t)t, cs + 2 * (size_t)t + 1);
    }
}
