// ffn_swiglu: (gate / (1 + exp(-gate))) * up, as the CPU op writes it
// (`swiglu_one`, common.cuh).

extern "C" __global__ void swiglu(const float* gate, const float* up, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = swiglu_one(gate[i], up[i]);
    }
}

// ffn_geglu: (0.5 gate (1 + tanh(sqrt(2/pi) (gate + 0.044715 gate^3)))) * up,
// in the CPU op's order of f32 operations; tanh rounded once from double.
extern "C" __global__ void geglu(const float* gate, const float* up, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float k = (float)0.7978845608028654, c = (float)0.044715;
        float g = gate[i];
        float cube = __fmul_rn(__fmul_rn(__fmul_rn(c, g), g), g);
        float t = (float)tanh((double)__fmul_rn(k, __fadd_rn(g, cube)));
        out[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t)), up[i]);
    }
}
