//! The fused matmuls of fused.cu: an unarmed single-sequence forward's layer
//! in five launches. Each output is bitwise what the unfused launches give
//! (`cuda_kernels_fused.rs` holds each against them).

use cudarc::driver::{CudaView, CudaViewMut, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::launch::{launch, trigger_fused, Forced, KernelArgs};
use super::{check, launch_err, raise_shared, DeviceMatrix, MATMUL_F32_OUTS, MATMUL_MAX_STAGED};
use crate::cuda::device::{Device, Family};
use crate::cuda::CudaError;

const PLAIN: i32 = 0;
const SWIGLU: i32 = 1;
const QKV_ROPE: i32 = 2;

/// An RMSNorm a fused matmul applies to its input first: its weight
/// (`[cols]`) and epsilon.
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    /// The norm's weight, one per input column.
    pub weight: &'a CudaView<'a, f32>,
    /// The norm's epsilon.
    pub eps: f32,
}

/// Whether a fused matmul over `cols` inputs can stage `rows` rows of its
/// input in shared memory (it always does; past this the forward runs
/// unfused).
pub fn fused_fits(cols: usize, rows: usize) -> bool {
    x_bytes(cols, rows) <= MATMUL_MAX_STAGED
}

fn x_bytes(cols: usize, rows: usize) -> usize {
    rows.min(8) * cols * 4
}

/// The most shared memory a block of the dequantized staging takes (the
/// architectures with early launch allow 227 KiB a block).
const MATMUL_MAX_DEQUANT: usize = 200 * 1024;

/// The dequantized staging forced on or off:
/// `TAPTREE_CUDA_DEQUANT_STAGING=1|0`, or [`set_dequant_staging`].
static DEQUANT_STAGING: Forced = Forced::new("TAPTREE_CUDA_DEQUANT_STAGING");

/// Whether one-row fused matmuls decode their weights into shared memory
/// before their wait (fused.cu, "the dequantized staging"): where the launch
/// mode lets them start early enough
/// ([`EarlyLaunch::stages_weights`](crate::cuda::EarlyLaunch::stages_weights)),
/// unless forced. The same bits either way.
pub fn dequant_staging(dev: &Device) -> bool {
    DEQUANT_STAGING
        .get()
        .unwrap_or_else(|| dev.early_launch().stages_weights())
}

/// Forces the dequantized staging on or off (`None`: as the launch mode
/// says) for the launches that follow; a CUDA graph keeps what it captured.
pub fn set_dequant_staging(on: Option<bool>) {
    DEQUANT_STAGING.set(on);
}

/// The shared memory of a dequantized staging, where it applies: one row,
/// inputs a multiple of 32 (each lane's run of weights four floats a
/// load), and all of it within [`MATMUL_MAX_DEQUANT`]: the block's weight
/// rows as stored (rounded up to 16 bytes), the same rows decoded (16
/// slots of 8 lanes, `cols / 8 + 4` floats each), and the input row twice
/// (as staged, and laid out per lane).
fn dequant_bytes(dev: &Device, weight_bytes: usize, cols: usize, rows: usize) -> Option<usize> {
    if rows != 1 || !cols.is_multiple_of(32) || !dequant_staging(dev) {
        return None;
    }
    let lane = cols / 8 + 4;
    let bytes = weight_bytes.div_ceil(16) * 16 + (MATMUL_F32_OUTS * 8 * lane + cols + 8 * lane) * 4;
    (bytes <= MATMUL_MAX_DEQUANT).then_some(bytes)
}

/// `y = norm(x) W^T` (or `x W^T` without a norm), plus `resid` where given
/// (the residual add): `x` `[rows, W.cols]`, `y` and `resid` `[rows, W.rows]`.
pub fn matmul_fused(
    dev: &Device,
    w: &DeviceMatrix,
    x: &CudaView<f32>,
    norm: Option<Norm>,
    resid: Option<&CudaView<f32>>,
    y: &mut CudaViewMut<f32>,
    rows: usize,
) -> Result<(), CudaError> {
    check(
        &format!("matmul_fused {} y", w.name),
        y.len(),
        rows * w.rows,
    )?;
    if let Some(r) = resid {
        check(
            &format!("matmul_fused {} resid", w.name),
            r.len(),
            rows * w.rows,
        )?;
    }
    let weight_bytes = MATMUL_F32_OUTS * w.ggml_type.row_bytes(w.cols);
    let f = Fused {
        mode: PLAIN,
        ws: [w, w, w],
        n: [w.rows, 0, 0],
        weight_bytes,
        rows,
    };
    f.launch(dev, x, norm, resid, [Some(y), None, None], None, 0, 0.0)
}

