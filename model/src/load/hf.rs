//! Hugging Face checkpoints: `config.json` plus `*.safetensors` (F32, F16,
//! BF16), llama architecture.
//!
//! Tensors are renamed to GGUF's names and Q/K rows are permuted into GGUF's
//! interleaved-pair RoPE order (the permutation llama.cpp's converter
//! applies), so a forward sees the same [`ModelWeights`](crate::ModelWeights) whichever file the
//! model came from. A directory's `blake3` is the hash of its model files'
//! names and hashes, in name order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value as Json;

use super::assemble::assemble;
use super::error::{HfError, LoadError};
use super::source::{file_blake3, LoadedModel, ModelFormat, ModelSource};
use crate::family::ModelFamily;
use crate::quant::GgmlType;
use crate::tokenizer::Tokenizer;
use crate::weights::{LlamaConfig, QTensor};

/// The GGUF name of an HF tensor name, with whether its rows need the RoPE
/// permutation and, if so, over how many heads.
fn gguf_name(hf: &str, config: &LlamaConfig) -> Option<(String, Option<usize>)> {
    let plain = |s: &str| Some((s.to_string(), None));
    match hf {
        "model.embed_tokens.weight" => return plain("token_embd.weight"),
        "model.norm.weight" => return plain("output_norm.weight"),
        "lm_head.weight" => return plain("output.weight"),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, name) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (gguf, heads) = match name {
        "input_layernorm.weight" => ("attn_norm", None),
        "self_attn.q_proj.weight" => ("attn_q", Some(config.n_head)),
        "self_attn.k_proj.weight" => ("attn_k", Some(config.n_head_kv)),
        "self_attn.v_proj.weight" => ("attn_v", None),
        // Qwen2's biases: Q and K rows move with their weight rows.
        "self_attn.q_proj.bias" => {
            return Some((format!("blk.{layer}.attn_q.bias"), Some(config.n_head)))
        }
        "self_attn.k_proj.bias" => {
            return Some((format!("blk.{layer}.attn_k.bias"), Some(config.n_head_kv)))
        }
        "self_attn.v_proj.bias" => return Some((format!("blk.{layer}.attn_v.bias"), None)),
        "self_attn.o_proj.weight" => ("attn_output", None),
        "post_attention_layernorm.weight" => ("ffn_norm", None),
        "mlp.gate_proj.weight" => ("ffn_gate", None),
        "mlp.up_proj.weight" => ("ffn_up", None),
        "mlp.down_proj.weight" => ("ffn_down", None),
        _ => return None,
    };
    Some((format!("blk.{layer}.{gguf}.weight"), heads))
}

/// Reorders the rows of a `[n_head * head_dim, cols]` matrix from HF's
/// half-split RoPE layout to GGUF's interleaved one: within each head, new
/// row `2i + j` is old row `j * head_dim / 2 + i` (llama.cpp's
/// `reshape(n_head, 2, hd/2, cols).swapaxes(1, 2)`).
pub fn permute_rope_rows(data: &[u8], n_head: usize, rows: usize, row_bytes: usize) -> Vec<u8> {
    move_rope_rows(data, n_head, rows, row_bytes, true)
}

/// The inverse of [`permute_rope_rows`] (GGUF order back to HF order).
pub fn unpermute_rope_rows(data: &[u8], n_head: usize, rows: usize, row_bytes: usize) -> Vec<u8> {
    move_rope_rows(data, n_head, rows, row_bytes, false)
}

