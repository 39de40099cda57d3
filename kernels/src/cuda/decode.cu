// The persistent decode: every layer of a single-sequence decode step in
// one launch. A grid of at most as many blocks as the GPU holds at once
// (launched cooperatively, so the driver refuses one that would not all be
// resident) runs the fused pass's five steps per layer (q/k/v with RoPE
// and the cache write, attention, o_proj and the add, gate/up and SwiGLU,
// ffn_down and the add), each step's blocks of the five-launch pass taken
// by the grid's blocks in turn, with a barrier of the whole grid between
// steps instead of a kernel boundary. Each output is computed by the same
// code as the five launches' (`fused_plan` and `fused_outputs` of
// fused.cu, `attention_split_block` of attention.cu), so a step's bits are
// theirs; only which block computes an output, and how the steps wait for
// each other, differ.
//
// A block's weight rows for a step are copied into shared memory before the
// barrier that opens the step (weights are never written): two buffers,
// the matmuls of a layer alternating between them, each refilled for the
// matmul two ahead as soon as its own products are done (after attention
// for gate/up, so that attention's waits do not include that copy; they do
// include o_proj's, issued a step earlier). A
// block that takes a second share of a step (a grid smaller than the
// step's blocks) reads that share's weights from global memory.

// One layer's weights, as `ops::persist` lays them out (`#[repr(C)]`).
struct LayerW {
    const u8 *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    const float *attn_norm, *ffn_norm;
    int tq, tk, tv, to, tg, tu, td;
    int window;
    float rope_base;
};
// The table's stride, as `ops::persist` writes it (LAYER_BYTES).
static_assert(sizeof(LayerW) == 112, "LayerW is not the table's layout");

// The step's buffers and shapes, as `ops::persist` passes them.
struct StepArgs {
    const LayerW* layers;
    float *x, *x2, *q, *att, *s;
    float *k_cache, *v_cache;
    unsigned long long layer_floats;  // one layer's cache: capacity * kv width
    const u32* pos;
    const float* rope_cs;  // RoPE's table, or null: computed per block
    unsigned* barrier;     // zero at the launch's start: the arrivals' counter,
                           // and 32 words on the barriers passed
    unsigned long long* stamps;  // null, or 2 per block per barrier (timeline)
    int n_layer, d, qw, kvw, ff, n_head, n_kv, head_dim;
    float eps, scale;
    int ds, chunk, max_keys;
    int w_buf;      // bytes of one weight buffer, a multiple of 16
    int x_bytes;    // bytes of the staged input row, a multiple of 16
    int att_bytes;  // bytes of attention's scores and values, a multiple of 16
};
// `ops::persist`'s StepArgs, with its explicit padding.
static_assert(sizeof(StepArgs) == 168, "StepArgs is not the launcher's layout");

// Loads with acquire semantics at GPU scope: what was written before the
// matching release is visible after it.
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Every block of the grid past its `*passed`-th barrier: the block's
// writes before it visible to every block after it. Thread 0 arrives (a
// fence, then one add on the counter); the last to arrive publishes the
// barrier's number in a word of its own cache line, on which the others
// spin (so their loads do not queue with the adds). A barrier that never
// fills (a block that could not run: not expected under a cooperative
// launch) traps after seconds instead of hanging the process. With
// `stamps`, thread 0 notes the time it arrived and left.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned* passed,
                                             unsigned long long* stamps) {
    __syncthreads();
    *passed += 1;
    if (threadIdx.x == 0) {
        unsigned n = *passed;
        size_t at = 2 * ((size_t)(n - 1) * gridDim.x + blockIdx.x);
        if (stamps) stamps[at] = global_ns();
        unsigned* flag = counter + 32;
        __threadfence();
        if (atomicAdd(counter, 1u) + 1 == n * gridDim.x) {
            __threadfence();
            store_release(flag, n);
        } else {
            long long start = clock64();
            while (load_acquire(flag) < n) {
                if (clock64() - start > (1LL << 35)) __trap();
            }
        }
        if (stamps) stamps[at + 1] = global_ns();
    }
    __syncthreads();
}

