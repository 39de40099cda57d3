//! RoPE, attention and the KV-cache write: the launches that see positions.

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg};

use super::launch::{launch, trigger_attention, Forced, KernelArgs};
use super::{check, grid, launch_err, raise_shared, upload, DeviceMatrix};
use crate::cuda::device::{Device, EarlyLaunch, Family};
use crate::cuda::CudaError;
use model::RopeStyle;

/// RoPE in place on `x` (`[pos.len(), n_heads * head_dim]`), row r at `pos[r]`:
/// [`rope_qk`] with no k.
pub fn rope(
    dev: &Device,
    x: &mut CudaViewMut<f32>,
    pos: &CudaView<u32>,
    n_heads: usize,
    head_dim: usize,
    base: f32,
) -> Result<(), CudaError> {
    launch_rope(
        dev,
        RopeStyle::Interleaved,
        x,
        None,
        pos,
        n_heads,
        0,
        head_dim,
        base,
    )
}

/// RoPE of q (`[pos.len(), n_q * head_dim]`) and k (`[pos.len(), n_k *
/// head_dim]`) in one launch; each bitwise as by [`rope`].
#[allow(clippy::too_many_arguments)]
pub fn rope_qk(
    dev: &Device,
    q: &mut CudaViewMut<f32>,
    k: &mut CudaViewMut<f32>,
    pos: &CudaView<u32>,
    n_q: usize,
    n_k: usize,
    head_dim: usize,
    base: f32,
) -> Result<(), CudaError> {
    rope_qk_styled(
        dev,
        RopeStyle::Interleaved,
        q,
        k,
        pos,
        n_q,
        n_k,
        head_dim,
        base,
    )
}

/// [`rope_qk`] in either layout: pairs `(2i, 2i+1)` of each head
/// (`Interleaved`, llama's GGUF order) or `(i, i + head_dim / 2)` (`Halves`,
/// Gemma 3), each as the CPU's `rope_styled`.
#[allow(clippy::too_many_arguments)]
pub fn rope_qk_styled(
    dev: &Device,
    style: RopeStyle,
    q: &mut CudaViewMut<f32>,
    k: &mut CudaViewMut<f32>,
    pos: &CudaView<u32>,
    n_q: usize,
    n_k: usize,
    head_dim: usize,
    base: f32,
) -> Result<(), CudaError> {
    launch_rope(dev, style, q, Some(k), pos, n_q, n_k, head_dim, base)
}

/// The one `rope_qk` launch behind [`rope`] and [`rope_qk_styled`]; without
/// `k` the kernel is given q's buffer there and no k heads.
#[allow(clippy::too_many_arguments)]
fn launch_rope(
    dev: &Device,
    style: RopeStyle,
    q: &mut CudaViewMut<f32>,
    k: Option<&mut CudaViewMut<f32>>,
    pos: &CudaView<u32>,
    n_q: usize,
    n_k: usize,
    head_dim: usize,
    base: f32,
) -> Result<(), CudaError> {
    let rows = pos.len();
    check("rope q", q.len(), rows * n_q * head_dim)?;
    if let Some(k) = &k {
        check("rope k", k.len(), rows * n_k * head_dim)?;
    }
    let f = dev.function(Family::Rope, "rope_qk")?;
    let halves = (style == RopeStyle::Halves) as i32;
    let (nq, nk, d) = (n_q as i32, n_k as i32, head_dim as i32);
    // Without k, a pointer the kernel never dereferences (n_k = 0).
    let null = 0u64;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(q);
    match k {
        Some(k) => b.arg(k),
        None => b.arg(&null),
    };
    b.arg(pos).arg(&nq).arg(&nk).arg(&d).arg(&base).arg(&halves);
    // SAFETY: q and k hold rows * heads * head_dim floats (checked above);
    // with no k, n_k = 0 gives its heads no threads.
    unsafe { b.launch(grid(rows, 128, 0)) }.map_err(launch_err("rope_qk"))?;
    Ok(())
}

/// The shape of one attention launch.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query rows in the launch.
    pub rows: usize,
    /// Position of the first query row; row r attends to keys `0..=pos0 + r`.
    pub pos0: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
}

