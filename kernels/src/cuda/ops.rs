//! One launcher per kernel, over device buffers: what the forward strings
//! together and what the differential tests call against the CPU ops.
//!
//! Shapes are row-major `[rows, width]`; every launcher checks the lengths it
//! is given, since a kernel reading past a buffer would not say so.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::device::{Device, Family};
use super::CudaError;
use model::quant::GgmlType;
use model::QTensor;

mod attend;
mod fused;
pub(crate) mod launch;
mod persist;
pub use attend::*;
pub use fused::*;
pub use persist::*;

/// Warps per block of the matmul kernels (`WARPS` in matmul.cu).
const MATMUL_WARPS: u32 = 4;
/// Output rows per block of `matmul_f32`: four per warp (eight lanes each).
pub(crate) const MATMUL_F32_OUTS: usize = 4 * MATMUL_WARPS as usize;
/// The most shared memory a `matmul_f32` block stages its operands in; past
/// it (wide float weights) the kernel reads them from global memory.
pub(crate) const MATMUL_MAX_STAGED: usize = 96 * 1024;

/// The weight types the kernels decode (`dequant_elem` in common.cuh).
pub fn supported(t: GgmlType) -> bool {
    matches!(
        t,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
    )
}

/// A weight matrix on the device, still in its file's block format.
pub struct DeviceMatrix {
    /// The weight's name in the model file (for messages).
    pub name: String,
    /// The block format of `data`.
    pub ggml_type: GgmlType,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Rows of blocks, as the file holds them.
    pub data: CudaSlice<u8>,
}

impl DeviceMatrix {
    /// Copies a weight to the device, refusing a type the kernels do not decode
    /// or bytes that do not fit its shape.
    pub fn upload(dev: &Device, t: &QTensor) -> Result<DeviceMatrix, CudaError> {
        if !supported(t.ggml_type) {
            return Err(CudaError::UnsupportedType {
                tensor: t.name.clone(),
                ggml_type: t.ggml_type,
            });
        }
        let (rows, cols) = (t.rows(), t.cols());
        let expected = rows * t.ggml_type.row_bytes(cols);
        if t.data.len() != expected || cols % t.ggml_type.block_size() != 0 {
            return Err(CudaError::Shape(format!(
                "{}: {} bytes for [{rows}, {cols}] {}, expected {expected}",
                t.name,
                t.data.len(),
                t.ggml_type
            )));
        }
        let data = dev
            .stream()
            .clone_htod(&t.data[..])
            .map_err(|e| CudaError::driver(&format!("upload {}", t.name), e))?;
        Ok(DeviceMatrix {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            rows,
            cols,
            data,
        })
    }

    fn type_id(&self) -> i32 {
        self.ggml_type.id() as i32
    }
}

/// An int8-quantized activation matrix (the `q8` precision): quants and,
/// per 32-element block, the f16-rounded scale, the sum of the quants, and
/// `block_q8_1`'s f16 `s = sum * scale`.
pub struct QuantizedActs {
    /// The int8 quants, one per element.
    pub q: CudaSlice<i8>,
    /// Per 32-element block, the f16-rounded scale.
    pub scales: CudaSlice<f32>,
    /// Per 32-element block, the sum of the quants.
    pub sums: CudaSlice<i32>,
    /// Per 32-element block, `block_q8_1`'s f16 `s = sum * scale`.
    pub s: CudaSlice<f32>,
}

impl QuantizedActs {
    /// Zeroed device buffers for `elems` activations and their `elems / 32`
    /// blocks.
    pub fn alloc(dev: &Device, elems: usize) -> Result<QuantizedActs, CudaError> {
        let s = dev.stream();
        let e = |e| CudaError::driver("alloc q8 activations", e);
        Ok(QuantizedActs {
            q: s.alloc_zeros(elems).map_err(e)?,
            scales: s.alloc_zeros(elems / 32).map_err(e)?,
            sums: s.alloc_zeros(elems / 32).map_err(e)?,
            s: s.alloc_zeros(elems / 32).map_err(e)?,
        })
    }
}

pub(crate) fn check(what: &str, have: usize, need: usize) -> Result<(), CudaError> {
    if have < need {
        return Err(CudaError::Shape(format!(
            "{what}: buffer holds {have} elements, the launch needs {need}"
        )));
    }
    Ok(())
}

fn grid(blocks: usize, threads: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared,
    }
}

/// Output blocks along x, one pass of `ROWS_PER_PASS` (8) rows per grid row.
fn matmul_grid(blocks: usize, rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks as u32, rows.div_ceil(8) as u32, 1),
        block_dim: (32 * MATMUL_WARPS, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn launch_err(kernel: &str) -> impl Fn(cudarc::driver::DriverError) -> CudaError + '_ {
    move |e| CudaError::driver(&format!("launch {kernel}"), e)
}

