// Shared by every taptree kernel source. NVRTC compiles each `.cu` with this
// header prepended, so nothing here may include a system header: f16 is
// decoded with one PTX instruction instead of cuda_fp16.h.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
// 16 bytes moved by one load and one store.
struct __align__(16) u32x4 {
    u32 a, b, c, d;
};
struct __align__(16) f32x4 {
    float x, y, z, w;
};

// GGML type ids (GgmlType::id on the Rust side).
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

#define QK 32
// Elements per K-quant super-block.
#define QK_K 256

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 load_u16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

// Four bytes as a little-endian int, from an address that need not be
// 4-aligned (Q8_0 and Q4_0 blocks are 34 and 18 bytes long).
__device__ __forceinline__ int load_i32_unaligned(const u8* p) {
    return (int)((u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24));
}

__device__ __forceinline__ int type_size(int t) {
    switch (t) {
        case T_F32: return 4;
        case T_F16: return 2;
        case T_BF16: return 2;
        case T_Q4_0: return 18;
        case T_Q4_1: return 20;
        case T_Q5_0: return 22;
        case T_Q8_0: return 34;
        case T_Q2_K: return 84;
        case T_Q3_K: return 110;
        case T_Q4_K: return 144;
        case T_Q5_K: return 176;
        case T_Q6_K: return 210;
    }
    return 0;
}

__device__ __forceinline__ int block_size(int t) {
    if (t == T_F32 || t == T_F16 || t == T_BF16) return 1;
    return t >= T_Q2_K && t <= T_Q6_K ? QK_K : QK;
}

// The 6-bit scale (`min` false) or min of sub-block `j` (of eight) of a
// Q4_K/Q5_K block's 12 scale bytes (ggml's get_scale_min_k4).
__device__ __forceinline__ int scale_min_k4(const u8* q, int j, bool min) {
    if (j < 4) return min ? (q[j + 4] & 63) : (q[j] & 63);
    return min ? ((q[j + 4] >> 4) | ((q[j] >> 6) << 4))
               : ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
}