/// How [`matmul_streamed`] spreads a wide matrix: blocks per SM, and
/// groups of 16 weight rows each block has in shared memory at once (its
/// copies run that many groups minus one ahead of its products).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streaming {
    /// Blocks per SM; 0 runs [`matmul_fused`] instead.
    pub blocks_per_sm: usize,
    /// Weight groups in flight per block, 2 to 4.
    pub stages: usize,
}

/// [`matmul_fused`] without a residual, for a wide matrix (the logits):
/// the same bits, from a few blocks per SM that each normalize `x` once
/// and stream their share of `W`'s rows through shared memory (fused.cu,
/// `matmul_streamed`), where [`matmul_fused`] has a block, and a norm, per
/// 16 rows. Where the weight buffers and `x` do not fit a block's shared
/// memory, or with `blocks_per_sm` 0, it is [`matmul_fused`].
pub fn matmul_streamed(
    dev: &Device,
    w: &DeviceMatrix,
    x: &CudaView<f32>,
    norm: Option<Norm>,
    y: &mut CudaViewMut<f32>,
    rows: usize,
    how: Streaming,
) -> Result<(), CudaError> {
    let layout = Layout::of(w, rows, how);
    if !layout.streams() {
        return matmul_fused(dev, w, x, norm, None, y, rows);
    }
    check(
        &format!("matmul_streamed {} y", w.name),
        y.len(),
        rows * w.rows,
    )?;
    let (y, _sync) = y.device_ptr_mut(dev.stream());
    // SAFETY: y holds rows x W.rows floats (checked above), device memory
    // that this launch alone writes; the layout streams.
    unsafe { launch_streamed(dev, w, x, norm, y, rows, &layout) }
}

/// Whether [`matmul_streamed`] streams `w` at `rows` rows as `how` says
/// (else it runs [`matmul_fused`]), as [`matmul_streamed_mapped`] needs.
pub fn streams(w: &DeviceMatrix, rows: usize, how: Streaming) -> bool {
    Layout::of(w, rows, how).streams()
}

/// How one [`matmul_streamed`] launch runs over `w`: its stages and blocks
/// per SM, and a block's shared memory (its stages of weight rows and its
/// rows of `x`).
struct Layout {
    stages: usize,
    blocks_per_sm: usize,
    shared: usize,
}

impl Layout {
    fn of(w: &DeviceMatrix, rows: usize, how: Streaming) -> Layout {
        let buf = (MATMUL_F32_OUTS * w.ggml_type.row_bytes(w.cols)).div_ceil(16) * 16;
        let stages = how.stages.clamp(2, 4);
        Layout {
            stages,
            blocks_per_sm: how.blocks_per_sm,
            shared: stages * buf + x_bytes(w.cols, rows),
        }
    }

    /// Whether the launch streams: some blocks per SM, and their shared
    /// memory within a block's.
    fn streams(&self) -> bool {
        self.blocks_per_sm > 0 && self.shared <= MATMUL_MAX_STAGED
    }
}