/// `out[r] = dequant(table[tokens[r]])`, `out` `[rows, n_embd]`.
pub fn embedding(
    dev: &Device,
    table: &DeviceMatrix,
    tokens: &CudaView<u32>,
    out: &mut CudaViewMut<f32>,
) -> Result<(), CudaError> {
    let rows = tokens.len();
    check("embedding out", out.len(), rows * table.cols)?;
    let f = dev.function(Family::Embedding, "embedding")?;
    let (ty, n) = (table.type_id(), table.cols as i32);
    let mut b = dev.stream().launch_builder(&f);
    b.arg(&table.data).arg(&ty).arg(&n).arg(tokens).arg(out);
    // SAFETY: the table is [vocab, cols] of its type (checked at upload), the
    // caller validated every token id against the vocabulary, and `out` holds
    // rows * cols floats (checked above).
    unsafe { b.launch(grid(rows, 256, 0)) }.map_err(launch_err("embedding"))?;
    Ok(())
}

/// RMSNorm of each row of `x` (`[rows, n]`) with weight `w` (`[n]`).
pub fn rms_norm(
    dev: &Device,
    x: &CudaView<f32>,
    w: &CudaView<f32>,
    y: &mut CudaViewMut<f32>,
    rows: usize,
    eps: f32,
) -> Result<(), CudaError> {
    let n = w.len();
    check("rms_norm x", x.len(), rows * n)?;
    check("rms_norm y", y.len(), rows * n)?;
    let f = dev.function(Family::Norm, "rms_norm")?;
    let ni = n as i32;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(x).arg(w).arg(y).arg(&ni).arg(&eps);
    // SAFETY: x and y hold rows * n floats, w holds n (checked above).
    unsafe { b.launch(grid(rows, 256, 0)) }.map_err(launch_err("rms_norm"))?;
    Ok(())
}

/// `y = x W^T` with f32 activations: `x` `[rows, W.cols]`, `y` `[rows, W.rows]`.
pub fn matmul_f32(
    dev: &Device,
    w: &DeviceMatrix,
    x: &CudaView<f32>,
    y: &mut CudaViewMut<f32>,
    rows: usize,
) -> Result<(), CudaError> {
    check(&format!("matmul {} x", w.name), x.len(), rows * w.cols)?;
    check(&format!("matmul {} y", w.name), y.len(), rows * w.rows)?;
    let f = dev.function(Family::Matmul, "matmul_f32")?;
    let (ty, r, i, o) = (w.type_id(), rows as i32, w.cols as i32, w.rows as i32);
    let (staged, shared) = staging(w, rows);
    raise_shared(&f, shared, "matmul_f32")?;
    let staged_flag = staged as i32;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(&w.data)
        .arg(&ty)
        .arg(x)
        .arg(y)
        .arg(&r)
        .arg(&i)
        .arg(&o)
        .arg(&staged_flag);
    let mut cfg = matmul_grid(w.rows.div_ceil(MATMUL_F32_OUTS), rows);
    if staged {
        cfg.shared_mem_bytes = shared as u32;
    }
    // SAFETY: W holds rows x cols of its type (checked at upload); x and y
    // hold what the shapes need (checked above).
    unsafe { b.launch(cfg) }.map_err(launch_err("matmul_f32"))?;
    Ok(())
}

/// Whether `matmul_f32` stages `w`'s rows and `rows` rows of x in shared
/// memory, and how many bytes that takes: the block's weight rows (rounded
/// up to 16 bytes), then up to 8 rows of x.
fn staging(w: &DeviceMatrix, rows: usize) -> (bool, usize) {
    let row_bytes = w.ggml_type.row_bytes(w.cols);
    let shared = (MATMUL_F32_OUTS * row_bytes).div_ceil(16) * 16 + rows.min(8) * w.cols * 4;
    if shared <= MATMUL_MAX_STAGED {
        (true, shared)
    } else {
        (false, 0)
    }
}

/// Lets `f` take `shared` bytes of dynamic shared memory: past 48 KiB of
/// static and dynamic together a kernel must opt in, and the kernels here
/// have up to a few KiB of static shared memory, so it opts in past 44.
pub(crate) fn raise_shared(
    f: &cudarc::driver::CudaFunction,
    shared: usize,
    what: &str,
) -> Result<(), CudaError> {
    if shared > 44 * 1024 {
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )
        .map_err(|e| CudaError::driver(&format!("{what}: raise shared memory"), e))?;
    }
    Ok(())
}