// Element `i` of a row stored in GGML type `t`: the same arithmetic as
// the CPU dequantization (ggml's reference), so a dequantized weight is
// bitwise the CPU's.
__device__ __forceinline__ float dequant_elem(const u8* row, int t, int i) {
    switch (t) {
        case T_F32: return ((const float*)row)[i];
        case T_F16: return f16_to_f32(load_u16(row + 2 * i));
        case T_BF16: return __int_as_float((int)load_u16(row + 2 * i) << 16);
        case T_Q4_0: {
            const u8* b = row + (i / QK) * 18;
            int j = i % QK;
            float d = f16_to_f32(load_u16(b));
            int q = j < 16 ? (b[2 + j] & 0x0F) : (b[2 + j - 16] >> 4);
            return (float)(q - 8) * d;
        }
        case T_Q4_1: {
            const u8* b = row + (i / QK) * 20;
            int j = i % QK;
            float d = f16_to_f32(load_u16(b));
            float m = f16_to_f32(load_u16(b + 2));
            int q = j < 16 ? (b[4 + j] & 0x0F) : (b[4 + j - 16] >> 4);
            // Unfused, as the CPU computes it: an fma would round once, not twice.
            return __fadd_rn(__fmul_rn((float)q, d), m);
        }
        case T_Q5_0: {
            const u8* b = row + (i / QK) * 22;
            int j = i % QK;
            float d = f16_to_f32(load_u16(b));
            u32 qh = (u32)load_i32_unaligned(b + 2);
            int lo = j < 16 ? (b[6 + j] & 0x0F) : (b[6 + j - 16] >> 4);
            int hi = ((qh >> j) & 1) << 4;
            return (float)((lo | hi) - 16) * d;
        }
        case T_Q8_0: {
            const u8* b = row + (i / QK) * 34;
            int j = i % QK;
            float d = f16_to_f32(load_u16(b));
            return (float)((const i8*)(b + 2))[j] * d;
        }
        // K-quants: element j of a 256-element super-block, with the CPU's
        // roundings (the sub-block's scale and min each one product, then
        // scale * q - min unfused).
        case T_Q4_K:
        case T_Q5_K: {
            int size = t == T_Q4_K ? 144 : 176;
            const u8* b = row + (i / QK_K) * size;
            int j = i % QK_K;
            int chunk = j / 64, hi = (j % 64) / 32, l = j % 32;
            float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
            int sub = 2 * chunk + hi;
            float dl = __fmul_rn(d, (float)scale_min_k4(b + 4, sub, false));
            float ml = __fmul_rn(dmin, (float)scale_min_k4(b + 4, sub, true));
            const u8* qs = b + (t == T_Q4_K ? 16 : 48);
            int q = qs[32 * chunk + l];
            q = hi ? q >> 4 : q & 0x0F;
            if (t == T_Q5_K && (b[16 + l] & (1 << sub))) q += 16;
            return __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
        // Q2_K and Q3_K: two halves of 128, each four 2-bit planes of 32
        // values (byte l of the half's 32, shifted by 2 * plane), in
        // sub-blocks of 16 with their own scale.
        case T_Q2_K: {
            const u8* b = row + (i / QK_K) * 84;
            int j = i % QK_K;
            int half = j / 128, plane = (j % 128) / 32, l = j % 32;
            int sc = b[8 * half + 2 * plane + l / 16];
            float d = f16_to_f32(load_u16(b + 80)), dmin = f16_to_f32(load_u16(b + 82));
            float dl = __fmul_rn(d, (float)(sc & 0x0F));
            float ml = __fmul_rn(dmin, (float)(sc >> 4));
            int q = (b[16 + 32 * half + l] >> (2 * plane)) & 3;
            return __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
        case T_Q3_K: {
            const u8* b = row + (i / QK_K) * 110;
            int j = i % QK_K;
            int half = j / 128, plane = (j % 128) / 32, l = j % 32;
            // Scale s (of 16), 6 bits: the low four from byte s % 8 (low or
            // high nibble), the high two from byte 8 + s % 4.
            int s = 8 * half + 2 * plane + l / 16;
            const u8* sb = b + 96;
            int lo4 = s < 8 ? (sb[s] & 0x0F) : (sb[s - 8] >> 4);
            int hi2 = (sb[8 + s % 4] >> (2 * (s / 4))) & 3;
            float dl = __fmul_rn(f16_to_f32(load_u16(b + 108)), (float)((lo4 | (hi2 << 4)) - 32));
            int low = (b[32 + 32 * half + l] >> (2 * plane)) & 3;
            // The high bit lives in hmask, one bit plane per 32 values; a
            // clear bit subtracts 4.
            int high = (b[l] & (1 << (4 * half + plane))) ? 0 : 4;
            return __fmul_rn(dl, (float)(low - high));
        }
        case T_Q6_K: {
            const u8* b = row + (i / QK_K) * 210;
            int j = i % QK_K;
            int half = j / 128, quarter = (j % 128) / 32, l = j % 32;
            const u8* ql = b + 64 * half;
            const u8* qh = b + 128 + 32 * half;
            const i8* sc = (const i8*)(b + 192 + 8 * half);
            float d = f16_to_f32(load_u16(b + 208));
            int lo = ql[l + 32 * (quarter & 1)];
            lo = quarter >= 2 ? lo >> 4 : lo & 0x0F;
            int q = (lo | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
            return __fmul_rn(__fmul_rn(d, (float)sc[l / 16 + 2 * quarter]), (float)q);
        }
    }
    return __int_as_float(0x7fc00000);
}

// Products and sums rounded one at a time, never fused into an fma: the CPU
// reference computes `acc += a * b` with two roundings, and the parity of a
// kernel with its CPU op is worth more than the last ulp of speed.
__device__ __forceinline__ float mul_add_unfused(float acc, float a, float b) {
    return __fadd_rn(acc, __fmul_rn(a, b));
}

// exp rounded once from double: within half an ulp of the true value, as
// the CPU's libm expf is (CUDA's expf may be 2 ulp off).
__device__ __forceinline__ float exp_f32(float x) {
    return (float)exp((double)x);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of up to 1024 threads in a fixed order (lanes, then warps),
// so the result does not depend on scheduling. `scratch` holds 32 floats.
__device__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) >> 5;
    float t = 0.0f;
    for (int w = 0; w < nwarps; ++w) t += scratch[w];
    return t;
}

__device__ double block_sum_f64(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) >> 5;
    double t = 0.0;
    for (int w = 0; w < nwarps; ++w) t += scratch[w];
    return t;
}

__device__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) >> 5;
    float t = scratch[0];
    for (int w = 1; w < nwarps; ++w) t = fmaxf(t, scratch[w]);
    return t;
}

