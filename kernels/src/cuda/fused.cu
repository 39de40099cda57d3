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
// the block synchronized. The norm weights of this thread's first
// NORM_EARLY elements are loaded before the rows' sums of squares, so
// that their latency is not added after them.
#define NORM_EARLY 8
__device__ void stage_input(float* xs, const float* x, int r0, int nr, int in,
                            const float* norm_w, float eps, double* scratch) {
    float nw[NORM_EARLY];
    if (norm_w) {
#pragma unroll
        for (int u = 0; u < NORM_EARLY; ++u) {
            int i = threadIdx.x + u * blockDim.x;
            nw[u] = i < in ? norm_w[i] : 0.0f;
        }
    }
    stage_bytes((u8*)xs, (const u8*)(x + (size_t)r0 * in), (size_t)nr * in * 4);
    if (norm_w) {
        for (int k = 0; k < nr; ++k) {
            float* xr = xs + (size_t)k * in;
            // Synchronizes first (the staged rows visible) and after its
            // last read of xr: the row may then be rewritten in place.
            float scale = norm_scale(norm_sum_squares(xr, in, scratch), in, eps);
            int u = 0;
#pragma unroll
            for (; u < NORM_EARLY; ++u) {
                int i = threadIdx.x + u * blockDim.x;
                if (i < in) xr[i] = norm_apply(xr[i], scale, nw[u]);
            }
            for (int i = threadIdx.x + NORM_EARLY * blockDim.x; i < in; i += blockDim.x)
                xr[i] = norm_apply(xr[i], scale, norm_w[i]);
        }
    }
    __syncthreads();
}

// A matmul_fused launch's arguments, as the kernel takes them (the
// persistent decode, decode.cu, fills one per matmul of a layer).
struct FusedArgs {
    int mode;
    const u8 *w0, *w1, *w2;
    int t0, t1, t2, n0, n1, n2;
    const float* x;
    const float* norm_w;
    float eps;
    const float* resid;
    float *y0, *y1, *y2;
    const u32* pos;
    const float* rope_cs;
    int head_dim;
    float rope_base;
    int rows, in;
};

// Which weight rows block `bx` of a matmul_fused launch takes: `cnt` rows
// from row `first` of matrix A (type ta), for slots [0, per); in
// FUSED_SWIGLU as many of matrix B for slots [per, 2 per). And this
// thread's slot: its row `wr` in global memory, or at `wr_off` in the
// block's staged copy of its rows (`bytes_a` of A, then B's).
struct FusedPlan {
    const u8 *wa, *wb;
    size_t rba, rbb, bytes_a, wbytes, rb, wr_off;
    const u8* wr;
    int first, cnt, per, region, n, type, slot, j, ta, tb;
    bool live;
};

__device__ FusedPlan fused_plan(const FusedArgs& a, int bx) {
    FusedPlan p;
    int lane = threadIdx.x & 31;
    p.j = lane & 7;
    p.slot = (threadIdx.x >> 5) * OUTS_PER_WARP + (lane >> 3);
    p.wa = a.w0, p.wb = a.w1;
    int ta = a.t0, tb = a.t1;
    p.per = FUSED_OUTS, p.region = 0, p.n = a.n0;
    if (a.mode == FUSED_SWIGLU) {
        p.per = FUSED_OUTS / 2;
    } else if (a.mode == FUSED_QKV_ROPE) {
        int b0 = (a.n0 + p.per - 1) / p.per, b1 = (a.n1 + p.per - 1) / p.per;
        if (bx >= b0 + b1) {
            p.region = 2, p.wa = a.w2, ta = a.t2, p.n = a.n2;
        } else if (bx >= b0) {
            p.region = 1, p.wa = a.w1, ta = a.t1, p.n = a.n1;
        }
    }
    if (p.region == 1) bx -= (a.n0 + p.per - 1) / p.per;
    if (p.region == 2) bx -= (a.n0 + p.per - 1) / p.per + (a.n1 + p.per - 1) / p.per;
    p.first = bx * p.per;
    p.cnt = min(p.per, p.n - p.first);
    p.ta = ta, p.tb = tb;
    p.rba = row_bytes_of(ta, a.in);
    p.rbb = a.mode == FUSED_SWIGLU ? row_bytes_of(tb, a.in) : 0;
    bool in_b = p.slot >= p.per;
    int s = in_b ? p.slot - p.per : p.slot;
    p.live = s < p.cnt;
    p.type = in_b ? tb : ta;
    p.rb = in_b ? p.rbb : p.rba;
    p.wr = (in_b ? p.wb : p.wa) + (size_t)(p.first + (p.live ? s : 0)) * p.rb;
    p.bytes_a = (size_t)p.cnt * p.rba;
    p.wbytes = p.bytes_a + (a.mode == FUSED_SWIGLU ? (size_t)p.cnt * p.rbb : 0);
    p.wr_off = (in_b ? p.bytes_a : 0) + (size_t)(p.live ? s : 0) * p.rb;
    return p;
}