/// [`matmul_streamed`] into `y`, a device address: the mapped decode step
/// gives that of page-locked host memory (`cuMemHostGetDevicePointer`'s),
/// so its logits are written where the host reads them, with no copy
/// after the kernel; the same bits as into device memory. An error where
/// it would not stream ([`streams`]).
///
/// # Safety
/// `y` is the device address of at least `rows * w.rows` floats (in
/// page-locked host memory, or the device's) that live, and that nothing
/// else reads or writes, until the launch (or a graph recording it) has
/// run.
pub unsafe fn matmul_streamed_mapped(
    dev: &Device,
    w: &DeviceMatrix,
    x: &CudaView<f32>,
    norm: Option<Norm>,
    y: u64,
    rows: usize,
    how: Streaming,
) -> Result<(), CudaError> {
    let layout = Layout::of(w, rows, how);
    if !layout.streams() {
        return Err(CudaError::Shape(format!(
            "matmul_streamed_mapped {}: does not stream at {rows} rows, {how:?}",
            w.name
        )));
    }
    // SAFETY: the caller's; the layout streams.
    unsafe { launch_streamed(dev, w, x, norm, y, rows, &layout) }
}

/// The `matmul_streamed` launch of `w` as `layout` says, into `y`.
///
/// # Safety
/// `y` as [`matmul_streamed_mapped`] says; `layout` streams.
unsafe fn launch_streamed(
    dev: &Device,
    w: &DeviceMatrix,
    x: &CudaView<f32>,
    norm: Option<Norm>,
    y: u64,
    rows: usize,
    layout: &Layout,
) -> Result<(), CudaError> {
    let cols = w.cols;
    check("matmul_streamed x", x.len(), rows * cols)?;
    if let Some(n) = &norm {
        check("matmul_streamed norm weight", n.weight.len(), cols)?;
    }
    let f = dev.function(Family::Fused, "matmul_streamed")?;
    raise_shared(&f, layout.shared, "matmul_streamed")?;
    let (ty, n, r, c) = (w.type_id(), w.rows as i32, rows as i32, cols as i32);
    let eps = norm.map_or(0.0, |n| n.eps);
    let mut a = KernelArgs::default();
    a.buf(dev, &w.data).val(&ty).val(&n).buf(dev, x);
    match &norm {
        Some(n) => a.buf(dev, n.weight),
        None => a.null(),
    };
    a.val(&eps).val(&y).val(&r).val(&c);
    a.val(&(layout.stages as i32)).val(&trigger_fused(dev));
    let groups = w.rows.div_ceil(MATMUL_F32_OUTS);
    let blocks = groups.min(dev.sm_count() * layout.blocks_per_sm).max(1);
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, rows.div_ceil(8) as u32, 1),
        block_dim: (MATMUL_F32_OUTS as u32 / 4 * 32, 1, 1),
        shared_mem_bytes: layout.shared as u32,
    };
    // SAFETY: W holds rows x cols of its type (checked at upload), x and
    // the norm weight what the shapes read (checked above), y what they
    // write (the caller's); shared memory holds `stages` groups of weight
    // rows and 8 rows of x. The kernel reads only its weights before
    // `pdl_wait`.
    unsafe { launch(dev, &f, cfg, &mut a, true, "matmul_streamed") }
}

/// The first launch of a mapped or chained decode step (fused.cu,
/// `step_start`): the token and position read from `input`, the device
/// address of two `u32`s; the position stored to `pos`, the token's embedding
/// row into `x` and, with `table`, RoPE's cosines and sines at the position
/// (as [`rope_table`] at `base`). The same values as the token and
/// position uploaded, then [`embedding`](super::embedding) and
/// [`rope_table`].
///
/// # Safety
/// `input` is the device address of two `u32`s, in page-locked host memory
/// or the device's, holding the step's token (a valid row of `table`) and
/// position, which live, and which the host does not write, until the
/// launch (or a graph recording it) has run.
pub unsafe fn step_start(
    dev: &Device,
    input: u64,
    pos: &mut CudaViewMut<u32>,
    table: &DeviceMatrix,
    x: &mut CudaViewMut<f32>,
    rope: Option<(&mut CudaViewMut<f32>, f32)>,
    head_dim: usize,
) -> Result<(), CudaError> {
    check("step_start pos", pos.len(), 1)?;
    check("step_start x", x.len(), table.cols)?;
    let f = dev.function(Family::Fused, "step_start")?;
    let (ty, n, hd) = (table.type_id(), table.cols as i32, head_dim as i32);
    let mut a = KernelArgs::default();
    a.val(&input)
        .buf(dev, &*pos)
        .buf(dev, &table.data)
        .val(&ty)
        .val(&n)
        .buf(dev, &*x);
    let base = match rope {
        Some((cs, base)) => {
            check("step_start rope table", cs.len(), head_dim)?;
            a.buf(dev, &*cs);
            base
        }
        None => {
            a.null();
            0.0
        }
    };
    a.val(&hd).val(&base);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `input` as the caller vouches, pos one position, x a row of
    // the table's width and the table `head_dim` floats (checked above).
    // The kernel reads and writes nothing before `pdl_wait`.
    unsafe { launch(dev, &f, cfg, &mut a, true, "step_start") }
}