/// Causal GQA attention of `q` (`[rows, n_head * head_dim]`) over one
/// sequence's cache `k`, `v` (`[>= pos0 + rows, n_kv * head_dim]`).
pub fn attention(
    dev: &Device,
    q: &CudaView<f32>,
    k: &CudaView<f32>,
    v: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    s: AttentionShape,
) -> Result<(), CudaError> {
    attention_windowed(dev, q, k, v, out, s, None)
}

/// [`attention`] where row r sees only the last `window` positions
/// `pos0 + r + 1 - window ..= pos0 + r` (sliding-window attention, as the
/// CPU's `attention_windowed`); `None` sees them all.
pub fn attention_windowed(
    dev: &Device,
    q: &CudaView<f32>,
    k: &CudaView<f32>,
    v: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    s: AttentionShape,
    window: Option<usize>,
) -> Result<(), CudaError> {
    let pos = upload(dev, &[s.pos0 as u32])?;
    let keys = s.pos0 + s.rows;
    attention_at(dev, q, k, v, out, &pos.as_view(), s, window, keys)
}

/// [`attention_windowed`] with the first row's position read from the
/// device (`pos[0]`; `s.pos0` only sizes the checks): what a CUDA graph
/// replays at every position. The cache views hold at least `max_keys`
/// positions, and no row may see more.
#[allow(clippy::too_many_arguments)]
pub fn attention_at(
    dev: &Device,
    q: &CudaView<f32>,
    k: &CudaView<f32>,
    v: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    pos: &CudaView<u32>,
    s: AttentionShape,
    window: Option<usize>,
    max_keys: usize,
) -> Result<(), CudaError> {
    let keys = check_attention(q, k, v, out, pos, s, window, max_keys)?;
    let shared = window.map_or(keys, |w| w.min(keys)) * 4;
    let f = dev.function(Family::Attention, "attention")?;
    raise_shared(&f, shared, "attention")?;
    let shared = shared as u32;
    // As the CPU: the scale rounded once from f64.
    let scale = (1.0 / (s.head_dim as f64).sqrt()) as f32;
    let (nh, nkv, hd) = (s.n_head as i32, s.n_kv as i32, s.head_dim as i32);
    let win = window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
    let mut b = dev.stream().launch_builder(&f);
    b.arg(q)
        .arg(k)
        .arg(v)
        .arg(out)
        .arg(pos)
        .arg(&nh)
        .arg(&nkv)
        .arg(&hd)
        .arg(&scale)
        .arg(&win);
    let cfg = LaunchConfig {
        grid_dim: (s.rows as u32, s.n_head as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: shared,
    };
    // SAFETY: every buffer holds what the shape reads (checked above, the
    // caller keeping pos[0] + rows <= max_keys); the scores of the longest
    // row fit the dynamic shared memory requested.
    unsafe { b.launch(cfg) }.map_err(launch_err("attention"))?;
    Ok(())
}

/// The checks of both attention launches: the window, the heads'
/// grouping and every buffer's length; the keys the cache must hold.
#[allow(clippy::too_many_arguments)]
fn check_attention(
    q: &CudaView<f32>,
    k: &CudaView<f32>,
    v: &CudaView<f32>,
    out: &CudaViewMut<f32>,
    pos: &CudaView<u32>,
    s: AttentionShape,
    window: Option<usize>,
    max_keys: usize,
) -> Result<usize, CudaError> {
    if window == Some(0) {
        return Err(CudaError::Shape(
            "attention: a window of 0 positions".into(),
        ));
    }
    if s.n_kv == 0 || !s.n_head.is_multiple_of(s.n_kv) {
        return Err(CudaError::Shape(format!(
            "attention: {} query heads do not group over {} kv heads",
            s.n_head, s.n_kv
        )));
    }
    let width = s.n_head * s.head_dim;
    let keys = max_keys.max(s.pos0 + s.rows);
    check("attention q", q.len(), s.rows * width)?;
    check("attention out", out.len(), s.rows * width)?;
    check("attention k", k.len(), keys * s.n_kv * s.head_dim)?;
    check("attention v", v.len(), keys * s.n_kv * s.head_dim)?;
    check("attention pos", pos.len(), 1)?;
    Ok(keys)
}

/// Values staged per block of [`attention_split_at`], at most: 32 KiB.
const SPLIT_VALUE_FLOATS: usize = 8 * 1024;

/// Keys staged per block of [`attention_split_at`] before its wait, at
/// most: 128 KiB (SmolLM2's first 481 positions, Gemma 3 270M's 126).
const SPLIT_KEY_FLOATS: usize = 32 * 1024;

/// Floats after each staged key (attention.cu's `KEY_PAD`): a row of a
/// head's width plus these.
const KEY_PAD: usize = 4;

/// The static shared memory of `attention_split` and some to spare, kept
/// out of what its keys may take.
const SPLIT_STATIC_BYTES: usize = 1024;

/// The key staging forced on or off: `TAPTREE_CUDA_KEY_STAGING=1|0`, or
/// [`set_key_staging`].
static KEY_STAGING: Forced = Forced::new("TAPTREE_CUDA_KEY_STAGING");

/// Whether [`attention_split_at`]'s blocks copy the keys of earlier
/// forwards into shared memory before their wait (attention.cu,
/// `attention_split_block`): where they are launched early, unless
/// forced. The same bits either way.
pub fn key_staging(dev: &Device) -> bool {
    KEY_STAGING
        .get()
        .unwrap_or_else(|| dev.early_launch() != EarlyLaunch::Off)
}

/// Forces the key staging on or off (`None`: as the launch mode says)
/// for the launches that follow; a CUDA graph keeps what it captured.
pub fn set_key_staging(on: Option<bool>) {
    KEY_STAGING.set(on);
}

/// The keys a block of [`attention_split_at`] stages: up to `seen` (the
/// most any row sees), within [`SPLIT_KEY_FLOATS`] and what the device
/// lets a block hold beside `shared` bytes; none where the staging is off
/// or the cache `k` is not 16-byte aligned.
fn staged_keys(dev: &Device, k: u64, head_dim: usize, seen: usize, shared: usize) -> usize {
    if !key_staging(dev) || !k.is_multiple_of(16) {
        return 0;
    }
    let room = dev
        .shared_optin()
        .saturating_sub(shared + SPLIT_STATIC_BYTES);
    let row = head_dim + KEY_PAD;
    seen.min(SPLIT_KEY_FLOATS / row).min(room / (row * 4))
}

/// The matrices [`attention_split_at`] can ask L2 to fetch, at most.
pub const PREFETCH_MATRICES: usize = 4;

/// attention.cu's `Prefetch`: byte ranges of device memory (pointers as
/// the driver gives them), by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct Prefetch {
    ptr: [u64; PREFETCH_MATRICES],
    bytes: [u64; PREFETCH_MATRICES],
}