// Copies `bytes` from global memory to shared memory with every thread of
// the block, each thread issuing STAGE_INFLIGHT loads before its first
// store: a loop that stores each load before issuing the next waits out one
// memory latency per step. 16-byte moves where both ends and the length
// allow, else 4-byte, else bytes. Only moves data: no sum depends on it.
#define STAGE_INFLIGHT 8
template <typename T>
__device__ __forceinline__ void stage_words(T* dst, const T* src, size_t n) {
    for (size_t k0 = threadIdx.x; k0 < n; k0 += (size_t)STAGE_INFLIGHT * blockDim.x) {
        T r[STAGE_INFLIGHT];
#pragma unroll
        for (int u = 0; u < STAGE_INFLIGHT; ++u) {
            size_t k = k0 + (size_t)u * blockDim.x;
            if (k < n) r[u] = src[k];
        }
#pragma unroll
        for (int u = 0; u < STAGE_INFLIGHT; ++u) {
            size_t k = k0 + (size_t)u * blockDim.x;
            if (k < n) dst[k] = r[u];
        }
    }
}

__device__ __forceinline__ void stage_bytes(u8* dst, const u8* src, size_t bytes) {
    size_t align = (size_t)src | (size_t)dst | bytes;
    if ((align & 15) == 0) {
        stage_words<u32x4>((u32x4*)dst, (const u32x4*)src, bytes / 16);
    } else if ((align & 3) == 0) {
        stage_words<u32>((u32*)dst, (const u32*)src, bytes / 4);
    } else {
        stage_words<u8>(dst, src, bytes);
    }
}

// 16 bytes from global to shared memory without waiting for them
// (cp.async, sm_80 and later; a plain load and store before): the block
// goes on computing while the copy runs, and `copy_async_wait_all` then
// `__syncthreads` make it visible. Both addresses 16-byte aligned. Only
// moves data: no sum depends on it.
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#else
    *(u32x4*)dst = *(const u32x4*)src;
#endif
}

// Waits for this thread's `copy16_async` copies.
__device__ __forceinline__ void copy_async_wait_all() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Closes the group of this thread's `copy16_async` copies issued since the
// last one; `copy_async_wait_groups(n)` waits until at most n groups are
// still in flight (n of 0 to 3). Nothing before sm_80, whose copies are
// plain. They move data only: no sum depends on them.
__device__ __forceinline__ void copy_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void copy_async_wait_groups(int n) {
#if __CUDA_ARCH__ >= 800
    switch (n) {
        case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    }
#endif
}

// `stage_bytes` through `copy16_async` where both ends and the length are
// 16-byte aligned (the copy then completes at `copy_async_wait_all`), else
// `stage_bytes` itself.
__device__ __forceinline__ void stage_bytes_async(u8* dst, const u8* src, size_t bytes) {
    if ((((size_t)src | (size_t)dst | bytes) & 15) == 0) {
        for (size_t k = threadIdx.x; k < bytes / 16; k += blockDim.x)
            copy16_async(dst + 16 * k, src + 16 * k);
    } else {
        stage_bytes(dst, src, bytes);
    }
}

