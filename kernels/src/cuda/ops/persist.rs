//! The persistent decode of decode.cu: every layer of a single-sequence
//! decode step in one cooperative launch, the fused pass's five steps per
//! layer separated by barriers of the whole grid instead of kernel
//! boundaries. Each output is computed by the fused launches' own code, so
//! a step's bits are theirs (`cuda_fused.rs` holds the two against each
//! other).

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceRepr, LaunchConfig,
};

use super::launch::{launch_cooperative, KernelArgs};
use super::{check, raise_shared, DeviceMatrix, MATMUL_F32_OUTS};
use crate::cuda::device::{Device, Family};
use crate::cuda::CudaError;

/// Threads per block: the fused matmuls' four warps.
const THREADS: u32 = 128;
/// Attention's value dimensions per block, as `attention_split_at`'s.
const DS: usize = 16;
/// The most values a block stages at once, as `attention_split_at`'s.
const VALUE_FLOATS: usize = 8 * 1024;
/// Bytes of one layer's entry in the table (`LayerW` in decode.cu, whose
/// size the kernel asserts): nine addresses, seven weight types, the window
/// and RoPE's base, then 4 bytes of padding to the struct's 8-byte
/// alignment.
const LAYER_BYTES: usize = 9 * 8 + 7 * 4 + 4 + 4 + 4;

/// One layer's matrices and norm weights, for [`LayerTable::new`].
pub struct LayerMatrices<'a> {
    /// q, k, v, o, gate, up, down.
    pub w: [&'a DeviceMatrix; 7],
    /// attn_norm and ffn_norm.
    pub norms: [&'a CudaSlice<f32>; 2],
    /// The layer's attention window (`None`: every position).
    pub window: Option<usize>,
    /// The layer's RoPE base.
    pub rope_base: f32,
}

/// The layers' weights as the persistent kernel reads them: a table on the
/// device of each layer's addresses and types, made once per forward (the
/// weights never move), and the largest weight buffer a block needs.
pub struct LayerTable {
    table: CudaSlice<u8>,
    layers: usize,
    /// Bytes of one block's weight rows for its largest matmul, rounded to 16.
    w_buf: usize,
    /// The widest window any layer looks through (`None`: some layer sees
    /// every position).
    window: Option<usize>,
    /// Whether a layer has a window of 0 (the split attention refuses one).
    zero_window: bool,
}

impl LayerTable {
    /// Uploads `layers`' table.
    pub fn new(dev: &Device, layers: &[LayerMatrices]) -> Result<LayerTable, CudaError> {
        let mut bytes = Vec::with_capacity(layers.len() * LAYER_BYTES);
        let mut w_buf = 0;
        let mut window = Some(0);
        let mut zero_window = false;
        for l in layers {
            for m in l.w {
                let (p, _g) = m.data.device_ptr(dev.stream());
                bytes.extend_from_slice(&p.to_ne_bytes());
            }
            for n in l.norms {
                let (p, _g) = n.device_ptr(dev.stream());
                bytes.extend_from_slice(&p.to_ne_bytes());
            }
            for m in l.w {
                bytes.extend_from_slice(&(m.ggml_type.id() as i32).to_ne_bytes());
            }
            let win = l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
            bytes.extend_from_slice(&win.to_ne_bytes());
            bytes.extend_from_slice(&l.rope_base.to_ne_bytes());
            bytes.extend_from_slice(&[0; 4]);
            let rows = |m: &DeviceMatrix, n: usize| n * m.ggml_type.row_bytes(m.cols);
            let [wq, wk, wv, wo, wg, wu, wd] = l.w;
            let half = MATMUL_F32_OUTS / 2;
            let most = [wq, wk, wv, wo, wd]
                .iter()
                .map(|m| rows(m, MATMUL_F32_OUTS))
                .chain([rows(wg, half) + rows(wu, half)])
                .max()
                .unwrap_or(0);
            w_buf = w_buf.max(most.div_ceil(16) * 16);
            zero_window |= l.window == Some(0);
            window = match (window, l.window) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        debug_assert_eq!(bytes.len(), layers.len() * LAYER_BYTES);
        Ok(LayerTable {
            table: super::upload(dev, &bytes)?,
            layers: layers.len(),
            w_buf,
            window,
            zero_window,
        })
    }
}

/// The step's activation buffers (one row each) and this sequence's caches.
pub struct StepBuffers<'a, 'b> {
    /// The residual stream: the embedding in, the last layer's output out.
    pub x: &'a mut CudaViewMut<'b, f32>,
    /// The residual after attention.
    pub x2: &'a mut CudaViewMut<'b, f32>,
    /// The rotated queries.
    pub q: &'a mut CudaViewMut<'b, f32>,
    /// Attention's output.
    pub att: &'a mut CudaViewMut<'b, f32>,
    /// The gated product.
    pub s: &'a mut CudaViewMut<'b, f32>,
    /// Keys of every layer, `[n_layer, capacity, kv width]`.
    pub k_cache: &'a mut CudaViewMut<'b, f32>,
    /// Values, as the keys.
    pub v_cache: &'a mut CudaViewMut<'b, f32>,
    /// The row's position.
    pub pos: &'a CudaView<'b, u32>,
    /// RoPE's cosines and sines at it (`ops::rope_table`), or `None`.
    pub rope: Option<&'a CudaView<'b, f32>>,
    /// The barrier's words ([`BARRIER_WORDS`]), zeroed here before the
    /// launch.
    pub barrier: &'a mut CudaSlice<u32>,
    /// Where each block notes when it arrived at and left each barrier
    /// ([`timeline_len`] values: nanoseconds of the GPU's global timer), or
    /// `None`.
    pub stamps: Option<&'a mut CudaSlice<u64>>,
}

/// The barrier's words: the arrivals' counter, and 32 words on (another
/// cache line) the number of barriers passed.
pub const BARRIER_WORDS: usize = 64;

/// Values of a timeline of `layers` layers on a grid of `blocks` blocks: two
/// per block per barrier (arrived, left), barrier-major; a layer's five
/// steps end at barriers 5 l - 1 .. 5 l + 3 (the first layer's first step
/// has none before it).
pub fn timeline_len(layers: usize, blocks: usize) -> usize {
    2 * blocks * (5 * layers).saturating_sub(1)
}

/// The model's shapes the step needs.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    /// Embedding width.
    pub d: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// FFN width.
    pub ff: usize,
    /// The caches' capacity in positions.
    pub capacity: usize,
    /// RMSNorm's epsilon.
    pub eps: f32,
}

/// `StepArgs` in decode.cu, field for field.
#[repr(C)]
#[derive(Clone, Copy)]
struct StepArgs {
    layers: u64,
    x: u64,
    x2: u64,
    q: u64,
    att: u64,
    s: u64,
    k_cache: u64,
    v_cache: u64,
    layer_floats: u64,
    pos: u64,
    rope_cs: u64,
    barrier: u64,
    stamps: u64,
    n_layer: i32,
    d: i32,
    qw: i32,
    kvw: i32,
    ff: i32,
    n_head: i32,
    n_kv: i32,
    head_dim: i32,
    eps: f32,
    scale: f32,
    ds: i32,
    chunk: i32,
    max_keys: i32,
    w_buf: i32,
    x_bytes: i32,
    att_bytes: i32,
}

// SAFETY: plain data with no implicit padding (13 addresses, then 16 4-byte
// fields), laid out as the kernel's struct (whose size the kernel asserts).
unsafe impl DeviceRepr for StepArgs {}

const _: () = assert!(std::mem::size_of::<StepArgs>() == 168 && LAYER_BYTES == 112);

/// Where the persistent step can run and how: its grid and shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistPlan {
    /// Blocks of the grid.
    pub blocks: usize,
    /// Dynamic shared memory per block.
    pub shared: usize,
    /// Keys a block's scores hold.
    max_keys: usize,
    chunk: usize,
    x_bytes: usize,
    att_bytes: usize,
}

