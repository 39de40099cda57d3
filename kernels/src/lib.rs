//! Model loading and instrumented forwards (being written).

pub mod forward;
pub mod model;
pub mod quant;
pub mod stages;

pub use forward::{Forward, ForwardError, Precision};
pub use model::{LayerWeights, LlamaConfig, ModelWeights, QTensor};
pub use quant::GgmlType;