/// `ys[i] = x W_i^T` for two or three matrices of the same width against the
/// same `x`, in one launch (q, k, v; gate, up). Each output is bitwise what
/// [`matmul_f32`] gives.
pub fn matmul_f32_many(
    dev: &Device,
    ws: &[&DeviceMatrix],
    x: &CudaView<f32>,
    ys: &mut [CudaViewMut<f32>],
    rows: usize,
) -> Result<(), CudaError> {
    if !(2..=3).contains(&ws.len()) || ws.len() != ys.len() {
        return Err(CudaError::Shape(format!(
            "matmul_f32_many: {} matrices for {} outputs (2 or 3 each)",
            ws.len(),
            ys.len()
        )));
    }
    let cols = ws[0].cols;
    for (w, y) in ws.iter().zip(ys.iter()) {
        if w.cols != cols {
            return Err(CudaError::Shape(format!(
                "matmul_f32_many: {} has {} columns, {} has {cols}",
                w.name, w.cols, ws[0].name
            )));
        }
        check(&format!("matmul {} y", w.name), y.len(), rows * w.rows)?;
    }
    check("matmul_f32_many x", x.len(), rows * cols)?;
    let f = dev.function(Family::Matmul, "matmul_f32_x3")?;
    let st: Vec<(bool, usize)> = ws.iter().map(|w| staging(w, rows)).collect();
    let shared = st.iter().map(|s| s.1).max().unwrap_or(0);
    raise_shared(&f, shared, "matmul_f32_x3")?;
    let w2 = ws.get(2).unwrap_or(&ws[1]);
    let (t0, t1, t2) = (ws[0].type_id(), ws[1].type_id(), w2.type_id());
    let n = |i: usize| ws.get(i).map_or(0, |w| w.rows as i32);
    let (n0, n1, n2) = (n(0), n(1), n(2));
    let s = |i: usize| st.get(i).map_or(0, |s| s.0 as i32);
    let (s0, s1, s2) = (s(0), s(1), s(2));
    let (r, c) = (rows as i32, cols as i32);
    let blocks: usize = ws.iter().map(|w| w.rows.div_ceil(MATMUL_F32_OUTS)).sum();
    let (y01, y2) = ys.split_at_mut(2);
    let (y0, y1) = y01.split_at_mut(1);
    // No third output: a null pointer the kernel never reaches (n2 = 0
    // gives it no blocks).
    let null = 0u64;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(&ws[0].data).arg(&ws[1].data).arg(&w2.data);
    b.arg(&t0).arg(&t1).arg(&t2);
    b.arg(&mut y0[0]).arg(&mut y1[0]);
    match y2.first_mut() {
        Some(y) => b.arg(y),
        None => b.arg(&null),
    };
    b.arg(&n0).arg(&n1).arg(&n2);
    b.arg(&s0).arg(&s1).arg(&s2);
    b.arg(x).arg(&r).arg(&c);
    let mut cfg = matmul_grid(blocks, rows);
    cfg.shared_mem_bytes = shared as u32;
    // SAFETY: every W holds rows x cols of its type (checked at upload), x
    // holds rows x cols, every y rows x W.rows (checked above); the blocks
    // of a missing third matrix do not exist.
    unsafe { b.launch(cfg) }.map_err(launch_err("matmul_f32_x3"))?;
    Ok(())
}

/// Quantizes `x` (`elems` floats, a multiple of 32) to int8 blocks.
pub fn quantize_q8(
    dev: &Device,
    x: &CudaView<f32>,
    out: &mut QuantizedActs,
    elems: usize,
) -> Result<(), CudaError> {
    let nblocks = check_quantize("quantize_q8", x, out, elems, 32)?;
    let f = dev.function(Family::Matmul, "quantize_q8")?;
    let nb = nblocks as i32;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(x)
        .arg(&mut out.q)
        .arg(&mut out.scales)
        .arg(&mut out.sums)
        .arg(&mut out.s)
        .arg(&nb);
    // SAFETY: x and q hold elems values, scales, sums and s elems / 32
    // (checked above and at allocation); one warp per block, 8 warps per CTA.
    unsafe { b.launch(grid(nblocks.div_ceil(8), 256, 0)) }.map_err(launch_err("quantize_q8"))?;
    Ok(())
}

/// The checks of a quantizer's launch (`elems` a whole number of `block`s,
/// `x` and the quants holding them, one scale per block); the block count.
pub(crate) fn check_quantize(
    name: &str,
    x: &CudaView<f32>,
    out: &QuantizedActs,
    elems: usize,
    block: usize,
) -> Result<usize, CudaError> {
    if !elems.is_multiple_of(block) {
        return Err(CudaError::Shape(format!(
            "{name}: {elems} elements is not a whole number of {block}-element blocks"
        )));
    }
    check(&format!("{name} x"), x.len(), elems)?;
    check(&format!("{name} q"), out.q.len(), elems)?;
    check(&format!("{name} scales"), out.scales.len(), elems / block)?;
    Ok(elems / block)
}