#define MM_QKV 0
#define MM_O 1
#define MM_GATE_UP 2
#define MM_DOWN 3

// The fused matmul `kind` of layer `l` as matmul_fused's arguments, and its
// block count in `blocks`.
__device__ FusedArgs layer_matmul(const StepArgs& s, int l, int kind, int* blocks) {
    const LayerW& w = s.layers[l];
    size_t cache = (size_t)l * s.layer_floats;
    FusedArgs a;
    a.mode = FUSED_PLAIN, a.rows = 1, a.eps = s.eps, a.head_dim = s.head_dim;
    a.norm_w = nullptr, a.resid = nullptr, a.pos = s.pos, a.rope_cs = nullptr;
    a.y1 = nullptr, a.y2 = nullptr, a.n1 = 0, a.n2 = 0, a.rope_base = w.rope_base;
    if (kind == MM_QKV) {
        a.mode = FUSED_QKV_ROPE;
        a.w0 = w.wq, a.w1 = w.wk, a.w2 = w.wv, a.t0 = w.tq, a.t1 = w.tk, a.t2 = w.tv;
        a.n0 = s.qw, a.n1 = s.kvw, a.n2 = s.kvw, a.x = s.x, a.in = s.d, a.norm_w = w.attn_norm;
        a.y0 = s.q, a.y1 = s.k_cache + cache, a.y2 = s.v_cache + cache, a.rope_cs = s.rope_cs;
        *blocks = (s.qw + FUSED_OUTS - 1) / FUSED_OUTS + 2 * ((s.kvw + FUSED_OUTS - 1) / FUSED_OUTS);
    } else if (kind == MM_O) {
        a.w0 = a.w1 = a.w2 = w.wo, a.t0 = a.t1 = a.t2 = w.to, a.n0 = s.d;
        a.x = s.att, a.in = s.qw, a.resid = s.x, a.y0 = s.x2;
        *blocks = (s.d + FUSED_OUTS - 1) / FUSED_OUTS;
    } else if (kind == MM_GATE_UP) {
        a.mode = FUSED_SWIGLU;
        a.w0 = w.wg, a.w1 = a.w2 = w.wu, a.t0 = w.tg, a.t1 = a.t2 = w.tu;
        a.n0 = s.ff, a.n1 = s.ff, a.x = s.x2, a.in = s.d, a.norm_w = w.ffn_norm, a.y0 = s.s;
        *blocks = (s.ff + FUSED_OUTS / 2 - 1) / (FUSED_OUTS / 2);
    } else {
        a.w0 = a.w1 = a.w2 = w.wd, a.t0 = a.t1 = a.t2 = w.td, a.n0 = s.d;
        a.x = s.s, a.in = s.ff, a.resid = s.x2, a.y0 = s.x;
        *blocks = (s.d + FUSED_OUTS - 1) / FUSED_OUTS;
    }
    return a;
}

// Issues the copy of this block's first share of matmul `kind` of layer `l`
// into `buf` and closes it as one group (an empty group where there is no
// such layer or share, so the groups keep their order).
__device__ void prefetch_matmul(const StepArgs& s, int l, int kind, u8* buf) {
    if (l < s.n_layer) {
        int blocks;
        FusedArgs a = layer_matmul(s, l, kind, &blocks);
        if ((int)blockIdx.x < blocks) fused_stage_weights(a, fused_plan(a, blockIdx.x), buf);
    }
    copy_async_commit();
}

// Matmul `kind` of layer `l`: this block's shares, the first from `buf`
// (its copy waited for with one later group still in flight), any other
// from global memory.
__device__ void run_matmul(const StepArgs& s, int l, int kind, const u8* buf, float* xs,
                           double* scratch, float res[ROWS_PER_PASS][FUSED_OUTS]) {
    int blocks;
    FusedArgs a = layer_matmul(s, l, kind, &blocks);
    for (int b = blockIdx.x; b < blocks; b += gridDim.x) {
        FusedPlan p = fused_plan(a, b);
        const u8* wr = b == (int)blockIdx.x ? buf + p.wr_off : p.wr;
        fused_outputs(a, p, wr, xs, 0, scratch, res, 1, -1);
        __syncthreads();
    }
}

