use std::path::PathBuf;

use crate::gguf::GgufError;
use crate::tokenizer::TokenizerError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Hf(#[from] HfError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file nor a directory holding config.json")]
    NotAModel { path: PathBuf },
    #[error("{path}: architecture {arch:?} is not supported (supported: llama, qwen2 without sliding window, gemma3)")]
    UnsupportedArchitecture { path: PathBuf, arch: String },
    #[error("{path}: metadata {key} is missing")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata {key}: {reason}")]
    BadKey {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: tensor {tensor:?} is missing")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor {tensor:?} has shape {got:?}, expected {expected:?}")]
    Shape {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
}

/// Why an HF checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: {key}: {reason}")]
    BadConfig {
        path: PathBuf,
        key: &'static str,
        reason: String,
    },
    #[error("{path}: not a safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("{path}: tensor {tensor:?} has dtype {dtype}, supported: F32, F16, BF16")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{path}: no *.safetensors files")]
    NoWeights { path: PathBuf },
    #[error("{path}: tensor {tensor:?} appears in more than one file")]
    DuplicateTensor { path: PathBuf, tensor: String },
}
