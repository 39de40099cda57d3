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
#define T_BF16 30

#define QK 32

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
    }
    return 0;
}

__device__ __forceinline__ int block_size(int t) {
    return (t == T_F32 || t == T_F16 || t == T_BF16) ? 1 : QK;
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
