// Causal grouped-query attention over one sequence's KV cache:
// softmax(q k^T / sqrt(head_dim)) v, before o_proj.
//
// q: [rows, n_head * head_dim], row r at position pos0 + r, pos0 read from
// the device (`pos[0]`, the group's first position: a CUDA graph replays the
// launch at every step);
// k, v: the sequence's cache for this layer, [ctx, n_kv * head_dim], already
// holding positions 0..=pos0 + rows - 1. Query head h reads KV head
// h / (n_head / n_kv). One block per (row, head); the scores of one row live
// in dynamic shared memory (pos + 1 floats). `window` > 0 (sliding-window
// attention) lets row r see only positions pos0 + r + 1 - window ..= pos0 + r.
//
// Every sum runs in the CPU op's order (a key's dot product over dimensions,
// the softmax denominator over keys, the output over keys), so the kernel
// differs from the CPU only where exp does.

// Floats after each key staged in shared memory: a warp's threads read
// one key each, four dimensions a load, and rows 4 banks apart put eight
// threads' 16-byte loads (one pass of the load) on distinct banks, where
// rows of a head's width would put them all on the same four.
#define KEY_PAD 4

// One key's dot product with the query over a head of HD (a compile-time
// width) dimensions, four per load: with the trip count known, every load
// of the key is issued before the first product (a runtime width makes
// each wait for the one before). The sum runs over d in order, as below.
template <int HD>
__device__ __forceinline__ float key_dot(const float* qh, const float* kj) {
    float s = 0.0f;
#pragma unroll
    for (int d = 0; d < HD; d += 4) {
        f32x4 a = *(const f32x4*)(qh + d), b = *(const f32x4*)(kj + d);
        s = mul_add_unfused(s, a.x, b.x);
        s = mul_add_unfused(s, a.y, b.y);
        s = mul_add_unfused(s, a.z, b.z);
        s = mul_add_unfused(s, a.w, b.w);
    }
    return s;
}

// The scores of query row `qh` against keys [first, first + n_keys) of KV
// head `kvh`, softmaxed in place: scores[j] = exp(s_j - max), and the
// return value 1 / sum_j scores[j], the sum over j in order by one thread.
// Keys j < n_staged are read from ks (rows of head_dim + KEY_PAD floats,
// staged by the caller and visible to every thread), the rest from k: the
// same values.
// Every thread of the block calls it; it ends with the block synchronized.
__device__ __forceinline__ float scores_softmax(const float* qh, const float* k, int first,
                                                int n_keys, int kvh, int head_dim, int kv_stride,
                                                float scale, float* scores, float* scratch,
                                                float* inv_sum, const float* ks, int n_staged) {
    // Four dimensions per load where the layout allows: one key's 64 loads
    // otherwise wait out 4 memory latencies even unrolled. The sum still
    // runs over d in order.
    bool vec = head_dim % 4 == 0 && kv_stride % 4 == 0 && (((size_t)k | (size_t)qh) & 15) == 0;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        const float* kj = j < n_staged ? ks + (size_t)j * (head_dim + KEY_PAD)
                                       : k + (size_t)(first + j) * kv_stride + kvh * head_dim;
        float s = 0.0f;
        if (vec && head_dim == 64) {
            s = key_dot<64>(qh, kj);
        } else if (vec && head_dim == 128) {
            s = key_dot<128>(qh, kj);
        } else if (vec) {
#pragma unroll 16
            for (int d = 0; d < head_dim; d += 4) {
                f32x4 a = *(const f32x4*)(qh + d), b = *(const f32x4*)(kj + d);
                s = mul_add_unfused(s, a.x, b.x);
                s = mul_add_unfused(s, a.y, b.y);
                s = mul_add_unfused(s, a.z, b.z);
                s = mul_add_unfused(s, a.w, b.w);
            }
        } else {
#pragma unroll 16
            for (int d = 0; d < head_dim; ++d) s = mul_add_unfused(s, qh[d], kj[d]);
        }
        scores[j] = __fmul_rn(s, scale);
    }
    __syncthreads();

    float m = __int_as_float(0xff800000);  // -inf; no math header under NVRTC
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) m = fmaxf(m, scores[j]);
    m = block_max(m, scratch);
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) scores[j] = exp_f32(__fsub_rn(scores[j], m));
    __syncthreads();
    if (threadIdx.x == 0) {
        // Four scores per load where they are 16-byte aligned; the adds
        // still run over j in order.
        float sum = 0.0f;
        int j = 0;
        if ((((size_t)scores) & 15) == 0) {
#pragma unroll 4
            for (; j + 4 <= n_keys; j += 4) {
                f32x4 e = *(const f32x4*)(scores + j);
                sum = __fadd_rn(sum, e.x);
                sum = __fadd_rn(sum, e.y);
                sum = __fadd_rn(sum, e.z);
                sum = __fadd_rn(sum, e.w);
            }
        }
        for (; j < n_keys; ++j) sum = __fadd_rn(sum, scores[j]);
        *inv_sum = 1.0f / sum;
    }
    __syncthreads();
    return *inv_sum;
}

