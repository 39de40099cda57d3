//! Model loading and instrumented forwards (being written).

pub mod model;
pub mod quant;
pub mod stages;

pub use model::{LayerWeights, LlamaConfig, ModelWeights, QTensor};
pub use quant::GgmlType;