// Programmatic dependent launch (sm_90 and later; nothing before): a
// kernel launched with the attribute (`ops::launch`'s early launch) may
// start while the kernel before it in the stream still runs. Such a kernel
// calls `pdl_wait` before its first read of anything an earlier kernel
// wrote and before its first global write: the wait returns once the
// kernel before has finished and its writes are visible, so every value
// is the one a serialized launch would see. Before it, a block may only
// fetch what no kernel writes (weights). `pdl_launch_dependents` lets the
// next such kernel start early; it moves no data. Without the attribute
// both are no-ops.
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// RMSNorm's pieces, shared by the `rms_norm` kernel and the fused matmuls
// that normalize their input themselves, so both compute the same bits.
// NORM_THREADS is the norm kernel's block size: its sum of squares is the
// one of a block of that many threads (thread t summing elements t, t +
// NORM_THREADS, ... in f64, then the lanes of each warp, then the warps in
// order), whatever block computes it.
#define NORM_THREADS 256

// Thread `t`'s (of NORM_THREADS) partial sum of squares of `x[0..n)`.
__device__ __forceinline__ double norm_partial(const float* x, int n, int t) {
    double ss = 0.0;
    for (int i = t; i < n; i += NORM_THREADS) ss += (double)x[i] * (double)x[i];
    return ss;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 1 / sqrt(mean of squares + eps) from the sum of squares `ss` of `n` values.
__device__ __forceinline__ float norm_scale(double ss, int n, float eps) {
    float mean = (float)(ss / (double)n);
    // 1/sqrt rather than rsqrtf: rsqrtf is approximate (2 ulp).
    return 1.0f / sqrtf(__fadd_rn(mean, eps));
}

__device__ __forceinline__ float norm_apply(float x, float scale, float w) {
    return __fmul_rn(__fmul_rn(x, scale), w);
}

// The sum of squares of `x[0..n)` exactly as a NORM_THREADS-thread
// `rms_norm` block computes it, by a block of any multiple of 32 threads
// that divides NORM_THREADS (each thread stands for NORM_THREADS /
// blockDim.x of the norm's threads). `scratch` holds NORM_THREADS / 32
// doubles; every thread gets the sum.
__device__ double norm_sum_squares(const float* x, int n, double* scratch) {
    int lane = threadIdx.x & 31;
    __syncthreads();
    for (int t = threadIdx.x; t < NORM_THREADS; t += blockDim.x) {
        double v = warp_sum_f64(norm_partial(x, n, t));
        if (lane == 0) scratch[t >> 5] = v;
    }
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < NORM_THREADS / 32; ++w) total += scratch[w];
    return total;
}

// RoPE's cosine and sine for element i of a head's half at position `pos`:
// the angle, its cosine and sine in f64 (an f32 angle at position 8000 has
// already lost three digits), rounded to f32.
__device__ __forceinline__ void rope_cos_sin(u32 pos, int i, int head_dim, float base, float* c,
                                             float* s) {
    double inv_freq = pow((double)base, -2.0 * (double)i / (double)head_dim);
    double theta = (double)pos * inv_freq;
    *c = (float)cos(theta);
    *s = (float)sin(theta);
}

// The rotation of one pair (a, b) by an angle of cosine c and sine s, in
// f32 without fma, as the CPU.
__device__ __forceinline__ void rope_apply(float* a, float* b, float c, float s) {
    float x0 = *a, x1 = *b;
    *a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// RoPE of one pair (a, b), element i of the head's half, at position
// `pos`. Shared by `rope_qk` and the fused q/k/v projection.
__device__ __forceinline__ void rope_rotate(float* a, float* b, u32 pos, int i, int head_dim,
                                            float base) {
    float c, s;
    rope_cos_sin(pos, i, head_dim, base, &c, &s);
    rope_apply(a, b, c, s);
}

// SwiGLU of one element, (gate / (1 + exp(-gate))) * up, as the CPU op
// writes it. Shared by `swiglu` and the fused gate/up projection.
__device__ __forceinline__ float swiglu_one(float g, float u) {
    return __fmul_rn(g / __fadd_rn(1.0f, exp_f32(-g)), u);
}
