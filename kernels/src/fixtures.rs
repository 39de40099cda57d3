//! Tiny deterministic llama models for fast tests, written as GGUF and as HF
//! safetensors checkpoints that load to bit-identical weights.
//!
//! | name           | layers | types                                               | output |
//! |----------------|--------|-----------------------------------------------------|--------|
//! | `tiny-f32`     | 2      | all F32                                             | tied   |
//! | `tiny-q`       | 3      | Q4_1 linear, Q8_0 embedding, F32 norms (as SmolLM2)  | tied   |
//! | `tiny-outlier` | 2      | Q8_0 linear, F32 embedding and norms                | Q8_0   |
//!
//! All have hidden size 64, 4 query heads and 2 KV heads of 16 dims (GQA),
//! FFN 128, vocabulary 259, context 256. Weights are a pure function of the
//! fixture's seed and each tensor's name, so every build writes the same bytes.
//!
//! The tokenizer is byte-level with no merges: id 0 `<|endoftext|>` (BOS and
//! EOS, prepended to every encoded text), 1 `<|im_start|>`, 2 `<|im_end|>`,
//! then one token per byte (byte `b` is id `3 + b`); a ChatML template with
//! no system turn. With `--tokens`, start the ids with 0 to get what the
//! tokenizer would give.
//!
//! **The planted massive activation** (`tiny-outlier`): dimension
//! [`OUTLIER_DIM`] (7) of token [`OUTLIER_TOKEN`] (0, the BOS every encoded
//! prompt starts with) embeds at [`OUTLIER_VALUE`] (−3000), against ~±1 for
//! every other value. It rides the residual stream of position 0 through
//! every layer (`embedding`, `post_attn_residual`, `post_ffn_residual`,
//! `final_norm`'s input). After RMSNorm it dominates position 0's
//! `attn_norm` and `ffn_norm` outputs (≈ −8 against ≈ 10⁻³ elsewhere), so
//! int8 quantization per 32-element block (the `q8` precision) rounds the
//! other 31 values of block 0 (dims 0–31) to zero. As in real models with
//! massive activations, the matrices that read the normed residual (Q, K, V,
//! gate, up) have an exactly zero column at that dimension, so the signal
//! lies entirely in the crushed values: `q8` departs from `f32` first at
//! layer 0's `q_proj`/`k_proj`/`v_proj` at position 0 (later positions
//! inherit it through attention), while `f32` stays close to `f64`.

use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use crate::gguf::{GgufError, GgufWriter, Value, ValueType};
use crate::hf::unpermute_rope_rows;
use crate::model::{LayerWeights, LlamaConfig, ModelWeights, QTensor};
use crate::quant::{encode_float, quantize_q4_1, quantize_q8_0, GgmlType};
use crate::tokenizer::Tokenizer;

/// Every fixture name.
pub const NAMES: [&str; 3] = ["tiny-f32", "tiny-q", "tiny-outlier"];
/// The token whose embedding carries the massive activation.
pub const OUTLIER_TOKEN: u32 = 0;
/// The dimension of the massive activation.
pub const OUTLIER_DIM: usize = 7;
/// Its value in the embedding.
pub const OUTLIER_VALUE: f32 = -3000.0;

/// The ChatML template the fixtures carry (no default system turn).
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Why a fixture could not be written.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("unknown fixture {name:?} (known: tiny-f32, tiny-q, tiny-outlier)")]
    Unknown { name: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Write { path: PathBuf, message: String },
}

/// What distinguishes one fixture from another.
#[derive(Debug, Clone)]
struct Spec {
    seed: u64,
    n_layer: usize,
    linear: GgmlType,
    embedding: GgmlType,
    /// `Some(type)` for a separate output matrix.
    output: Option<GgmlType>,
    outlier: bool,
}

fn spec(name: &str) -> Result<Spec, FixtureError> {
    Ok(match name {
        "tiny-f32" => Spec {
            seed: 1,
            n_layer: 2,
            linear: GgmlType::F32,
            embedding: GgmlType::F32,
            output: None,
            outlier: false,
        },
        "tiny-q" => Spec {
            seed: 2,
            n_layer: 3,
            linear: GgmlType::Q4_1,
            embedding: GgmlType::Q8_0,
            output: None,
            outlier: false,
        },
        "tiny-outlier" => Spec {
            seed: 3,
            n_layer: 2,
            // Q8_0 represents the zero columns exactly.
            linear: GgmlType::Q8_0,
            embedding: GgmlType::F32,
            output: Some(GgmlType::Q8_0),
            outlier: true,
        },
        _ => {
            return Err(FixtureError::Unknown {
                name: name.to_string(),
            })
        }
    })
}

/// The hyperparameters every fixture shares.
pub fn config(name: &str) -> Result<LlamaConfig, FixtureError> {
    let s = spec(name)?;
    Ok(LlamaConfig {
        arch: "llama".into(),
        n_layer: s.n_layer,
        n_embd: 64,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_ff: 128,
        vocab_size: 259,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        context_length: 256,
        family: crate::model::ModelFamily::llama(),
    })
}