/// The most blocks any of a layer's five steps has in the fused pass.
fn most_shares(s: &StepShape) -> usize {
    let outs = |n: usize, per: usize| n.div_ceil(per);
    let (qw, kvw) = (s.n_head * s.head_dim, s.n_kv * s.head_dim);
    [
        outs(qw, MATMUL_F32_OUTS) + 2 * outs(kvw, MATMUL_F32_OUTS),
        s.n_head * (s.head_dim / DS),
        outs(s.d, MATMUL_F32_OUTS),
        outs(s.ff, MATMUL_F32_OUTS / 2),
    ]
    .into_iter()
    .max()
    .unwrap_or(1)
}

/// The plan of a persistent step over `table` at `shape`, or `None` where
/// it cannot run (attention's layout not the split kernel's, more shared
/// memory than a block may have, no block fitting an SM): the caller then
/// runs the five launches per layer. `cap` limits the grid (0: none).
pub fn persist_plan(
    dev: &Device,
    table: &LayerTable,
    shape: &StepShape,
    cap: usize,
) -> Result<Option<PersistPlan>, CudaError> {
    let s = shape;
    let kvw = s.n_kv * s.head_dim;
    let widest = s.d.max(s.n_head * s.head_dim).max(s.ff);
    if !s.head_dim.is_multiple_of(DS)
        || !kvw.is_multiple_of(4)
        || s.n_kv == 0
        || !s.n_head.is_multiple_of(s.n_kv)
    {
        return Ok(None);
    }
    if table.zero_window || table.layers == 0 {
        return Ok(None);
    }
    let max_keys = table.window.map_or(s.capacity, |w| w.min(s.capacity));
    let chunk = max_keys.min(VALUE_FLOATS / DS);
    let x_bytes = (widest * 4).div_ceil(16) * 16;
    let att_bytes = (max_keys.div_ceil(4) * 4 + chunk * DS) * 4;
    // The copies of the table, the position (16 bytes) and RoPE's pairs.
    let consts = table.layers * LAYER_BYTES + 16 + s.head_dim * 4;
    let shared = 2 * table.w_buf + x_bytes + att_bytes + consts;
    let most = dev
        .context()
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
        .map_err(|e| CudaError::driver("query shared memory per block", e))?;
    if shared > most.max(0) as usize {
        return Ok(None);
    }
    let f = dev.function(Family::Decode, "decode_layers")?;
    raise_shared(&f, shared, "decode_layers")?;
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(THREADS, shared, None)
        .map_err(|e| CudaError::driver("decode_layers: occupancy", e))? as usize;
    let mut blocks = most_shares(s).min(per_sm * dev.sm_count());
    if cap > 0 {
        blocks = blocks.min(cap);
    }
    if blocks == 0 {
        return Ok(None);
    }
    Ok(Some(PersistPlan {
        blocks,
        shared,
        max_keys,
        chunk,
        x_bytes,
        att_bytes,
    }))
}

