//! The one entry point from a file to a model: [`load_model`] takes a GGUF
//! file or an HF-layout safetensors directory and returns the weights, the
//! tokenizer when the files carry one, and where it all came from.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! // `kernels::fetch::resolve("smollm2")` gives the real model's path.
//! let path = kernels::fixtures::write("tiny-q", dir.path())?;
//! let model = kernels::load::load_model(&path)?;
//! assert_eq!(model.weights.config.n_layer, 3);
//! let embedding = model.weights.token_embd.to_f32()?; // dequantized, row-major
//! assert_eq!(embedding.len(), 259 * 64);
//! let tokenizer = model.tokenizer.expect("fixtures carry a tokenizer");
//! assert_eq!(tokenizer.encode("Hi")?, [0, 3 + b'H' as u32, 3 + b'i' as u32]);
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use crate::gguf::{GgufError, GgufFile, Value};
use crate::hf::HfError;
use crate::model::{LayerWeights, LlamaConfig, ModelWeights, QTensor};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// The file format a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    /// `config.json` plus `*.safetensors`.
    HfSafetensors,
}

impl ModelFormat {
    pub fn name(self) -> &'static str {
        match self {
            ModelFormat::Gguf => "gguf",
            ModelFormat::HfSafetensors => "hf-safetensors",
        }
    }
}

/// Where a model came from.
#[derive(Debug, Clone)]
pub struct ModelSource {
    pub path: PathBuf,
    /// blake3 of the GGUF file; for a directory, of its files' names and
    /// hashes (see [`crate::hf`]).
    pub blake3: String,
    pub format: ModelFormat,
}

/// A model ready for a forward.
#[derive(Debug)]
pub struct LoadedModel {
    pub weights: ModelWeights,
    /// `None` when the files carry no tokenizer, or one of a kind that is
    /// not supported (then `tokenizer_error` says which); use token ids then.
    pub tokenizer: Option<Tokenizer>,
    /// Why a tokenizer the file describes is not available.
    pub tokenizer_error: Option<TokenizerError>,
    pub source: ModelSource,
}

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

/// Loads a GGUF file or an HF safetensors directory.
pub fn load_model(path: impl AsRef<Path>) -> Result<LoadedModel, LoadError> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(|source| LoadError::Io {
        path: path.into(),
        source,
    })?;
    if meta.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(LoadError::NotAModel { path: path.into() });
        }
        return crate::hf::load_hf(path);
    }
    load_gguf(path)
}

/// Loads a GGUF file.
pub fn load_gguf(path: &Path) -> Result<LoadedModel, LoadError> {
    let gguf = GgufFile::open(path)?;
    let weights = weights_from_gguf(&gguf)?;
    // An unsupported tokenizer kind leaves the weights usable with token
    // ids; malformed tokenizer metadata is a corrupt file and fails the load.
    let (tokenizer, tokenizer_error) = match Tokenizer::from_gguf(&gguf) {
        Ok(t) => (t, None),
        Err(
            e @ (TokenizerError::UnsupportedModel { .. } | TokenizerError::UnsupportedPre { .. }),
        ) => (None, Some(e)),
        Err(e) => return Err(e.into()),
    };
    let blake3 = blake3::hash(gguf.bytes()).to_hex().to_string();
    Ok(LoadedModel {
        weights,
        tokenizer,
        tokenizer_error,
        source: ModelSource {
            path: path.into(),
            blake3,
            format: ModelFormat::Gguf,
        },
    })
}

/// The blake3 of a file, hex (the manifest's `model_blake3`).
pub fn file_blake3(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(blake3::hash(&[]).to_hex().to_string());
    }
    // SAFETY: read-only map of a file we only hash; see `GgufFile::open`.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(blake3::hash(&map).to_hex().to_string())
}

