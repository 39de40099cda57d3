//! Model loading and the instrumented forwards of taptree.
//!
//! [`load::load_model`] reads a GGUF file or a Hugging Face checkpoint into
//! [`ModelWeights`] (quantized tensors as [`QTensor`], dequantized bit for bit
//! as ggml does in [`quant`]) with its [`tokenizer`]; [`fetch`] resolves
//! `smollm2`, `gemma3-270m` and the seeded [`fixtures`]. A model family is
//! one layer description ([`ModelFamily`]: llama's, or [`gemma3`]'s extra
//! norms, GeGLU, RoPE layout and windows) read by one forward skeleton.
//! [`backend::open`] gives a [`Forward`]: the CPU reference ([`cpu`]) or,
//! with the `cuda` feature, the CUDA forward (llama family only), both
//! tapping every stage of [`stages::for_config`] through `capture`, in f32,
//! q8 or f64 activations ([`Precision`], overridden per op family by
//! [`switches`]). [`generate`] runs greedy generation over either.
//!
//! ```
//! use kernels::{backend, fixtures, generate, switches::Switches, Precision};
//!
//! // A seeded two-layer model; any GGUF path works with `load::load_model`.
//! let weights = fixtures::weights("tiny-q").unwrap();
//! let mut fwd = backend::open("cpu", &weights, Precision::F32, &Switches::none()).unwrap();
//! let out = generate::greedy(fwd.as_mut(), &[1, 5, 9], 4, &[]).unwrap();
//! assert_eq!(out.tokens.len(), 4);
//! // Deterministic: the same run again gives the same tokens.
//! let mut again = backend::open("cpu", &weights, Precision::F32, &Switches::none()).unwrap();
//! assert_eq!(generate::greedy(again.as_mut(), &[1, 5, 9], 4, &[]).unwrap().tokens, out.tokens);
//! ```

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fetch;
pub mod fixtures;
pub mod forward;
pub mod gemma3;
pub mod generate;
pub mod gguf;
pub mod hf;
pub mod load;
pub mod model;
pub mod quant;
pub mod stages;
pub mod switches;
pub mod tokenizer;

pub use forward::{Forward, ForwardError, Precision};
pub use model::{LayerWeights, LlamaConfig, ModelFamily, ModelWeights, QTensor};
pub use quant::GgmlType;