/// Uniform values in [-1, 1) from a splitmix64 stream keyed by the seed and
/// the tensor name (so adding a tensor never changes another one).
fn uniform(seed: u64, name: &str, n: usize) -> Vec<f32> {
    let mut state = name.bytes().fold(seed ^ 0x5851_F42D_4C95_7F2D, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    });
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn encode(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::Q8_0 => quantize_q8_0(x).expect("fixture rows are whole blocks"),
        GgmlType::Q4_1 => quantize_q4_1(x).expect("fixture rows are whole blocks"),
        _ => encode_float(ty, x).expect("fixtures use F32, Q8_0 or Q4_1"),
    }
}

/// The fixture's weights, as a GGUF file stores them (Q/K in GGUF order).
pub fn weights(name: &str) -> Result<ModelWeights, FixtureError> {
    let s = spec(name)?;
    let c = config(name)?;
    let tensor = |name: &str, ty: GgmlType, shape: &[usize], scale: f32, bias: f32| {
        let numel: usize = shape.iter().product();
        let mut x: Vec<f32> = uniform(s.seed, name, numel)
            .into_iter()
            .map(|v| bias + scale * v)
            .collect();
        if s.outlier {
            plant(name, shape, &mut x);
        }
        QTensor {
            name: name.into(),
            ggml_type: ty,
            shape: shape.to_vec(),
            data: encode(ty, &x),
        }
    };
    // Scaled so activations keep roughly unit size through the layers.
    let w = |cols: usize| (3.0 / cols as f32).sqrt();
    let norm = |name: &str| tensor(name, GgmlType::F32, &[c.n_embd], 0.1, 1.0);
    let (q_dim, kv_dim) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
    let layers = (0..c.n_layer)
        .map(|i| {
            let n = |t: &str| format!("blk.{i}.{t}.weight");
            let lin = |t: &str, rows: usize, cols: usize| {
                tensor(&n(t), s.linear, &[rows, cols], w(cols), 0.0)
            };
            LayerWeights {
                attn_norm: norm(&n("attn_norm")),
                wq: lin("attn_q", q_dim, c.n_embd),
                wk: lin("attn_k", kv_dim, c.n_embd),
                wv: lin("attn_v", kv_dim, c.n_embd),
                wo: lin("attn_output", c.n_embd, q_dim),
                ffn_norm: norm(&n("ffn_norm")),
                w_gate: lin("ffn_gate", c.n_ff, c.n_embd),
                w_up: lin("ffn_up", c.n_ff, c.n_embd),
                w_down: lin("ffn_down", c.n_embd, c.n_ff),
                bq: None,
                bk: None,
                bv: None,
                extra_norms: Default::default(),
            }
        })
        .collect();
    Ok(ModelWeights {
        token_embd: tensor(
            "token_embd.weight",
            s.embedding,
            &[c.vocab_size, c.n_embd],
            1.0,
            0.0,
        ),
        layers,
        output_norm: norm("output_norm.weight"),
        output: s.output.map(|ty| {
            tensor(
                "output.weight",
                ty,
                &[c.vocab_size, c.n_embd],
                w(c.n_embd),
                0.0,
            )
        }),
        config: c,
    })
}

/// The massive activation and the zero columns that make its crushing
/// visible (see the module docs).
fn plant(name: &str, shape: &[usize], x: &mut [f32]) {
    if name == "token_embd.weight" {
        x[OUTLIER_TOKEN as usize * shape[1] + OUTLIER_DIM] = OUTLIER_VALUE;
    }
    let reads_normed_residual = ["attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"]
        .iter()
        .any(|t| name.ends_with(&format!(".{t}.weight")));
    if reads_normed_residual {
        let cols = shape[1];
        for row in x.chunks_exact_mut(cols) {
            row[OUTLIER_DIM] = 0.0;
        }
    }
}

/// GPT-2's byte-to-unicode map: the byte-level BPE symbol of each byte.
fn byte_symbol(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("valid code point")
}

/// The fixture vocabulary: three special tokens, then the 256 bytes.
pub fn tokens() -> Vec<String> {
    let mut t: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    t.extend((0..=255u8).map(|b| byte_symbol(b).to_string()));
    t
}