// Row r's visible keys [first, first + n_keys).
__device__ __forceinline__ void visible_keys(int pos0, int r, int window, int* first, int* n_keys) {
    // A window (> 0) keeps the last `window` positions: keys [first, seen).
    int seen = pos0 + r + 1;
    *first = window > 0 && seen > window ? seen - window : 0;
    *n_keys = seen - *first;
}

extern "C" __global__ void attention(const float* q, const float* k, const float* v,
                                     float* out, const u32* pos, int n_head, int n_kv,
                                     int head_dim, float scale, int window) {
    extern __shared__ float scores[];
    __shared__ float scratch[32];
    __shared__ float inv_sum;
    int r = blockIdx.x, h = blockIdx.y;
    int first, n_keys;
    visible_keys((int)pos[0], r, window, &first, &n_keys);
    int kvh = h / (n_head / n_kv);
    int kv_stride = n_kv * head_dim;
    const float* qh = q + (size_t)r * n_head * head_dim + h * head_dim;
    float inv = scores_softmax(qh, k, first, n_keys, kvh, head_dim, kv_stride, scale, scores,
                               scratch, &inv_sum, nullptr, 0);

    float* oh = out + (size_t)r * n_head * head_dim + h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        // Unrolled by 32: 32 keys' values in flight at once.
#pragma unroll 32
        for (int j = 0; j < n_keys; ++j)
            acc = mul_add_unfused(acc, __fmul_rn(scores[j], inv), v[(size_t)(first + j) * kv_stride + kvh * head_dim + d]);
        oh[d] = acc;
    }
}

// Rows [c0, c0 + n) of v's columns [col, col + ds) (a KV head's values or
// keys) into vs, a row every `row` floats, by cp.async where the
// architecture has it: the copy runs while the block goes on. 16-byte
// pieces (the caller checks the alignment).
__device__ __forceinline__ void stage_rows(float* vs, const float* v, int c0, int n, int ds,
                                           int row, int kv_stride, int col) {
    int per_key = ds / 4;
    for (int t = threadIdx.x; t < n * per_key; t += blockDim.x) {
        int j = t / per_key, e = 4 * (t % per_key);
        copy16_async(vs + (size_t)j * row + e, v + (size_t)(c0 + j) * kv_stride + col + e);
    }
}

// Rows [c0, c0 + n) of the values' dimensions of KV head kvh at col into
// vs ([n, ds]).
__device__ __forceinline__ void stage_values(float* vs, const float* v, int c0, int n, int ds,
                                             int kv_stride, int col) {
    stage_rows(vs, v, c0, n, ds, ds, kv_stride, col);
}