/// The hyperparameters of a llama-architecture GGUF.
pub fn config_from_gguf(gguf: &GgufFile) -> Result<LlamaConfig, LoadError> {
    let path = gguf.path();
    let arch = gguf
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| LoadError::MissingKey {
            path: path.into(),
            key: "general.architecture".into(),
        })?;
    if arch != "llama" && arch != "gemma3" {
        return Err(LoadError::UnsupportedArchitecture {
            path: path.into(),
            arch: arch.into(),
        });
    }
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |k: &str| -> Result<Option<usize>, LoadError> {
        let k = key(k);
        match gguf.get(&k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0 && n <= u32::MAX as u64)
                .map(|n| Some(n as usize))
                .ok_or_else(|| LoadError::BadKey {
                    path: path.into(),
                    key: k,
                    reason: format!("{v:?} is not a positive integer"),
                }),
        }
    };
    let req = |k: &str| {
        uint(k)?.ok_or_else(|| LoadError::MissingKey {
            path: path.into(),
            key: key(k),
        })
    };
    let float = |k: &str| -> Result<f32, LoadError> {
        let k = key(k);
        let v = gguf.get(&k).ok_or_else(|| LoadError::MissingKey {
            path: path.into(),
            key: k.clone(),
        })?;
        v.as_f64()
            .filter(|x| x.is_finite() && *x > 0.0)
            .map(|x| x as f32)
            .ok_or_else(|| LoadError::BadKey {
                path: path.into(),
                key: k,
                reason: format!("{v:?} is not a positive float"),
            })
    };
    let n_embd = req("embedding_length")?;
    let n_head = req("attention.head_count")?;
    let n_head_kv = uint("attention.head_count_kv")?.unwrap_or(n_head);
    if n_head % n_head_kv != 0 {
        return Err(LoadError::BadKey {
            path: path.into(),
            key: key("attention.head_count_kv"),
            reason: format!("{n_head} query heads are not a multiple of {n_head_kv} KV heads"),
        });
    }
    let head_dim = match uint("attention.key_length")? {
        Some(d) => d,
        None if n_embd % n_head == 0 => n_embd / n_head,
        None => {
            return Err(LoadError::BadKey {
                path: path.into(),
                key: key("embedding_length"),
                reason: format!("{n_embd} is not a multiple of {n_head} heads"),
            })
        }
    };
    if head_dim % 2 != 0 {
        return Err(LoadError::BadKey {
            path: path.into(),
            key: key("attention.key_length"),
            reason: format!("head dim {head_dim} is odd; RoPE rotates pairs"),
        });
    }
    let vocab_size = match gguf.get("tokenizer.ggml.tokens").and_then(Value::as_array) {
        Some(tokens) => tokens.len(),
        None => match uint("vocab_size")? {
            Some(v) => v,
            None => gguf
                .tensor("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .unwrap_or(0) as usize,
        },
    };
    let n_layer = req("block_count")?;
    let rope_base = float("rope.freq_base").or_else(|e| match e {
        // llama.cpp's default when a converter omitted it.
        LoadError::MissingKey { .. } => Ok(10000.0),
        e => Err(e),
    })?;
    let family = match arch {
        "gemma3" => crate::gemma3::family(n_layer, rope_base, req("attention.sliding_window")?),
        _ => crate::model::ModelFamily::llama(),
    };
    Ok(LlamaConfig {
        arch: arch.into(),
        n_layer,
        n_embd,
        n_head,
        n_head_kv,
        head_dim,
        n_ff: req("feed_forward_length")?,
        vocab_size,
        rope_base,
        rms_eps: float("attention.layer_norm_rms_epsilon")?,
        context_length: req("context_length")?,
        family,
    })
}

/// Reads every weight of a llama-architecture GGUF (copied out of the map),
/// checking each shape against the hyperparameters.
pub fn weights_from_gguf(gguf: &GgufFile) -> Result<ModelWeights, LoadError> {
    let config = config_from_gguf(gguf)?;
    let has_output = gguf.tensor("output.weight").is_some();
    assemble(config, gguf.path(), has_output, |name| {
        let info = gguf.tensor(name)?;
        Some(QTensor {
            name: name.into(),
            ggml_type: info.ggml_type,
            shape: info.shape(),
            data: gguf.tensor_data(info).to_vec(),
        })
    })
}

