//! The q8 mode's launchers for weights without a DP4A path in `matmul_q8`
//! (Q5_0 and the K-quants): Q8_K activations (blocks of 256) for K-quant
//! weights, and the matmul that sums in the CPU q8 mode's order.
//!
//! Which weight takes which path is [`Q8Dot::of`]; the forward quantizes an
//! input once per activation format its weights need.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::device::{Device, Family};
use super::ops::{check, check_quantize, DeviceMatrix, QuantizedActs};
use super::CudaError;
use model::quant::GgmlType;

/// How a block-quantized weight meets int8 activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Dot {
    /// Q8_0 activations and llama.cpp's integer block sums (`__dp4a`):
    /// Q4_0, Q4_1, Q8_0 ([`super::ops::matmul_q8`]).
    Dp4a,
    /// Activations in blocks of the weight's block size (Q8_0 for 32, Q8_K
    /// for 256), dotted in the CPU's order ([`matmul_q8_ordered`]): bitwise
    /// the CPU's q8 mode.
    Ordered {
        /// Elements per activation block: 32 (Q8_0) or 256 (Q8_K).
        block: usize,
    },
}

impl Q8Dot {
    /// The path of a weight type; `None` for float weights, which meet f32
    /// activations in q8 as on the CPU.
    pub fn of(t: GgmlType) -> Option<Q8Dot> {
        match t {
            _ if !t.is_quantized() => None,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => Some(Q8Dot::Dp4a),
            _ => Some(Q8Dot::Ordered {
                block: t.block_size(),
            }),
        }
    }

    /// The activation block size this path quantizes to.
    pub fn block(self) -> usize {
        match self {
            Q8Dot::Dp4a => 32,
            Q8Dot::Ordered { block } => block,
        }
    }
}

/// Quantizes `x` (`elems` floats, a multiple of 256) to Q8_K into `out`:
/// quants in `out.q`, one f32 scale per 256 in `out.scales` (sums and `s`
/// are left as they were: the ordered dot does not read them).
pub fn quantize_q8_k(
    dev: &Device,
    x: &CudaView<f32>,
    out: &mut QuantizedActs,
    elems: usize,
) -> Result<(), CudaError> {
    let nblocks = check_quantize("quantize_q8_k", x, out, elems, 256)?;
    let f = dev.function(Family::Matmul, "quantize_q8_k")?;
    let nb = nblocks as i32;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(x).arg(&mut out.q).arg(&mut out.scales).arg(&nb);
    let cfg = LaunchConfig {
        grid_dim: (nblocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x and q hold elems values, scales at least elems / 256
    // (checked above); one CTA of 256 threads per block.
    unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver("launch quantize_q8_k", e))?;
    Ok(())
}

/// `y = x W^T` with `x` quantized to `W`'s block size ([`super::ops::quantize_q8`]
/// for 32-blocks, [`quantize_q8_k`] for 256), summed in the CPU q8 mode's
/// order: bitwise the CPU's `matmul_with_mins(.., Act::Q8)` for every
/// block-quantized type but Q4_1 (whose min term the CPU takes from
/// `block_q8_1`'s f16 sum).
pub fn matmul_q8_ordered(
    dev: &Device,
    w: &DeviceMatrix,
    x: &QuantizedActs,
    y: &mut CudaViewMut<f32>,
    rows: usize,
) -> Result<(), CudaError> {
    let block = w.ggml_type.block_size();
    if block == 1 || w.ggml_type == GgmlType::Q4_1 {
        return Err(CudaError::Shape(format!(
            "matmul_q8_ordered {}: {} has no ordered q8 dot",
            w.name, w.ggml_type
        )));
    }
    check(
        &format!("matmul_q8_ordered {} x", w.name),
        x.q.len(),
        rows * w.cols,
    )?;
    check(
        &format!("matmul_q8_ordered {} d", w.name),
        x.scales.len(),
        rows * w.cols / block,
    )?;
    check(
        &format!("matmul_q8_ordered {} y", w.name),
        y.len(),
        rows * w.rows,
    )?;
    let f = dev.function(Family::Matmul, "matmul_q8_ordered")?;
    let (ty, r, i, o) = (
        w.ggml_type.id() as i32,
        rows as i32,
        w.cols as i32,
        w.rows as i32,
    );
    let mut b = dev.stream().launch_builder(&f);
    b.arg(&w.data)
        .arg(&ty)
        .arg(&x.q)
        .arg(&x.scales)
        .arg(y)
        .arg(&r)
        .arg(&i)
        .arg(&o);
    // 16 outputs per CTA (four warps of four), one grid row per 8 rows.
    let cfg = LaunchConfig {
        grid_dim: (w.rows.div_ceil(16) as u32, rows.div_ceil(8) as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: W holds rows x cols of its type (checked at upload); the
    // quants, scales and y hold what the shapes read (checked above).
    unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver("launch matmul_q8_ordered", e))?;
    Ok(())
}