// The copy of the block's weight rows into `dst`, issued (cp.async where
// aligned); it completes at the caller's wait.
__device__ void fused_stage_weights(const FusedArgs& a, const FusedPlan& p, u8* dst) {
    stage_bytes_async(dst, p.wa + (size_t)p.first * p.rba, p.bytes_a);
    if (a.mode == FUSED_SWIGLU)
        stage_bytes_async(dst + p.bytes_a, p.wb + (size_t)p.first * p.rbb, (size_t)p.cnt * p.rbb);
}

// The RoPE table's cosine and sine for output column `col` of row `r`.
__device__ __forceinline__ const float* rope_pair(const FusedArgs& a, int r, int col) {
    return a.rope_cs + 2 * ((size_t)r * (a.head_dim / 2) + (col % a.head_dim) / 2);
}

// The dequantized staging (matmul_fused's `staged` 2, one row only): the
// block's weight rows, once their copy has landed, dequantized into shared
// memory before `pdl_wait` (so, launched early, while the kernel before
// still runs), each element the f32 value `block_weights` or
// `dequant_elem` gives the products, laid out for the lanes: slot s's
// element i = 8k + j (lane j's k-th) at deq[(8 s + j) L + k], L = in / 8 +
// 4 (the 4 puts the eight lanes' 16-byte loads on distinct banks). The
// input row is laid out the same way (`xp`). A lane's products then read
// four weights and four inputs a load, in the order of `partial_sums`
// (i = j, j + 8, ...: k increasing), so every output keeps its bits; what
// leaves the critical path is the weights' decoding (a generic byte load,
// a convert, a multiply and an add per element).
__device__ __forceinline__ int deq_stride(int in) { return in / 8 + 4; }

// Where slot s's lane j keeps its k-th weight.
template <typename F>
__device__ __forceinline__ F* deq_at(F* deq, int s, int j, int k, int L) {
    return deq + (size_t)(8 * s + j) * L + k;
}

template <int TYPE>
__device__ __forceinline__ void deq_blocks(float* deq, const u8* row, int s, int nb, int L) {
    // Item (b, j) of slot s: lane j's four weights of block b, k = 4b .. 4b + 3.
    for (int it = threadIdx.x; it < nb * 8; it += blockDim.x) {
        int b = it >> 3, j = it & 7;
        float w[4];
        block_weights<TYPE>(row, b, j, w);
        f32x4 v;
        v.x = w[0], v.y = w[1], v.z = w[2], v.w = w[3];
        *(f32x4*)deq_at(deq, s, j, 4 * b, L) = v;
    }
}

__device__ void fused_dequant(const FusedArgs& a, const FusedPlan& p, const u8* staged,
                              float* deq) {
    int L = deq_stride(a.in), nb = a.in / QK;
    for (int s = 0; s < FUSED_OUTS; ++s) {
        bool in_b = s >= p.per;
        int r = in_b ? s - p.per : s;
        if (r >= p.cnt) continue;
        int type = in_b ? p.tb : p.ta;
        const u8* row = staged + (in_b ? p.bytes_a : 0) + (size_t)r * (in_b ? p.rbb : p.rba);
        switch (type) {
            case T_Q4_1: deq_blocks<T_Q4_1>(deq, row, s, nb, L); break;
            case T_Q8_0: deq_blocks<T_Q8_0>(deq, row, s, nb, L); break;
            case T_Q4_0: deq_blocks<T_Q4_0>(deq, row, s, nb, L); break;
            case T_Q5_0: deq_blocks<T_Q5_0>(deq, row, s, nb, L); break;
            default:
                // K-quants and floats: element by element, as the products'
                // own loop decodes them (`dequant_elem`).
                for (int i = threadIdx.x; i < a.in; i += blockDim.x)
                    *deq_at(deq, s, i & 7, i >> 3, L) = dequant_elem(row, type, i);
        }
    }
}