/// Builds [`ModelWeights`] from tensors looked up by their GGUF names,
/// checking every shape against `config`.
pub(crate) fn assemble(
    config: LlamaConfig,
    path: &Path,
    has_output: bool,
    mut lookup: impl FnMut(&str) -> Option<QTensor>,
) -> Result<ModelWeights, LoadError> {
    let c = &config;
    let q_dim = c.n_head * c.head_dim;
    let kv_dim = c.n_head_kv * c.head_dim;
    // A tensor of `expected` shape; an absent optional one is `None`.
    let mut find = |name: &str, expected: &[usize], required: bool| {
        let Some(t) = lookup(name) else {
            return match required {
                true => Err(LoadError::MissingTensor {
                    path: path.into(),
                    tensor: name.into(),
                }),
                false => Ok(None),
            };
        };
        if t.shape != expected {
            return Err(LoadError::Shape {
                path: path.into(),
                tensor: name.into(),
                expected: expected.to_vec(),
                got: t.shape,
            });
        }
        Ok(Some(t))
    };
    let required = |t: Option<QTensor>| t.expect("a required tensor is Some or an error");
    let mut layers = Vec::with_capacity(c.n_layer);
    for i in 0..c.n_layer {
        let mut t = |n: &str, shape: &[usize]| {
            find(&format!("blk.{i}.{n}.weight"), shape, true).map(required)
        };
        let f = &c.family;
        let extra_norms = crate::model::ExtraNorms {
            q_norm: f
                .qk_norm
                .then(|| t("attn_q_norm", &[c.head_dim]))
                .transpose()?,
            k_norm: f
                .qk_norm
                .then(|| t("attn_k_norm", &[c.head_dim]))
                .transpose()?,
            post_attn_norm: f
                .post_norms
                .then(|| t("post_attention_norm", &[c.n_embd]))
                .transpose()?,
            post_ffn_norm: f
                .post_norms
                .then(|| t("post_ffw_norm", &[c.n_embd]))
                .transpose()?,
        };
        layers.push(LayerWeights {
            extra_norms,
            attn_norm: t("attn_norm", &[c.n_embd])?,
            wq: t("attn_q", &[q_dim, c.n_embd])?,
            wk: t("attn_k", &[kv_dim, c.n_embd])?,
            wv: t("attn_v", &[kv_dim, c.n_embd])?,
            wo: t("attn_output", &[c.n_embd, q_dim])?,
            ffn_norm: t("ffn_norm", &[c.n_embd])?,
            w_gate: t("ffn_gate", &[c.n_ff, c.n_embd])?,
            w_up: t("ffn_up", &[c.n_ff, c.n_embd])?,
            w_down: t("ffn_down", &[c.n_embd, c.n_ff])?,
            bq: None,
            bk: None,
            bv: None,
        });
        // Biases are optional (Qwen2 has them, Llama not); a present one has
        // its projection's width.
        let l = layers.last_mut().expect("just pushed");
        for (field, name, len) in [
            (&mut l.bq, "attn_q", q_dim),
            (&mut l.bk, "attn_k", kv_dim),
            (&mut l.bv, "attn_v", kv_dim),
        ] {
            *field = find(&format!("blk.{i}.{name}.bias"), &[len], false)?;
        }
    }
    let output = if has_output {
        Some(find("output.weight", &[c.vocab_size, c.n_embd], true).map(required)?)
    } else {
        None
    };
    Ok(ModelWeights {
        token_embd: find("token_embd.weight", &[c.vocab_size, c.n_embd], true).map(required)?,
        layers,
        output_norm: find("output_norm.weight", &[c.n_embd], true).map(required)?,
        output,
        config,
    })
}
