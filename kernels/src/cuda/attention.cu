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

extern "C" __global__ void attention(const float* q, const float* k, const float* v,
                                     float* out, const u32* pos, int n_head, int n_kv,
                                     int head_dim, float scale, int window) {
    int pos0 = (int)pos[0];
    extern __shared__ float scores[];
    __shared__ float scratch[32];
    __shared__ float inv_sum;
    int r = blockIdx.x, h = blockIdx.y;
    // A window (> 0) keeps the last `window` positions: keys [first, seen).
    int seen = pos0 + r + 1;
    int first = window > 0 && seen > window ? seen - window : 0;
    int n_keys = seen - first;
    int kvh = h / (n_head / n_kv);
    int kv_stride = n_kv * head_dim;
    const float* qh = q + (size_t)r * n_head * head_dim + h * head_dim;

    // Four dimensions per load where the layout allows: one key's 64 loads
    // otherwise wait out 4 memory latencies even unrolled. The sum still
    // runs over d in order.
    bool vec = head_dim % 4 == 0 && kv_stride % 4 == 0 && (((size_t)k | (size_t)qh) & 15) == 0;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        const float* kj = k + (size_t)(first + j) * kv_stride + kvh * head_dim;
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
        float sum = 0.0f;
#pragma unroll 8
        for (int j = 0; j < n_keys; ++j) sum = __fadd_rn(sum, scores[j]);
        inv_sum = 1.0f / sum;
    }
    __syncthreads();
    float inv = inv_sum;

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
