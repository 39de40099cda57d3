//! Opening a forward by backend name.

use crate::cpu::CpuForward;
use crate::forward::{Forward, ForwardError, Precision};
use crate::switches::Switches;
use model::ModelWeights;

/// The backends this build knows, for `--backend`.
pub const BACKENDS: [&str; 2] = ["cpu", "cuda"];

/// Opens the `name` backend (`"cpu"` or `"cuda"`) over `weights`.
pub fn open(
    name: &str,
    weights: &ModelWeights,
    precision: Precision,
    switches: &Switches,
) -> Result<Box<dyn Forward>, ForwardError> {
    if switches.tp_skip().is_some() {
        return Err(ForwardError::Unsupported(format!(
            "{}: a tensor-parallel fault needs --tp 2 or more",
            crate::switches::TP_SKIP_VAR
        )));
    }
    match name {
        "cpu" => Ok(Box::new(CpuForward::new(weights, precision, switches)?)),
        "cuda" => open_cuda(weights, precision, switches),
        other => Err(ForwardError::Unsupported(format!(
            "{other}: unknown backend (expected cpu or cuda)"
        ))),
    }
}

/// Opens the `name` backend split over `tp` tensor-parallel ranks: `tp`
/// 1 is [`open`] (the one-device forward, unchanged); more is the CPU's
/// simulated tensor parallelism ([`crate::cpu::tp`]) or the CUDA forward
/// over `tp` GPUs (`crate::cuda::tp`, with the `cuda` feature).
pub fn open_tp(
    name: &str,
    weights: &ModelWeights,
    precision: Precision,
    switches: &Switches,
    tp: usize,
) -> Result<Box<dyn Forward>, ForwardError> {
    match (name, tp) {
        (_, 1) => open(name, weights, precision, switches),
        ("cpu", _) => Ok(Box::new(crate::cpu::tp::TpForward::new(
            weights, precision, switches, tp,
        )?)),
        ("cuda", _) => open_cuda_tp(weights, precision, switches, tp),
        (other, _) => Err(ForwardError::Unsupported(format!(
            "{other}: unknown backend (expected cpu or cuda)"
        ))),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda_tp(
    weights: &ModelWeights,
    precision: Precision,
    switches: &Switches,
    tp: usize,
) -> Result<Box<dyn Forward>, ForwardError> {
    Ok(Box::new(crate::cuda::tp::CudaTpForward::new(
        weights, precision, switches, tp,
    )?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda_tp(
    weights: &ModelWeights,
    precision: Precision,
    switches: &Switches,
    _: usize,
) -> Result<Box<dyn Forward>, ForwardError> {
    open_cuda(weights, precision, switches)
}

#[cfg(feature = "cuda")]
fn open_cuda(
    weights: &ModelWeights,
    precision: Precision,
    switches: &Switches,
) -> Result<Box<dyn Forward>, ForwardError> {
    crate::cuda::open(weights, precision, switches)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(
    _: &ModelWeights,
    _: Precision,
    _: &Switches,
) -> Result<Box<dyn Forward>, ForwardError> {
    Err(ForwardError::Unsupported(
        "cuda: taptree was built without CUDA support; rebuild with `cargo build --release --features cuda`".into(),
    ))
}