/// A buffer's device address. The guard cudarc returns is dropped at once,
/// as `KernelArgs::buf` does (sound for the same reason: one stream).
fn addr<T>(b: &impl DevicePtr<T>, stream: &Arc<CudaStream>) -> u64 {
    b.device_ptr(stream).0
}

/// Every layer of one decode step (one row at `b.pos`), in one launch
/// planned by [`persist_plan`]: `b.x` in, the last layer's output in `b.x`.
pub fn decode_layers(
    dev: &Device,
    table: &LayerTable,
    shape: &StepShape,
    plan: &PersistPlan,
    b: StepBuffers,
) -> Result<(), CudaError> {
    let s = shape;
    let (qw, kvw) = (s.n_head * s.head_dim, s.n_kv * s.head_dim);
    check("decode_layers x", b.x.len(), s.d)?;
    check("decode_layers x2", b.x2.len(), s.d)?;
    check("decode_layers q", b.q.len(), qw)?;
    check("decode_layers att", b.att.len(), qw)?;
    check("decode_layers s", b.s.len(), s.ff)?;
    let cache = table.layers * s.capacity * kvw;
    check("decode_layers k cache", b.k_cache.len(), cache)?;
    check("decode_layers v cache", b.v_cache.len(), cache)?;
    check("decode_layers pos", b.pos.len(), 1)?;
    check("decode_layers barrier", b.barrier.len(), BARRIER_WORDS)?;
    if let Some(t) = &b.stamps {
        check(
            "decode_layers timeline",
            t.len(),
            timeline_len(table.layers, plan.blocks),
        )?;
    }
    if let Some(t) = &b.rope {
        check("decode_layers rope table", t.len(), s.head_dim)?;
    }
    let stream = dev.stream();
    stream
        .memset_zeros(b.barrier)
        .map_err(|e| CudaError::driver("decode_layers: zero the barrier", e))?;
    let i = |n: usize| n as i32;
    let args = StepArgs {
        layers: addr(&table.table, stream),
        x: addr(&*b.x, stream),
        x2: addr(&*b.x2, stream),
        q: addr(&*b.q, stream),
        att: addr(&*b.att, stream),
        s: addr(&*b.s, stream),
        k_cache: addr(&*b.k_cache, stream),
        v_cache: addr(&*b.v_cache, stream),
        layer_floats: (s.capacity * kvw) as u64,
        pos: addr(b.pos, stream),
        rope_cs: b.rope.map_or(0, |t| addr(t, stream)),
        barrier: addr(&*b.barrier, stream),
        stamps: b.stamps.as_ref().map_or(0, |t| addr(&**t, stream)),
        n_layer: i(table.layers),
        d: i(s.d),
        qw: i(qw),
        kvw: i(kvw),
        ff: i(s.ff),
        n_head: i(s.n_head),
        n_kv: i(s.n_kv),
        head_dim: i(s.head_dim),
        eps: s.eps,
        scale: (1.0 / (s.head_dim as f64).sqrt()) as f32,
        ds: i(DS),
        chunk: i(plan.chunk),
        max_keys: i(plan.max_keys),
        w_buf: i(table.w_buf),
        x_bytes: i(plan.x_bytes),
        att_bytes: i(plan.att_bytes),
    };
    let f = dev.function(Family::Decode, "decode_layers")?;
    let mut a = KernelArgs::default();
    a.val(&args);
    let cfg = LaunchConfig {
        grid_dim: (plan.blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: plan.shared as u32,
    };
    // SAFETY: the table holds `layers` entries of live device matrices and
    // norm weights (the forward keeps both as long as the table); every
    // buffer holds what the shapes read and write (checked above; the
    // caches' positions are the caller's, as for kv_write); shared memory
    // holds two weight buffers of the largest share, the widest input row
    // and attention's scores and values (persist_plan). The grid is at most
    // what the GPU holds at once, and the cooperative launch refuses more.
    unsafe { launch_cooperative(dev, &f, cfg, &mut a, "decode_layers") }
}