/// The last launch of a chained decode step (fused.cu, `step_next`): the
/// greedy token of `logits` (the index of the largest, the first on ties,
/// NaN never winning: [`crate::generate::argmax`]'s pick) stored as the
/// next step's token in `input`'s first `u32` with its position, the
/// second, one past; and stored at that step's position in `toks`.
///
/// # Safety
/// `input` is the device address of the two `u32`s the next
/// [`step_start`] reads (token, position); `toks` that of at least
/// `position + 1` `u32`s (page-locked host memory, or the device's). Both
/// live, and nothing else writes them, until the launch (or a graph
/// recording it) has run.
pub unsafe fn step_next(
    dev: &Device,
    logits: &CudaView<f32>,
    input: u64,
    toks: u64,
) -> Result<(), CudaError> {
    let n = i32::try_from(logits.len())
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| CudaError::Shape(format!("step_next: {} logits", logits.len())))?;
    let f = dev.function(Family::Fused, "step_next")?;
    let mut a = KernelArgs::default();
    a.buf(dev, logits).val(&n).val(&input).val(&toks);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (STEP_NEXT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the logits hold `n` floats; `input` and `toks` as the caller
    // vouches. The kernel reads and writes nothing before `pdl_wait`.
    unsafe { launch(dev, &f, cfg, &mut a, true, "step_next") }
}

/// `step_next`'s block (fused.cu's `STEP_NEXT_THREADS`).
const STEP_NEXT_THREADS: u32 = 1024;

/// `s = swiglu(norm(x) Wg^T, norm(x) Wu^T)`: the FFN's gate, up and gated
/// product in one launch, `s` `[rows, Wg.rows]`.
pub fn gate_up_swiglu(
    dev: &Device,
    gate: &DeviceMatrix,
    up: &DeviceMatrix,
    x: &CudaView<f32>,
    norm: Option<Norm>,
    s: &mut CudaViewMut<f32>,
    rows: usize,
) -> Result<(), CudaError> {
    if gate.rows != up.rows {
        return Err(CudaError::Shape(format!(
            "gate_up_swiglu: {} has {} rows, {} has {}",
            gate.name, gate.rows, up.name, up.rows
        )));
    }
    check("gate_up_swiglu s", s.len(), rows * gate.rows)?;
    let half = MATMUL_F32_OUTS / 2;
    let weight_bytes =
        half * (gate.ggml_type.row_bytes(gate.cols) + up.ggml_type.row_bytes(up.cols));
    let f = Fused {
        mode: SWIGLU,
        ws: [gate, up, up],
        n: [gate.rows, up.rows, 0],
        weight_bytes,
        rows,
    };
    f.launch(dev, x, norm, None, [Some(s), None, None], None, 0, 0.0)
}

/// Where [`qkv_rope`] puts its outputs: q `[rows, Wq.rows]`, and this
/// layer's key and value caches (`[capacity, Wk.rows]`), written at the
/// rows' positions.
pub struct QkvOut<'a, 'b> {
    /// The rotated queries.
    pub q: &'a mut CudaViewMut<'b, f32>,
    /// The layer's key cache.
    pub k_cache: &'a mut CudaViewMut<'b, f32>,
    /// The layer's value cache.
    pub v_cache: &'a mut CudaViewMut<'b, f32>,
}

