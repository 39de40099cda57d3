use std::path::PathBuf;

use crate::gguf::GgufError;
use crate::tokenizer::TokenizerError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The Hugging Face checkpoint could not be read.
    #[error(transparent)]
    Hf(#[from] HfError),
    /// The tokenizer the file describes could not be built.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Reading a file of the model failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The path is neither a GGUF file nor an HF directory.
    #[error("{path}: not a GGUF file nor a directory holding config.json")]
    NotAModel {
        /// The path given.
        path: PathBuf,
    },
    /// `general.architecture` (or HF `model_type`) names a model the forwards
    /// do not implement.
    #[error("{path}: architecture {arch:?} is not supported (supported: llama, qwen2 without sliding window, gemma3)")]
    UnsupportedArchitecture {
        /// The model file or directory.
        path: PathBuf,
        /// The architecture it names.
        arch: String,
    },
    /// A hyperparameter the forward needs is absent.
    #[error("{path}: metadata {key} is missing")]
    MissingKey {
        /// The model file or directory.
        path: PathBuf,
        /// The metadata key (GGUF) or config.json key (HF).
        key: String,
    },
    /// A hyperparameter is present but unusable (wrong type, zero, inconsistent).
    #[error("{path}: metadata {key}: {reason}")]
    BadKey {
        /// The model file or directory.
        path: PathBuf,
        /// The metadata or config key.
        key: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// A weight the architecture needs is absent.
    #[error("{path}: tensor {tensor:?} is missing")]
    MissingTensor {
        /// The model file or directory.
        path: PathBuf,
        /// The tensor's name in the file.
        tensor: String,
    },
    /// A weight's shape is not the one the hyperparameters imply.
    #[error("{path}: tensor {tensor:?} has shape {got:?}, expected {expected:?}")]
    Shape {
        /// The model file or directory.
        path: PathBuf,
        /// The tensor's name in the file.
        tensor: String,
        /// The shape the hyperparameters imply, outermost first.
        expected: Vec<usize>,
        /// The shape the file has, outermost first.
        got: Vec<usize>,
    },
}

/// Why an HF checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// Reading a file of the checkpoint failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// `config.json` (or another JSON file) does not parse.
    #[error("{path}: invalid JSON: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's message.
        message: String,
    },
    /// `config.json` is missing a key the loader needs or holds an unusable value.
    #[error("{path}: {key}: {reason}")]
    BadConfig {
        /// The `config.json`.
        path: PathBuf,
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A `*.safetensors` file does not parse.
    #[error("{path}: not a safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The safetensors crate's message.
        message: String,
    },
    /// A weight is stored in a dtype the loader does not convert.
    #[error("{path}: tensor {tensor:?} has dtype {dtype}, supported: F32, F16, BF16")]
    UnsupportedDtype {
        /// The safetensors file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Its dtype as safetensors names it.
        dtype: String,
    },
    /// The directory holds no weights.
    #[error("{path}: no *.safetensors files")]
    NoWeights {
        /// The directory.
        path: PathBuf,
    },
    /// Two shards hold the same tensor.
    #[error("{path}: tensor {tensor:?} appears in more than one file")]
    DuplicateTensor {
        /// The directory.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
    },
}