// One row's output of this thread's slot from the dequantized weights:
// lane j's sum over k in order, then the lanes combined.
__device__ __forceinline__ void deq_outputs(const float* xp, const float* deq, int in,
                                            const FusedPlan& p,
                                            float res[ROWS_PER_PASS][FUSED_OUTS]) {
    int L = deq_stride(in);
    float acc = 0.0f;
    if (p.live) {
        const float* xr = xp + (size_t)p.j * L;
        const float* wr = deq_at(deq, p.slot, p.j, 0, L);
#pragma unroll 4
        for (int k = 0; k < in / 8; k += 4) {
            f32x4 x = *(const f32x4*)(xr + k), w = *(const f32x4*)(wr + k);
            acc = mul_add_unfused(acc, x.x, w.x);
            acc = mul_add_unfused(acc, x.y, w.y);
            acc = mul_add_unfused(acc, x.z, w.z);
            acc = mul_add_unfused(acc, x.w, w.w);
        }
    }
    float r = combine_lanes(acc);
    if (p.j == 0) res[0][p.slot] = r;
}

// Everything after the input is readable: rows [r0, r0 + nr) of x staged
// into xs (normalized where asked), the weights' copies waited for (all of
// them with `keep` < 0, else all but the last `keep` committed groups),
// the products of this thread's slot from row `wr`, and the block's
// outputs written in its mode.
__device__ void fused_outputs(const FusedArgs& a, const FusedPlan& p, const u8* wr, float* xs,
                              int r0, double* scratch, float res[ROWS_PER_PASS][FUSED_OUTS],
                              int keep, int trigger_at, const float* deq = nullptr) {
    int nr = min(ROWS_PER_PASS, a.rows - r0);
    int per = p.per, cnt = p.cnt, first = p.first, pairs = per / 2;
    // What this thread's first element of the epilogue (t = threadIdx.x)
    // reads besides the products: its residual, or its row's position and
    // RoPE pair, loaded now, under the input's staging, rather than after
    // the products.
    float early_resid = 0.0f, early_c = 0.0f, early_s = 0.0f;
    u32 early_pos = 0;
    int t0 = threadIdx.x;
    if (a.mode == FUSED_PLAIN && a.resid && t0 < nr * per && t0 % per < cnt) {
        early_resid = a.resid[(size_t)(r0 + t0 / per) * a.n0 + first + t0 % per];
    } else if (a.mode == FUSED_QKV_ROPE && t0 < nr * pairs && 2 * (t0 % pairs) < cnt) {
        int k = t0 / pairs, col = first + 2 * (t0 % pairs);
        early_pos = a.pos[r0 + k];
        if (p.region < 2 && a.rope_cs) {
            const float* cs = rope_pair(a, r0 + k, col);
            early_c = cs[0], early_s = cs[1];
        }
    }
    stage_input(xs, a.x, r0, nr, a.in, a.norm_w, a.eps, scratch);
    if (keep < 0) {
        copy_async_wait_all();
    } else {
        copy_async_wait_groups(keep);
    }
    __syncthreads();

    if (deq) {
        // One row (the launcher's rule): laid out as the weights are.
        float* xp = xs + a.in;
        int L = deq_stride(a.in);
        for (int i = threadIdx.x; i < a.in; i += blockDim.x) xp[(i & 7) * L + (i >> 3)] = xs[i];
        __syncthreads();
        deq_outputs(xp, deq, a.in, p, res);
    } else {
        slot_outputs_any(p.type, wr, xs, nr, a.in, p.j, p.live, p.slot, res);
    }
    if (trigger_at == 2) pdl_launch_dependents();
    __syncthreads();

    if (a.mode == FUSED_PLAIN) {
        for (int t = threadIdx.x; t < nr * per; t += blockDim.x) {
            int k = t / per, o = t % per;
            if (o >= cnt) continue;
            size_t at = (size_t)(r0 + k) * a.n0 + first + o;
            float v = res[k][o];
            // As the add kernel: one rounded add.
            if (a.resid) v = (t == t0 ? early_resid : a.resid[at]) + v;
            a.y0[at] = v;
        }
    } else if (a.mode == FUSED_SWIGLU) {
        for (int t = threadIdx.x; t < nr * per; t += blockDim.x) {
            int k = t / per, o = t % per;
            if (o >= cnt) continue;
            a.y0[(size_t)(r0 + k) * a.n0 + first + o] = swiglu_one(res[k][o], res[k][o + per]);
        }
    } else {
        for (int t = threadIdx.x; t < nr * pairs; t += blockDim.x) {
            int k = t / pairs, o = 2 * (t % pairs);
            if (o >= cnt) continue;
            u32 ps = t == t0 ? early_pos : a.pos[r0 + k];
            float x0 = res[k][o], x1 = res[k][o + 1];
            int col = first + o;
            if (p.region < 2 && a.rope_cs) {
                float c = early_c, sn = early_s;
                if (t != t0) {
                    const float* cs = rope_pair(a, r0 + k, col);
                    c = cs[0], sn = cs[1];
                }
                rope_apply(&x0, &x1, c, sn);
            } else if (p.region < 2) {
                rope_rotate(&x0, &x1, ps, (col % a.head_dim) / 2, a.head_dim, a.rope_base);
            }
            float* dst = p.region == 0 ? a.y0 + (size_t)(r0 + k) * a.n0
                                       : (p.region == 1 ? a.y1 : a.y2) + (size_t)ps * p.n;
            dst[col] = x0;
            dst[col + 1] = x1;
        }
    }
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
    FusedArgs a = {mode, w0, w1, w2, t0, t1, t2, n0, n1, n2, x, norm_w, eps, resid,
                   y0, y1, y2, pos, rope_cs, head_dim, rope_base, rows, in};
    FusedPlan p = fused_plan(a, blockIdx.x);
    float* xs = (float*)(smem + (staged ? ((p.wbytes + 15) & ~(size_t)15) : 0));
    float* deq = nullptr;
    if (staged == 2) {
        deq = xs;
        xs = deq + (size_t)FUSED_OUTS * 8 * deq_stride(in);
    }
    const u8* wr = p.wr;
    // The weights' copy runs while the input is staged and normalized,
    // and, launched early, while the kernel before this one finishes: the
    // weights are the only global memory read before `pdl_wait`. Staged
    // dequantized (2), they are also decoded before it.
    if (staged) {
        fused_stage_weights(a, p, smem);
        wr = smem + p.wr_off;
    }
    if (deq) {
        copy_async_wait_all();
        __syncthreads();
        fused_dequant(a, p, smem, deq);
    }
    pdl_wait();
    if (trigger_at == 1) pdl_launch_dependents();
    fused_outputs(a, p, wr, xs, blockIdx.y * ROWS_PER_PASS, scratch, res, -1, trigger_at, deq);
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

// A group's outputs, res[k][s] for its cnt weight rows and nr input rows,
// stored by consecutive threads into consecutive logits: a row's 16 floats
// in one 64-byte store, which matters where y is page-locked host memory
// (the mapped decode step, forward/graph.rs).
__device__ __forceinline__ void store_group(float* y, float res[ROWS_PER_PASS][FUSED_OUTS],
                                            int r0, int nr, int n, int first, int cnt) {
    for (int t = threadIdx.x; t < nr * cnt; t += blockDim.x) {
        int k = t / cnt, s = t % cnt;
        y[(size_t)(r0 + k) * n + first + s] = res[k][s];
    }
}

extern "C" __global__ void matmul_streamed(const u8* w, int type, int n, const float* x,
                                           const float* norm_w, float eps, float* y, int rows,
                                           int in, int stages, int trigger_at) {
    extern __shared__ __align__(16) u8 smem[];
    __shared__ double scratch[NORM_THREADS / 32];
    // Two groups' outputs: one group's are stored while the next one's
    // products are computed.
    __shared__ float res[2][ROWS_PER_PASS][FUSED_OUTS];
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
    int it = 0, last_first = 0, last_cnt = 0;
    for (int g = blockIdx.x; g < groups; g += gridDim.x, ++it) {
        // This group's copy done, and every thread past the products of the
        // group before: its buffer the next copy reuses, its outputs
        // complete in res.
        copy_async_wait_groups(stages - 2);
        __syncthreads();
        if (it > 0) store_group(y, res[(it - 1) & 1], r0, nr, n, last_first, last_cnt);
        stage_group(smem + ((it + stages - 1) % stages) * buf, w,
                    g + (stages - 1) * gridDim.x, groups, n, rb);
        int first = g * FUSED_OUTS, cnt = min(FUSED_OUTS, n - first);
        bool live = slot < cnt;
        const u8* wr = smem + (it % stages) * buf + (size_t)(live ? slot : 0) * rb;
        // res[it & 1] was last read by the stores of two groups ago, which
        // every thread finished before the barrier above.
        slot_outputs_any(type, wr, xs, nr, in, j, live, slot, res[it & 1]);
        last_first = first;
        last_cnt = cnt;
    }
    __syncthreads();
    if (it > 0) store_group(y, res[(it - 1) & 1], r0, nr, n, last_first, last_cnt);
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

// The first launch of a mapped decode step (forward/graph.rs; one block):
// the step's token and position read from page-locked host memory (in[0],
// in[1], written by the host before the graph's launch), the position
// stored to pos[0] for the step's later launches, the token's embedding
// row dequantized into x as `embedding` does and, with cs, RoPE's table at
// that position as `rope_table` computes it: the same values those
// launches give from the uploaded token and position. Launched early in a
// chained step, where the step before wrote in[]: it waits first. It never
// lets the next launch start early: the split attention reads pos[0]
// before its own wait (to stage the earlier positions' keys), so pos[0]
// must be written before any later launch of the step starts.
extern "C" __global__ void step_start(const u32* in, u32* pos, const u8* table, int type,
                                      int n_embd, float* x, float* cs, int head_dim,
                                      float base) {
    __shared__ u32 step[2];
    pdl_wait();
    if (threadIdx.x < 2) step[threadIdx.x] = ((const volatile u32*)in)[threadIdx.x];
    __syncthreads();
    u32 tok = step[0], p = step[1];
    if (threadIdx.x == 0) pos[0] = p;
    const u8* row = table + (size_t)tok * row_bytes_of(type, n_embd);
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) x[i] = dequant_elem(row, type, i);
    if (cs)
        for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x)
            rope_cos_sin(p, i, head_dim, base, cs + 2 * i, cs + 2 * i + 1);
}