/// Writes fixture `name` as `dir/<name>.gguf` and returns its path.
pub fn write(name: &str, dir: &Path) -> Result<PathBuf, FixtureError> {
    let m = weights(name)?;
    let c = &m.config;
    let mut g = GgufWriter::new();
    let u32v = |v: usize| Value::U32(v as u32);
    g.meta("general.architecture", Value::String("llama".into()))
        .meta(
            "general.name",
            Value::String(format!("taptree fixture {name}")),
        )
        .meta("llama.block_count", u32v(c.n_layer))
        .meta("llama.context_length", u32v(c.context_length))
        .meta("llama.embedding_length", u32v(c.n_embd))
        .meta("llama.feed_forward_length", u32v(c.n_ff))
        .meta("llama.attention.head_count", u32v(c.n_head))
        .meta("llama.attention.head_count_kv", u32v(c.n_head_kv))
        .meta("llama.rope.freq_base", Value::F32(c.rope_base))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(c.rms_eps),
        )
        .meta("llama.vocab_size", u32v(c.vocab_size))
        .meta("tokenizer.ggml.model", Value::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    let toks = tokens();
    g.meta(
        "tokenizer.ggml.tokens",
        Value::Array(
            ValueType::String,
            toks.iter().cloned().map(Value::String).collect(),
        ),
    )
    .meta(
        "tokenizer.ggml.token_type",
        Value::Array(
            ValueType::I32,
            (0..toks.len())
                .map(|i| Value::I32(if i < 3 { 3 } else { 1 }))
                .collect(),
        ),
    )
    .meta(
        "tokenizer.ggml.merges",
        Value::Array(ValueType::String, Vec::new()),
    )
    .meta("tokenizer.ggml.bos_token_id", Value::U32(0))
    .meta("tokenizer.ggml.eos_token_id", Value::U32(0))
    .meta("tokenizer.ggml.add_bos_token", Value::Bool(true))
    .meta(
        "tokenizer.chat_template",
        Value::String(CHAT_TEMPLATE.into()),
    );
    for t in m.tensors() {
        g.tensor(&t.name, t.ggml_type, &t.shape, t.data.clone());
    }
    std::fs::create_dir_all(dir).map_err(|source| FixtureError::Io {
        path: dir.into(),
        source,
    })?;
    let path = dir.join(format!("{name}.gguf"));
    g.write(&path)?;
    Ok(path)
}

/// HF's name for a GGUF tensor name.
fn hf_name(gguf: &str) -> String {
    match gguf {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return "model.norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.").expect("layer tensor");
    let (layer, name) = rest.split_once('.').expect("blk.N.name");
    let hf = match name {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        other => other,
    };
    format!("model.layers.{layer}.{hf}")
}

/// Writes fixture `name` as an HF checkpoint directory `dir/<name>-hf`
/// (`config.json`, `model.safetensors` in F32 holding the GGUF's dequantized
/// values with Q/K rows in HF order, `tokenizer.json`,
/// `tokenizer_config.json`) and returns its path.
pub fn write_hf(name: &str, dir: &Path) -> Result<PathBuf, FixtureError> {
    let m = weights(name)?;
    let c = &m.config;
    let out = dir.join(format!("{name}-hf"));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FixtureError::Io { path, source }
    };
    std::fs::create_dir_all(&out).map_err(io(&out))?;

    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in m.tensors() {
        let values = t.to_f32().expect("fixture tensors are whole blocks");
        let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let heads = if t.name.ends_with(".attn_q.weight") {
            Some(c.n_head)
        } else if t.name.ends_with(".attn_k.weight") {
            Some(c.n_head_kv)
        } else {
            None
        };
        if let Some(h) = heads {
            bytes = unpermute_rope_rows(&bytes, h, t.rows(), 4 * t.cols());
        }
        tensors.push((hf_name(&t.name), t.shape.clone(), bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, bytes)| {
            let view = TensorView::new(Dtype::F32, shape.clone(), bytes).expect("sizes match");
            (n.clone(), view)
        })
        .collect();
    let st_path = out.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &st_path).map_err(|e| FixtureError::Write {
        path: st_path.clone(),
        message: e.to_string(),
    })?;

    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.n_embd,
        "intermediate_size": c.n_ff,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "num_hidden_layers": c.n_layer,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.context_length,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_base,
        "tie_word_embeddings": m.output.is_none(),
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "float32",
    });
    let tokenizer_config = serde_json::json!({
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "add_bos_token": true,
        "chat_template": CHAT_TEMPLATE,
    });
    for (file, json) in [
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
    ] {
        let p = out.join(file);
        let text = serde_json::to_string_pretty(&json).expect("json");
        std::fs::write(&p, text + "\n").map_err(io(&p))?;
    }
    let tok_path = out.join("tokenizer.json");
    tokenizer()?
        .inner()
        .save(&tok_path, true)
        .map_err(|e| FixtureError::Write {
            path: tok_path.clone(),
            message: e.to_string(),
        })?;
    Ok(out)
}

/// The fixtures' tokenizer.
pub fn tokenizer() -> Result<Tokenizer, FixtureError> {
    let dir = tempfile::tempdir().map_err(|source| FixtureError::Io {
        path: std::env::temp_dir(),
        source,
    })?;
    // Built through the GGUF path so that it is exactly what a loader sees.
    let path = write("tiny-f32", dir.path())?;
    let gguf = crate::gguf::GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&gguf)
        .map_err(|e| FixtureError::Write {
            path: path.clone(),
            message: e.to_string(),
        })?
        .expect("fixtures carry a tokenizer");
    Ok(tok)
}
