//! The CUDA forward: the same llama forward as [`crate::cpu`], on one GPU,
//! through cudarc's driver API and kernels compiled at run time by NVRTC.
//!
//! - [`device`]: the context, the stream, NVRTC compilation with a disk cache
//!   of PTX keyed by source hash and device architecture.
//! - [`ops`]: one launcher per kernel (`embedding`, `rms_norm`, `matmul_f32`
//!   and `matmul_f32_many`, `quantize_q8` + `matmul_q8`, `rope` and `rope_qk`,
//!   `attention`, `swiglu`, `add`), each
//!   beside its `.cu` source in this directory and its CPU twin in
//!   `crate::cpu`; the differential tests (`kernels/tests/cuda_kernels.rs`)
//!   hold each against the CPU op.
//! - [`forward`]: [`CudaForward`], which strings the kernels together, taps
//!   every stage of [`crate::stages::llama`] (copying a device buffer to the
//!   host only when the tap is armed and selected), and runs batched decode
//!   of several sequences in one forward.
//!
//! Opening without a driver is an error, never a panic:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let weights: model::ModelWeights = todo!();
//! use kernels::{switches::Switches, Precision};
//! let mut fwd = kernels::cuda::open(&weights, Precision::F32, &Switches::none())?;
//! let logits = fwd.forward(None, &[1, 2, 3], 0)?;
//! # Ok(()) }
//! ```

pub mod device;
pub mod forward;
pub mod ops;
pub mod q8;
pub mod taps;
pub mod tp;

pub use device::{Device, EarlyLaunch};
pub use forward::CudaForward;
pub use taps::tap_copy_stats;

use crate::forward::{Forward, ForwardError, Precision};
use crate::switches::Switches;
use model::quant::GgmlType;
use model::ModelWeights;

/// Why the GPU could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver library could be loaded: no GPU, or no NVIDIA driver.
    #[error("no CUDA driver found: could not load any of {searched}")]
    NoDriver {
        /// The library names tried.
        searched: String,
    },
    /// A kernel needed compiling and NVRTC could not be loaded.
    #[error("no NVRTC library found to compile the kernels: could not load any of {searched} (add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)")]
    NoNvrtc {
        /// The library names tried.
        searched: String,
    },
    /// NVRTC rejected a kernel source.
    #[error("{file}: NVRTC compilation failed: {log}")]
    Compile {
        /// The `.cu` file.
        file: &'static str,
        /// NVRTC's compile log.
        log: String,
    },
    /// A driver call failed.
    #[error("cuda: {op}: {message}")]
    Driver {
        /// The call that failed (`launch rms_norm`, `upload blk.0.attn_q.weight`).
        op: String,
        /// The driver's message.
        message: String,
    },
    /// A weight is in a format the kernels do not decode.
    #[error("{tensor}: weight type {ggml_type} has no CUDA kernel (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q2_K..Q6_K)")]
    UnsupportedType {
        /// The weight's name.
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
    },
    /// A launch's buffers do not fit its shape.
    #[error("cuda: {0}")]
    Shape(String),
}

impl CudaError {
    pub(crate) fn driver(op: &str, e: cudarc::driver::DriverError) -> CudaError {
        CudaError::Driver {
            op: op.to_string(),
            message: e.to_string(),
        }
    }
}

impl From<CudaError> for ForwardError {
    fn from(e: CudaError) -> ForwardError {
        ForwardError::Device(e.to_string())
    }
}

/// Opens a CUDA forward on GPU 0 (`TAPTREE_CUDA_DEVICE` picks another) with
/// the weights uploaded in their file formats.
pub fn open(
    weights: &ModelWeights,
    precision: Precision,
    switches: &Switches,
) -> Result<Box<dyn Forward>, ForwardError> {
    let ordinal = match std::env::var("TAPTREE_CUDA_DEVICE") {
        Ok(v) => v.trim().parse::<usize>().map_err(|_| {
            ForwardError::Device(format!(
                "TAPTREE_CUDA_DEVICE: bad value {v:?}: expected a GPU index"
            ))
        })?,
        Err(_) => 0,
    };
    let dev = Device::open(ordinal)?;
    Ok(Box::new(CudaForward::new(
        dev, weights, precision, switches,
    )?))
}
