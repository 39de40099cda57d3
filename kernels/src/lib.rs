//! Model loading and instrumented forwards (being written).

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fetch;
pub mod fixtures;
pub mod forward;
pub mod gguf;
pub mod hf;
pub mod load;
pub mod generate;
pub mod model;
pub mod quant;
pub mod stages;
pub mod tokenizer;
pub mod switches;

pub use forward::{Forward, ForwardError, Precision};
pub use model::{LayerWeights, LlamaConfig, ModelWeights, QTensor};
pub use quant::GgmlType;