/// Moves every row between its HF index (`j * head_dim / 2 + i` within a
/// head) and its GGUF index (`2i + j`), in the direction asked.
fn move_rope_rows(
    data: &[u8],
    n_head: usize,
    rows: usize,
    row_bytes: usize,
    to_gguf: bool,
) -> Vec<u8> {
    let head_dim = rows / n_head;
    let half = head_dim / 2;
    let mut out = vec![0u8; data.len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let gguf = h * head_dim + 2 * i + j;
                let hf = h * head_dim + j * half + i;
                let (dst, src) = if to_gguf { (gguf, hf) } else { (hf, gguf) };
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

fn read_json(path: &Path) -> Result<Json, HfError> {
    let text = std::fs::read_to_string(path).map_err(|source| HfError::Io {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| HfError::Json {
        path: path.into(),
        message: e.to_string(),
    })
}

/// The hyperparameters in an HF `config.json`.
pub fn config_from_json(path: &Path, json: &Json) -> Result<(LlamaConfig, bool), LoadError> {
    let model_type = json.get("model_type").and_then(Json::as_str).unwrap_or("");
    let is_llama_arch = json
        .get("architectures")
        .and_then(Json::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("LlamaForCausalLM")));
    // Qwen2 is a llama with q/k/v biases (loaded when present); its
    // sliding window, when switched on, is not.
    let qwen2 = model_type == "qwen2"
        && !json
            .get("use_sliding_window")
            .and_then(Json::as_bool)
            .unwrap_or(false);
    if model_type != "llama" && !is_llama_arch && !qwen2 {
        return Err(LoadError::UnsupportedArchitecture {
            path: path.into(),
            arch: if model_type.is_empty() {
                "(no model_type)".into()
            } else {
                model_type.into()
            },
        });
    }
    let bad = |key: &'static str, reason: String| -> LoadError {
        HfError::BadConfig {
            path: path.into(),
            key,
            reason,
        }
        .into()
    };
    let uint = |key: &'static str| -> Result<Option<usize>, LoadError> {
        match json.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0 && n <= u32::MAX as u64)
                .map(|n| Some(n as usize))
                .ok_or_else(|| bad(key, format!("{v} is not a positive integer"))),
        }
    };
    let req = |key: &'static str| uint(key)?.ok_or_else(|| bad(key, "missing".into()));
    let float = |key: &'static str, default: Option<f64>| -> Result<f32, LoadError> {
        // transformers 5 writes `rope_theta` inside `rope_parameters`.
        let nested = json.get("rope_parameters").and_then(|r| r.get(key));
        match json.get(key).filter(|v| !v.is_null()).or(nested) {
            None | Some(Json::Null) => default
                .map(|d| d as f32)
                .ok_or_else(|| bad(key, "missing".into())),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(|x| x as f32)
                .ok_or_else(|| bad(key, format!("{v} is not a positive number"))),
        }
    };
    let n_embd = req("hidden_size")?;
    let n_head = req("num_attention_heads")?;
    let n_head_kv = uint("num_key_value_heads")?.unwrap_or(n_head);
    if n_head % n_head_kv != 0 {
        return Err(bad(
            "num_key_value_heads",
            format!("{n_head} query heads are not a multiple of {n_head_kv}"),
        ));
    }
    let head_dim = match uint("head_dim")? {
        Some(d) => d,
        None if n_embd % n_head == 0 => n_embd / n_head,
        None => {
            return Err(bad(
                "hidden_size",
                format!("{n_embd} is not a multiple of {n_head} heads"),
            ))
        }
    };
    if head_dim % 2 != 0 {
        return Err(bad(
            "head_dim",
            format!("{head_dim} is odd; RoPE rotates pairs"),
        ));
    }
    let tied = json
        .get("tie_word_embeddings")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    let config = LlamaConfig {
        arch: if qwen2 { "qwen2" } else { "llama" }.into(),
        n_layer: req("num_hidden_layers")?,
        n_embd,
        n_head,
        n_head_kv,
        head_dim,
        n_ff: req("intermediate_size")?,
        vocab_size: req("vocab_size")?,
        rope_base: float("rope_theta", Some(10000.0))?,
        rms_eps: float("rms_norm_eps", None)?,
        context_length: req("max_position_embeddings")?,
        family: ModelFamily::llama(),
    };
    Ok((config, tied))
}