// SAFETY: plain integers, laid out as the kernel's struct of four pointers
// and four 64-bit sizes.
unsafe impl cudarc::driver::DeviceRepr for Prefetch {}

/// [`attention_at`] over more blocks, each writing 16 dimensions of one
/// head (the `attention_split` kernel): every block computes its head's
/// scores and softmax as [`attention_at`] does and sums its outputs in the
/// same order, so the bits are the same; its values are staged in shared
/// memory while the scores are computed, and the keys of earlier forwards
/// are staged before the block waits for the launch ahead ([`key_staging`]).
/// Where the layout does not allow
/// it (a head of other than a multiple of 16 dimensions, a cache not
/// 16-byte aligned), it is [`attention_at`]. Its blocks also ask the L2
/// cache for the weights of `prefetch` (at most [`PREFETCH_MATRICES`]:
/// the matmuls that follow it), which changes no value.
#[allow(clippy::too_many_arguments)]
pub fn attention_split_at(
    dev: &Device,
    q: &CudaView<f32>,
    k: &CudaView<f32>,
    v: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    pos: &CudaView<u32>,
    s: AttentionShape,
    window: Option<usize>,
    max_keys: usize,
    prefetch: &[&DeviceMatrix],
) -> Result<(), CudaError> {
    if prefetch.len() > PREFETCH_MATRICES {
        return Err(CudaError::Shape(format!(
            "attention_split: {} matrices to prefetch, at most {PREFETCH_MATRICES}",
            prefetch.len()
        )));
    }
    let ds = 16;
    let kv_stride = s.n_kv * s.head_dim;
    let aligned = |p: u64| p.is_multiple_of(16);
    let (vp, _g) = v.device_ptr(dev.stream());
    let (kp, _gk) = k.device_ptr(dev.stream());
    if !s.head_dim.is_multiple_of(ds)
        || !kv_stride.is_multiple_of(4)
        || !aligned(vp)
        || window == Some(0)
    {
        return attention_at(dev, q, k, v, out, pos, s, window, max_keys);
    }
    let keys = check_attention(q, k, v, out, pos, s, window, max_keys)?;
    let seen = window.map_or(keys, |w| w.min(keys));
    let chunk = seen.min(SPLIT_VALUE_FLOATS / ds);
    let shared = (seen.div_ceil(4) * 4 + chunk * ds) * 4;
    let key_cap = staged_keys(dev, kp, s.head_dim, seen, shared);
    let shared = shared + key_cap * (s.head_dim + KEY_PAD) * 4;
    let f = dev.function(Family::Attention, "attention_split")?;
    raise_shared(&f, shared, "attention_split")?;
    let scale = (1.0 / (s.head_dim as f64).sqrt()) as f32;
    let (nh, nkv, hd) = (s.n_head as i32, s.n_kv as i32, s.head_dim as i32);
    let win = window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
    let (dsi, ch, mk, kc) = (ds as i32, chunk as i32, seen as i32, key_cap as i32);
    let mut pf = Prefetch {
        ptr: [0; PREFETCH_MATRICES],
        bytes: [0; PREFETCH_MATRICES],
    };
    for (i, m) in prefetch.iter().enumerate() {
        let (p, _g) = m.data.device_ptr(dev.stream());
        pf.ptr[i] = p;
        pf.bytes[i] = m.data.len() as u64;
    }
    let mut a = KernelArgs::default();
    a.buf(dev, q)
        .buf(dev, k)
        .buf(dev, v)
        .buf(dev, &*out)
        .buf(dev, pos);
    a.val(&nh).val(&nkv).val(&hd).val(&scale).val(&win);
    a.val(&dsi)
        .val(&ch)
        .val(&mk)
        .val(&kc)
        .val(&pf)
        .val(&trigger_attention(dev));
    // A key's score per thread: 256 threads past 128 keys take them in
    // one round (which thread scores a key changes no sum).
    let threads = if seen > 128 { 256 } else { 128 };
    let cfg = LaunchConfig {
        grid_dim: (s.rows as u32, s.n_head as u32, (s.head_dim / ds) as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    // SAFETY: as attention_at's; besides, the values' rows and the offsets
    // the kernel copies in 16-byte pieces are 16-byte aligned (checked
    // above: v's address, kv_stride, head_dim and ds multiples of 4 floats),
    // and the shared memory holds the longest row's scores (`seen` keys, no
    // row seeing more), `chunk` keys of ds values and `key_cap` keys of
    // head_dim + KEY_PAD floats (k's address, too, 16-byte aligned); the
    // prefetched ranges are whole device allocations, and a prefetch reads
    // nothing back. Before `pdl_wait` the kernel only prefetches and copies
    // the keys and values of positions before pos[0], which this forward
    // does not write.
    unsafe { launch(dev, &f, cfg, &mut a, true, "attention_split") }
}

/// Writes `rows` rows of new keys and values (`[rows, kv_width]`) into one
/// layer's cache (`[capacity, kv_width]`) at the positions `pos[..rows]`,
/// read from the device.
pub fn kv_write(
    dev: &Device,
    k: &CudaView<f32>,
    v: &CudaView<f32>,
    k_cache: &mut CudaViewMut<f32>,
    v_cache: &mut CudaViewMut<f32>,
    pos: &CudaView<u32>,
    kv_width: usize,
) -> Result<(), CudaError> {
    let rows = pos.len();
    check("kv_write k", k.len(), rows * kv_width)?;
    check("kv_write v", v.len(), rows * kv_width)?;
    let f = dev.function(Family::Attention, "kv_write")?;
    let w = kv_width as i32;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(k).arg(v).arg(k_cache).arg(v_cache).arg(pos).arg(&w);
    // SAFETY: k and v hold `rows` rows (checked above); the caller keeps
    // every pos[r] below the caches' capacity.
    unsafe { b.launch(grid(rows, 256, 0)) }.map_err(launch_err("kv_write"))?;
    Ok(())
}
