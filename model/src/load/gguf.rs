use std::path::Path;

use super::assemble::assemble;
use super::error::LoadError;
use super::source::{LoadedModel, ModelFormat, ModelSource};
use crate::family::ModelFamily;
use crate::gguf::{GgufFile, Value};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::weights::{LlamaConfig, ModelWeights, QTensor};

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
        _ => ModelFamily::llama(),
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

/// Reads every weight of a llama-architecture GGUF (slices of the file's
/// map, shared, not copied),
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
            data: gguf.tensor_bytes(info),
        })
    })
}
