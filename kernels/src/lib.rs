//! The instrumented forwards of taptree.
//!
//! [`backend::open`] gives a [`Forward`] over a model the `model` crate
//! loaded: the CPU reference ([`cpu`]) or, with the `cuda` feature, the CUDA
//! forward (llama family only), both tapping every stage of
//! [`stages::for_config`] through `capture`, in f32, q8 or f64 activations
//! ([`Precision`], overridden per op family by [`switches`]). One forward
//! skeleton reads the family's description ([`model::ModelFamily`]).
//! [`generate`] runs greedy generation over either.
//!
//! ```
//! use kernels::{backend, generate, switches::Switches, Precision};
//!
//! // A seeded model; any GGUF path works with `model::load::load_model`.
//! let weights = fixtures::weights("tiny-q").unwrap();
//! let mut fwd = backend::open("cpu", &weights, Precision::F32, &Switches::none()).unwrap();
//! let out = generate::greedy(fwd.as_mut(), &[1, 5, 9], 4, &[]).unwrap();
//! assert_eq!(out.tokens.len(), 4);
//! // Deterministic: the same run again gives the same tokens.
//! let mut again = backend::open("cpu", &weights, Precision::F32, &Switches::none()).unwrap();
//! assert_eq!(generate::greedy(again.as_mut(), &[1, 5, 9], 4, &[]).unwrap().tokens, out.tokens);
//! ```

#![deny(missing_docs)]

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod forward;
pub mod generate;
pub mod ggml_build;
mod knobs;
pub mod stages;
pub mod switches;

pub use forward::{Forward, ForwardError, Precision};