/// q, k and v of `norm(x)` in one launch, q and k rotated by RoPE
/// (interleaved pairs, row r at `pos[r]`), k and v written into the caches
/// at `pos[r]`: attn_norm, the projections, RoPE and the cache write of one
/// layer. The caller keeps every position below the caches' capacity.
#[allow(clippy::too_many_arguments)]
pub fn qkv_rope(
    dev: &Device,
    ws: [&DeviceMatrix; 3],
    x: &CudaView<f32>,
    norm: Option<Norm>,
    out: QkvOut,
    pos: &CudaView<u32>,
    head_dim: usize,
    base: f32,
    rows: usize,
) -> Result<(), CudaError> {
    qkv_rope_tabled(dev, ws, x, norm, out, pos, None, head_dim, base, rows)
}

/// [`qkv_rope`] with RoPE's cosines and sines read from `table`
/// ([`rope_table`]'s for these rows' positions, `head_dim` and `base`)
/// rather than computed in every block: the same values, so the same bits,
/// and a forward computes them once for all its layers. `None` is
/// [`qkv_rope`].
#[allow(clippy::too_many_arguments)]
pub fn qkv_rope_tabled(
    dev: &Device,
    ws: [&DeviceMatrix; 3],
    x: &CudaView<f32>,
    norm: Option<Norm>,
    out: QkvOut,
    pos: &CudaView<u32>,
    table: Option<&CudaView<f32>>,
    head_dim: usize,
    base: f32,
    rows: usize,
) -> Result<(), CudaError> {
    let [wq, wk, wv] = ws;
    if let Some(t) = table {
        check("qkv_rope rope table", t.len(), rows * head_dim)?;
    }
    if !head_dim.is_multiple_of(2) || wq.rows % head_dim != 0 || wk.rows % head_dim != 0 {
        return Err(CudaError::Shape(format!(
            "qkv_rope: {} and {} rows are not whole heads of an even head_dim {head_dim}",
            wq.name, wk.name
        )));
    }
    check("qkv_rope q", out.q.len(), rows * wq.rows)?;
    check("qkv_rope k cache", out.k_cache.len(), wk.rows)?;
    check("qkv_rope v cache", out.v_cache.len(), wv.rows)?;
    check("qkv_rope pos", pos.len(), rows)?;
    let weight_bytes = [wq, wk, wv]
        .iter()
        .map(|w| MATMUL_F32_OUTS * w.ggml_type.row_bytes(w.cols))
        .max()
        .unwrap_or(0);
    let f = Fused {
        mode: QKV_ROPE,
        ws,
        n: [wq.rows, wk.rows, wv.rows],
        weight_bytes,
        rows,
    };
    let ys = [Some(out.q), Some(out.k_cache), Some(out.v_cache)];
    f.launch(dev, x, norm, None, ys, Some((pos, table)), head_dim, base)
}