// `attention` split over more blocks, for the forwards whose every launch is
// at one or a few rows (the fused pass): block (r, h, z) writes dimensions
// [z ds, (z + 1) ds) of row r's head h. Each block computes the head's
// scores and softmax as `attention` does (the same code, so the same bits)
// and sums its dimensions' outputs over the keys in the same order, the
// values read from shared memory, staged `chunk` keys at a time; the
// first chunk's copy is issued before the scores and runs under them.
// Before anything, the blocks ask L2 for `pf` (the weights of the launches
// that follow); launched early, they then copy what earlier forwards wrote
// before they wait (`attention_split_block`).
// Dynamic shared memory: the scores (max_keys floats), then chunk * ds
// floats of values (16-byte aligned: max_keys rounded up to 4 by the
// caller), then key_cap rows of head_dim + KEY_PAD floats of keys.
#define PREFETCH_RANGES 4
// Byte ranges of global memory for the L2 cache to fetch (unused: 0 bytes).
struct Prefetch {
    const u8* ptr[PREFETCH_RANGES];
    unsigned long long bytes[PREFETCH_RANGES];
};

// The block's share of `pf`, one 128-byte line per instruction, spread
// over every block of the grid: the loads are fire and forget, so the
// block goes on at once, and the launches after this one (the layer's
// matmuls, whose weights these are) find them in L2. Moves no value.
__device__ __forceinline__ void prefetch_l2(const Prefetch& pf) {
    size_t blocks = (size_t)gridDim.x * gridDim.y * gridDim.z;
    size_t b = blockIdx.x + (size_t)gridDim.x * (blockIdx.y + (size_t)gridDim.y * blockIdx.z);
    for (int r = 0; r < PREFETCH_RANGES; ++r) {
        size_t lines = (pf.bytes[r] + 127) / 128;
        for (size_t t = b * blockDim.x + threadIdx.x; t < lines; t += blocks * blockDim.x)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(pf.ptr[r] + t * 128));
    }
}

// An attention_split launch's arguments past the prefetch (the persistent
// decode, decode.cu, fills one per layer). key_cap: the most keys a block
// stages in shared memory before `pdl_wait` (0: none).
struct SplitArgs {
    const float *q, *k, *v;
    float* out;
    const u32* pos;
    int n_head, n_kv, head_dim;
    float scale;
    int window, ds, chunk, max_keys, key_cap;
};

