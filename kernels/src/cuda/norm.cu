// rms_norm: y = (x * (1 / sqrt(mean(x^2) + eps))) * w, one block of
// NORM_THREADS per row. As the CPU op: the sum of squares in f64, the scale
// in f32 (the pieces are in common.cuh, shared with the fused matmuls).

extern "C" __global__ void rms_norm(const float* x, const float* w, float* y,
                                    int n, float eps) {
    __shared__ double scratch[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    double ss = block_sum_f64(norm_partial(xr, n, threadIdx.x), scratch);
    float scale = norm_scale(ss, n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = norm_apply(xr[i], scale, w[i]);
}