/// RoPE's cosine and sine of every pair of a head (`head_dim / 2`) at each
/// of `rows` positions `pos[r]`, into `table` (`[rows, head_dim]`, cosine
/// then sine), for [`qkv_rope_tabled`].
pub fn rope_table(
    dev: &Device,
    pos: &CudaView<u32>,
    table: &mut CudaViewMut<f32>,
    rows: usize,
    head_dim: usize,
    base: f32,
) -> Result<(), CudaError> {
    check("rope_table pos", pos.len(), rows)?;
    check("rope_table table", table.len(), rows * head_dim)?;
    let f = dev.function(Family::Fused, "rope_table")?;
    let (r, hd) = (rows as i32, head_dim as i32);
    let mut b = dev.stream().launch_builder(&f);
    b.arg(pos).arg(table).arg(&r).arg(&hd).arg(&base);
    let pairs = rows * head_dim / 2;
    let cfg = LaunchConfig {
        grid_dim: (pairs.div_ceil(128).max(1) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: pos holds `rows` positions and table `rows * head_dim` floats
    // (checked above); the kernel writes pairs below rows * head_dim / 2.
    unsafe { b.launch(cfg) }.map_err(launch_err("rope_table"))?;
    Ok(())
}

/// One `matmul_fused` launch: its mode, matrices (unused ones repeat the
/// last), their output rows (0 for none) and a block's weight bytes.
struct Fused<'m> {
    mode: i32,
    ws: [&'m DeviceMatrix; 3],
    n: [usize; 3],
    weight_bytes: usize,
    rows: usize,
}

impl Fused<'_> {
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        dev: &Device,
        x: &CudaView<f32>,
        norm: Option<Norm>,
        resid: Option<&CudaView<f32>>,
        ys: [Option<&mut CudaViewMut<f32>>; 3],
        pos: Option<(&CudaView<u32>, Option<&CudaView<f32>>)>,
        head_dim: usize,
        base: f32,
    ) -> Result<(), CudaError> {
        let (ws, rows) = (self.ws, self.rows);
        let cols = ws[0].cols;
        for w in ws {
            if w.cols != cols {
                return Err(CudaError::Shape(format!(
                    "matmul_fused: {} has {} columns, {} has {cols}",
                    w.name, w.cols, ws[0].name
                )));
            }
        }
        check("matmul_fused x", x.len(), rows * cols)?;
        if let Some(n) = &norm {
            check("matmul_fused norm weight", n.weight.len(), cols)?;
        }
        if !fused_fits(cols, rows) {
            return Err(CudaError::Shape(format!(
                "matmul_fused: {} rows of {cols} inputs do not fit shared memory",
                rows.min(8)
            )));
        }
        let staged_bytes = self.weight_bytes.div_ceil(16) * 16 + x_bytes(cols, rows);
        let deq_bytes = dequant_bytes(dev, self.weight_bytes, cols, rows);
        let (staged, shared) = match deq_bytes {
            Some(b) => (2, b),
            None if staged_bytes <= MATMUL_MAX_STAGED => (1, staged_bytes),
            None => (0, x_bytes(cols, rows)),
        };
        let f = dev.function(Family::Fused, "matmul_fused")?;
        raise_shared(&f, shared, "matmul_fused")?;
        let ty = |i: usize| ws[i].ggml_type.id() as i32;
        let (t0, t1, t2) = (ty(0), ty(1), ty(2));
        let [n0, n1, n2] = self.n.map(|n| n as i32);
        let (eps, hd, r, c, st) = (
            norm.map_or(0.0, |n| n.eps),
            head_dim as i32,
            rows as i32,
            cols as i32,
            staged,
        );
        let mut a = KernelArgs::default();
        a.val(&self.mode);
        for w in ws {
            a.buf(dev, &w.data);
        }
        a.val(&t0).val(&t1).val(&t2).val(&n0).val(&n1).val(&n2);
        a.buf(dev, x);
        match &norm {
            Some(n) => a.buf(dev, n.weight),
            None => a.null(),
        };
        a.val(&eps);
        match resid {
            Some(r) => a.buf(dev, r),
            None => a.null(),
        };
        for y in ys {
            match y {
                Some(y) => a.buf(dev, &*y),
                None => a.null(),
            };
        }
        match pos {
            Some((p, _)) => a.buf(dev, p),
            None => a.null(),
        };
        match pos.and_then(|(_, t)| t) {
            Some(t) => a.buf(dev, t),
            None => a.null(),
        };
        a.val(&hd).val(&base).val(&r).val(&c).val(&st);
        a.val(&trigger_fused(dev));
        let per_block = match self.mode {
            SWIGLU => MATMUL_F32_OUTS / 2,
            _ => MATMUL_F32_OUTS,
        };
        let blocks: usize = self.n.iter().map(|n| n.div_ceil(per_block)).sum();
        let blocks = match self.mode {
            SWIGLU => self.n[0].div_ceil(per_block),
            _ => blocks,
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, rows.div_ceil(8) as u32, 1),
            block_dim: (MATMUL_F32_OUTS as u32 / 4 * 32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: every W holds rows x cols of its type (checked at upload);
        // x, the norm weight, resid and the outputs hold what the shapes
        // read and write (checked above and by the public launchers; the
        // caches' positions are the caller's, as for kv_write; a RoPE table
        // holds rows x head_dim floats, checked by qkv_rope_tabled); pointers
        // passed as null are never read in the launch's mode. The kernel
        // reads only its weights before `pdl_wait`.
        unsafe { launch(dev, &f, cfg, &mut a, true, "matmul_fused") }
    }
}