// Layer `l`'s attention: block (0, h, z) of attention_split for each of
// this block's shares.
__device__ void run_attention(const StepArgs& s, int l, float* smem_f, float* scratch,
                              float* inv_sum) {
    size_t cache = (size_t)l * s.layer_floats;
    SplitArgs a = {s.q, s.k_cache + cache, s.v_cache + cache, s.att, s.pos, s.n_head,
                   s.n_kv, s.head_dim, s.scale, s.layers[l].window, s.ds, s.chunk,
                   s.max_keys, 0};
    int zs = s.head_dim / s.ds, blocks = s.n_head * zs;
    for (int b = blockIdx.x; b < blocks; b += gridDim.x) {
        attention_split_block(a, 0, b / zs, b % zs, smem_f, scratch, inv_sum, -1, false);
        __syncthreads();
    }
}

// Dynamic shared memory: two weight buffers of s.w_buf bytes, the staged
// input row (s.x_bytes), attention's scores and values (s.att_bytes), then
// copies of what every step reads and no step writes: the layers' table,
// the position, RoPE's cosines and sines. Read from shared memory, they
// cost no trip to L2 after each barrier (whose acquire empties L1).
extern "C" __global__ void decode_layers(StepArgs args) {
    extern __shared__ __align__(16) u8 smem[];
    __shared__ double scratch[NORM_THREADS / 32];
    __shared__ float res[ROWS_PER_PASS][FUSED_OUTS];
    __shared__ float ascratch[32];
    __shared__ float inv_sum;
    StepArgs s = args;
    u8* buf0 = smem;
    u8* buf1 = smem + s.w_buf;
    float* xs = (float*)(smem + 2 * (size_t)s.w_buf);
    float* att_smem = (float*)(smem + 2 * (size_t)s.w_buf + s.x_bytes);
    u8* consts = smem + 2 * (size_t)s.w_buf + s.x_bytes + s.att_bytes;
    size_t table_bytes = (size_t)s.n_layer * sizeof(LayerW);
    stage_bytes(consts, (const u8*)s.layers, table_bytes);
    u32* pos = (u32*)(consts + table_bytes);
    float* rope = (float*)(consts + table_bytes + 16);
    if (threadIdx.x == 0) *pos = s.pos[0];
    if (s.rope_cs)
        for (int i = threadIdx.x; i < s.head_dim; i += blockDim.x) rope[i] = s.rope_cs[i];
    __syncthreads();
    s.layers = (const LayerW*)consts;
    s.pos = pos;
    if (s.rope_cs) s.rope_cs = rope;
    unsigned passed = 0;
    prefetch_matmul(s, 0, MM_QKV, buf0);
    prefetch_matmul(s, 0, MM_O, buf1);
    for (int l = 0; l < s.n_layer; ++l) {
        if (l > 0) grid_barrier(s.barrier, &passed, s.stamps);  // x written by the last ffn_down
        run_matmul(s, l, MM_QKV, buf0, xs, scratch, res);
        grid_barrier(s.barrier, &passed, s.stamps);
        run_attention(s, l, att_smem, ascratch, &inv_sum);
        prefetch_matmul(s, l, MM_GATE_UP, buf0);
        grid_barrier(s.barrier, &passed, s.stamps);
        run_matmul(s, l, MM_O, buf1, xs, scratch, res);
        prefetch_matmul(s, l, MM_DOWN, buf1);
        grid_barrier(s.barrier, &passed, s.stamps);
        run_matmul(s, l, MM_GATE_UP, buf0, xs, scratch, res);
        prefetch_matmul(s, l + 1, MM_QKV, buf0);
        grid_barrier(s.barrier, &passed, s.stamps);
        run_matmul(s, l, MM_DOWN, buf1, xs, scratch, res);
        prefetch_matmul(s, l + 1, MM_O, buf1);
    }
    copy_async_wait_all();
}
