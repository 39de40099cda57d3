// embedding: row `tokens[r]` of the (quantized) token table, dequantized.

extern "C" __global__ void embedding(const u8* table, int type, int n_embd,
                                     const u32* tokens, float* out) {
    int r = blockIdx.x;
    size_t row_bytes = (size_t)(n_embd / block_size(type)) * type_size(type);
    const u8* row = table + (size_t)tokens[r] * row_bytes;
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x)
        out[(size_t)r * n_embd + i] = dequant_elem(row, type, i);
}