fn ggml_type_of(dtype: Dtype) -> Option<GgmlType> {
    match dtype {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// The model files of a checkpoint directory, in name order.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, HfError> {
    let entries = std::fs::read_dir(dir).map_err(|source| HfError::Io {
        path: dir.into(),
        source,
    })?;
    let mut files = Vec::new();
    for e in entries {
        let e = e.map_err(|source| HfError::Io {
            path: dir.into(),
            source,
        })?;
        let p = e.path();
        if p.extension().is_some_and(|x| x == "safetensors") && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(HfError::NoWeights { path: dir.into() });
    }
    Ok(files)
}

/// Loads an HF-layout llama checkpoint directory.
pub fn load_hf(dir: &Path) -> Result<LoadedModel, LoadError> {
    let config_path = dir.join("config.json");
    let json = read_json(&config_path)?;
    let (config, tied) = config_from_json(&config_path, &json)?;
    let files = safetensors_files(dir)?;

    let mut tensors: BTreeMap<String, QTensor> = BTreeMap::new();
    let mut hashed: Vec<(String, String)> = Vec::new();
    for file in &files {
        let io = |source| HfError::Io {
            path: file.clone(),
            source,
        };
        let bytes = std::fs::read(file).map_err(io)?;
        hashed.push((
            file.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into(),
            blake3::hash(&bytes).to_hex().to_string(),
        ));
        let st = SafeTensors::deserialize(&bytes).map_err(|e| HfError::Safetensors {
            path: file.clone(),
            message: e.to_string(),
        })?;
        for (name, view) in st.tensors() {
            let Some((gguf, heads)) = gguf_name(&name, &config) else {
                continue;
            };
            let ggml_type =
                ggml_type_of(view.dtype()).ok_or_else(|| HfError::UnsupportedDtype {
                    path: file.clone(),
                    tensor: name.clone(),
                    dtype: format!("{:?}", view.dtype()),
                })?;
            let shape = view.shape().to_vec();
            let data = match (heads, shape.as_slice()) {
                (Some(h), &[rows, cols]) if rows % (2 * h) == 0 => {
                    permute_rope_rows(view.data(), h, rows, ggml_type.row_bytes(cols))
                }
                (Some(h), &[rows]) if rows % (2 * h) == 0 => {
                    permute_rope_rows(view.data(), h, rows, ggml_type.row_bytes(1))
                }
                _ => view.data().to_vec(),
            };
            let t = QTensor {
                name: gguf.clone(),
                ggml_type,
                shape,
                data: data.into(),
            };
            if tensors.insert(gguf, t).is_some() {
                return Err(HfError::DuplicateTensor {
                    path: file.clone(),
                    tensor: name,
                }
                .into());
            }
        }
    }

    let has_output = !tied && tensors.contains_key("output.weight");
    let weights = assemble(config, dir, has_output, |name| tensors.remove(name))?;

    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer = if tokenizer_path.is_file() {
        Some(hf_tokenizer(dir, &tokenizer_path, &json)?)
    } else {
        None
    };
    for extra in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        let p = dir.join(extra);
        if p.is_file() {
            let h = file_blake3(&p).map_err(|source| HfError::Io { path: p, source })?;
            hashed.push((extra.into(), h));
        }
    }
    hashed.sort();
    let mut hasher = blake3::Hasher::new();
    for (name, h) in &hashed {
        hasher.update(name.as_bytes());
        hasher.update(b"\0");
        hasher.update(h.as_bytes());
        hasher.update(b"\n");
    }
    Ok(LoadedModel {
        weights,
        tokenizer,
        tokenizer_error: None,
        source: ModelSource {
            path: dir.into(),
            blake3: hasher.finalize().to_hex().to_string(),
            format: ModelFormat::HfSafetensors,
        },
    })
}

/// `tokenizer.json`, with BOS/EOS and the chat template from
/// `tokenizer_config.json` (or `config.json`'s ids).
fn hf_tokenizer(dir: &Path, path: &Path, config: &Json) -> Result<Tokenizer, LoadError> {
    let tc_path = dir.join("tokenizer_config.json");
    let tc = if tc_path.is_file() {
        read_json(&tc_path)?
    } else {
        Json::Null
    };
    let mut tok = Tokenizer::from_hf_file(path, None, None, false, None)?;
    let token_id = |key: &str| -> Option<u32> {
        let v = tc.get(key)?;
        let s = v.as_str().or_else(|| v.get("content")?.as_str())?;
        tok.token_to_id(s)
    };
    let id = |key: &str| config.get(key).and_then(Json::as_u64).map(|v| v as u32);
    let bos = token_id("bos_token").or_else(|| id("bos_token_id"));
    let eos = token_id("eos_token").or_else(|| id("eos_token_id"));
    tok.bos_id = bos;
    tok.eos_id = eos;
    tok.add_bos = tc
        .get("add_bos_token")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    tok.chat_template_source = tc
        .get("chat_template")
        .and_then(Json::as_str)
        .map(str::to_string);
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_permutation_matches_llama_cpp_converter() {
        // numpy: np.arange(16).reshape(2, 2, 4, 1).swapaxes(1, 2).reshape(16)
        let rows: Vec<u8> = (0..16).collect();
        assert_eq!(
            permute_rope_rows(&rows, 2, 16, 1),
            [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
        );
        assert_eq!(
            unpermute_rope_rows(&permute_rope_rows(&rows, 2, 16, 1), 2, 16, 1),
            rows
        );
        // rows of several bytes move whole
        let wide: Vec<u8> = (0..8).collect();
        assert_eq!(permute_rope_rows(&wide, 1, 4, 2), [0, 1, 4, 5, 2, 3, 6, 7]);
    }

    #[test]
    fn config_errors_name_the_key() {
        let p = Path::new("m/config.json");
        let e = config_from_json(p, &serde_json::json!({"model_type": "gpt_neox"})).unwrap_err();
        assert!(
            e.to_string().contains("\"gpt_neox\" is not supported"),
            "{e}"
        );
        let e = config_from_json(
            p,
            &serde_json::json!({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 3}),
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with("m/config.json: hidden_size"),
            "{e}"
        );
    }
}