// The greedy end of a chained decode step (forward/chain.rs; one block of
// STEP_NEXT_THREADS threads): the index of the largest of the n logits, the
// first on ties and NaN never winning, 0 where none exceeds -inf (as
// generate::argmax picks it), stored as the next step's token in[0] with
// its position in[1] + 1, and into toks[in[1]] (page-locked host memory,
// where the host reads each step's token). Launched early: it reads the
// logits after `pdl_wait`, and lets the next step's first launch start.
#define STEP_NEXT_THREADS 1024
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The warp's best (value, index) pair into every lane: the larger value,
// the lower index between equals.
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, bv, o);
        int i = __shfl_xor_sync(0xffffffffu, bi, o);
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
}

extern "C" __global__ void step_next(const float* logits, int n, u32* in, u32* toks) {
    __shared__ float vs[STEP_NEXT_THREADS / 32];
    __shared__ int is[STEP_NEXT_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();
    // Each thread's first largest over its indices in increasing order: a
    // strict > keeps the first of equals and lets no NaN in (n: none yet).
    float bv = -__int_as_float(0x7f800000);
    int bi = n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = logits[i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
    // Then the warp's, then the block's.
    warp_best(bv, bi);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        vs[warp] = bv;
        is[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        int warps = blockDim.x >> 5;
        bv = lane < warps ? vs[lane] : -__int_as_float(0x7f800000);
        bi = lane < warps ? is[lane] : n;
        warp_best(bv, bi);
        if (lane == 0) {
            u32 tok = bi == n ? 0u : (u32)bi;
            u32 p = in[1];
            in[0] = tok;
            in[1] = p + 1;
            ((volatile u32*)toks)[p] = tok;
        }
    }
}
