// rms_norm: y = (x * (1 / sqrt(mean(x^2) + eps))) * w, one block per row.
// As the CPU op: the sum of squares in f64, the scale in f32.

extern "C" __global__ void rms_norm(const float* x, const float* w, float* y,
                                    int n, float eps) {
    __shared__ double scratch[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_f64(ss, scratch);
    float mean = (float)(ss / (double)n);
    // 1/sqrt rather than rsqrtf: rsqrtf is approximate (2 ulp).
    float scale = 1.0f / sqrtf(__fadd_rn(mean, eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}