/// `y = x W^T` with `x` quantized by [`quantize_q8`] (DP4A for Q8_0, Q4_0,
/// Q4_1 weights).
pub fn matmul_q8(
    dev: &Device,
    w: &DeviceMatrix,
    x: &QuantizedActs,
    y: &mut CudaViewMut<f32>,
    rows: usize,
) -> Result<(), CudaError> {
    if !w.cols.is_multiple_of(32) {
        return Err(CudaError::Shape(format!(
            "matmul_q8 {}: {} columns is not a whole number of 32-element blocks",
            w.name, w.cols
        )));
    }
    check(&format!("matmul_q8 {} x", w.name), x.q.len(), rows * w.cols)?;
    check(&format!("matmul_q8 {} y", w.name), y.len(), rows * w.rows)?;
    let f = dev.function(Family::Matmul, "matmul_q8")?;
    let (ty, r, i, o) = (w.type_id(), rows as i32, w.cols as i32, w.rows as i32);
    let mut b = dev.stream().launch_builder(&f);
    b.arg(&w.data)
        .arg(&ty)
        .arg(&x.q)
        .arg(&x.scales)
        .arg(&x.sums)
        .arg(&x.s)
        .arg(y)
        .arg(&r)
        .arg(&i)
        .arg(&o);
    let cfg = matmul_grid(w.rows.div_ceil(MATMUL_WARPS as usize), rows);
    // SAFETY: as matmul_f32, with the quantized activations sized by
    // QuantizedActs::alloc for at least rows * cols elements.
    unsafe { b.launch(cfg) }.map_err(launch_err("matmul_q8"))?;
    Ok(())
}

/// `out = silu(gate) * up` over `n` floats.
pub fn swiglu(
    dev: &Device,
    gate: &CudaView<f32>,
    up: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    n: usize,
) -> Result<(), CudaError> {
    elementwise(dev, Family::Ffn, "swiglu", gate, up, out, n)
}

/// `out = gelu_tanh(gate) * up` over `n` floats (Gemma's GeGLU).
pub fn geglu(
    dev: &Device,
    gate: &CudaView<f32>,
    up: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    n: usize,
) -> Result<(), CudaError> {
    elementwise(dev, Family::Ffn, "geglu", gate, up, out, n)
}

/// `x *= s` in place over `n` floats.
pub fn scale(dev: &Device, x: &mut CudaViewMut<f32>, s: f32, n: usize) -> Result<(), CudaError> {
    check("scale", x.len(), n)?;
    let f = dev.function(Family::Elementwise, "scale")?;
    let ni = n as i32;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(&s).arg(&ni);
    // SAFETY: x holds n floats (checked above).
    unsafe { l.launch(grid(n.div_ceil(256), 256, 0)) }.map_err(launch_err("scale"))?;
    Ok(())
}

/// `out = a + b` over `n` floats (the residual adds).
pub fn add(
    dev: &Device,
    a: &CudaView<f32>,
    b: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    n: usize,
) -> Result<(), CudaError> {
    elementwise(dev, Family::Elementwise, "add", a, b, out, n)
}

fn elementwise(
    dev: &Device,
    family: Family,
    name: &'static str,
    a: &CudaView<f32>,
    b: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    n: usize,
) -> Result<(), CudaError> {
    check(name, a.len().min(b.len()).min(out.len()), n)?;
    let f = dev.function(family, name)?;
    let ni = n as i32;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(a).arg(b).arg(out).arg(&ni);
    // SAFETY: all three buffers hold n floats (checked above).
    unsafe { l.launch(grid(n.div_ceil(256), 256, 0)) }.map_err(launch_err(name))?;
    Ok(())
}

/// Copies a device buffer to the host (synchronizing the stream).
pub fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
    dev: &Device,
    src: &CudaView<T>,
) -> Result<Vec<T>, CudaError> {
    let mut host = vec![T::default(); src.len()];
    dev.stream()
        .memcpy_dtoh(src, &mut host)
        .map_err(|e| CudaError::driver("copy to host", e))?;
    dev.stream()
        .synchronize()
        .map_err(|e| CudaError::driver("synchronize", e))?;
    Ok(host)
}

/// Copies host data into a new device buffer.
pub fn upload<T: cudarc::driver::DeviceRepr>(
    dev: &Device,
    src: &[T],
) -> Result<CudaSlice<T>, CudaError> {
    dev.stream()
        .clone_htod(src)
        .map_err(|e| CudaError::driver("copy to device", e))
}