// Block (r, h, z) of attention_split: the head's scores and softmax, then
// dimensions [z ds, (z + 1) ds) of the output. `smem_f` is the launch's
// dynamic shared memory; `trigger_at` as the kernel's (-1: never).
//
// With `wait` the block itself calls `pdl_wait`, and first stages what
// earlier forwards wrote: the keys and values before position pos[0] (this
// forward's first row), which no kernel of this forward writes, and pos
// itself, uploaded before the forward's first kernel. Up to key_cap of
// those keys go to shared memory, so the scores' loads after the wait are
// the query and this forward's keys: the same values, read sooner. Without
// `wait` (the persistent step, past a grid barrier) nothing is waited for.
__device__ void attention_split_block(const SplitArgs& a, int r, int h, int z, float* smem_f,
                                      float* scratch, float* inv_sum, int trigger_at, bool wait) {
    float* scores = smem_f;
    float* vs = smem_f + ((a.max_keys + 3) & ~3);
    float* ks = vs + (size_t)a.chunk * a.ds;
    int ds = a.ds, d0 = z * ds;
    int pos0 = (int)a.pos[0];
    int first, n_keys;
    visible_keys(pos0, r, a.window, &first, &n_keys);
    int kvh = h / (a.n_head / a.n_kv);
    int kv_stride = a.n_kv * a.head_dim;
    int col = kvh * a.head_dim + d0;
    // Keys [first, first + n_old) are older than this forward: their keys
    // (key_cap of them at most; 0 in the persistent step) and the first
    // chunk's values are copied before the wait, the rest after it.
    int n_old = max(0, min(pos0 - first, n_keys));
    int n_staged = min(n_old, a.key_cap);
    int nv = min(a.chunk, n_keys), nv_old = min(nv, n_old);
    stage_rows(ks, a.k, first, n_staged, a.head_dim, a.head_dim + KEY_PAD, kv_stride,
               kvh * a.head_dim);
    stage_values(vs, a.v, first, nv_old, ds, kv_stride, col);
    if (wait) {
        pdl_wait();
        if (trigger_at == 1) pdl_launch_dependents();
    }
    stage_values(vs + (size_t)nv_old * ds, a.v, first + nv_old, nv - nv_old, ds, kv_stride, col);
    if (n_staged > 0) {
        // The same for every thread of the block (it depends on r and h).
        copy_async_wait_all();
        __syncthreads();
    }
    const float* qh = a.q + (size_t)r * a.n_head * a.head_dim + h * a.head_dim;
    float inv = scores_softmax(qh, a.k, first, n_keys, kvh, a.head_dim, kv_stride, a.scale,
                               scores, scratch, inv_sum, ks, n_staged);
    if (trigger_at == 2) pdl_launch_dependents();

    int d = threadIdx.x;
    float acc = 0.0f;
    for (int c0 = 0; c0 < n_keys; c0 += a.chunk) {
        int n = min(a.chunk, n_keys - c0);
        if (c0 > 0) {
            __syncthreads();  // every thread done with the last chunk
            stage_values(vs, a.v, first + c0, n, ds, kv_stride, col);
        }
        copy_async_wait_all();
        __syncthreads();
        if (d < ds) {
            // Four keys' scores per load where aligned; the keys in order.
            int j = 0;
            if ((c0 & 3) == 0) {
#pragma unroll 4
                for (; j + 4 <= n; j += 4) {
                    f32x4 p = *(const f32x4*)(scores + c0 + j);
                    const float* vj = vs + (size_t)j * ds + d;
                    acc = mul_add_unfused(acc, __fmul_rn(p.x, inv), vj[0]);
                    acc = mul_add_unfused(acc, __fmul_rn(p.y, inv), vj[ds]);
                    acc = mul_add_unfused(acc, __fmul_rn(p.z, inv), vj[2 * ds]);
                    acc = mul_add_unfused(acc, __fmul_rn(p.w, inv), vj[3 * ds]);
                }
            }
            for (; j < n; ++j)
                acc = mul_add_unfused(acc, __fmul_rn(scores[c0 + j], inv), vs[(size_t)j * ds + d]);
        }
    }
    if (d < ds) a.out[(size_t)r * a.n_head * a.head_dim + h * a.head_dim + d0 + d] = acc;
}

extern "C" __global__ void attention_split(const float* q, const float* k, const float* v,
                                           float* out, const u32* pos, int n_head, int n_kv,
                                           int head_dim, float scale, int window, int ds,
                                           int chunk, int max_keys, int key_cap, Prefetch pf,
                                           int trigger_at) {
    if (trigger_at == 0) pdl_launch_dependents();
    prefetch_l2(pf);
    extern __shared__ __align__(16) float smem_f[];
    __shared__ float scratch[32];
    __shared__ float inv_sum;
    SplitArgs a = {q, k, v, out, pos, n_head, n_kv, head_dim, scale, window, ds, chunk,
                   max_keys, key_cap};
    // Launched early, the block waits in there for the kernel before (q,
    // this forward's keys and values) to finish: only the prefetch of
    // weights and the staging of earlier forwards' keys and values run
    // before.
    attention_split_block(a, blockIdx.x, blockIdx.y, blockIdx.z, smem_f, scratch, &inv_sum,
                          trigger_at, true);
}

// The new keys and values of `rows` rows (`[rows, kv_width]` each) into one
// layer's cache at their positions `pos[r]` (read from the device, as in
// attention). One block per row.
extern "C" __global__ void kv_write(const float* k, const float* v, float* k_cache,
                                    float* v_cache, const u32* pos, int kv_width) {
    int r = blockIdx.x;
    size_t dst = (size_t)pos[r] * kv_width, src = (size_t)r * kv_width;
    for (int i = threadIdx.x; i < kv_width; i += blockDim.x) {
        k_cache[dst + i] = k[src + i];
        v_cache[dst + i] = v[src + i];
    }
}
