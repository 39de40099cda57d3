//! Loading GGUF files into `ModelWeights`: the real model, and bad input.

mod gguf_python;

use model::gguf::{GgufWriter, Value};
use model::load::{load_model, LoadError, ModelFormat};
use model::GgmlType;

#[test]
fn smollm2_loads_with_its_hyperparameters() {
    let Some(path) = gguf_python::smollm2() else {
        return;
    };
    let m = load_model(&path).unwrap();
    let c = &m.weights.config;
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.n_ff
        ),
        (30, 576, 9, 3, 64, 1536)
    );
    assert_eq!((c.vocab_size, c.context_length), (49152, 8192));
    assert_eq!((c.rope_base, c.rms_eps), (100000.0, 1e-5));
    assert!(m.weights.output.is_none(), "smollm2 ties its output");
    assert_eq!(m.weights.output_matrix().shape, vec![49152, 576]);
    assert_eq!(m.weights.token_embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(m.weights.layers[29].wk.shape, vec![192, 576]);
    assert_eq!(m.weights.layers[0].w_down.ggml_type, GgmlType::Q4_1);
    assert_eq!(m.weights.layers[0].attn_norm.ggml_type, GgmlType::F32);
    assert_eq!(m.source.format, ModelFormat::Gguf);
    assert_eq!(
        m.source.blake3,
        model::load::file_blake3(&path).unwrap(),
        "the manifest's model hash is the file's"
    );
    assert!(m.tokenizer.is_some());
}

fn minimal(arch: &str) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String(arch.into()));
    for (k, v) in [
        ("block_count", 1u32),
        ("embedding_length", 32),
        ("attention.head_count", 2),
        ("attention.head_count_kv", 1),
        ("feed_forward_length", 32),
        ("context_length", 16),
        ("vocab_size", 4),
    ] {
        w.meta(&format!("{arch}.{k}"), Value::U32(v));
    }
    w.meta(
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    let f32s = |n: usize| vec![0u8; 4 * n];
    w.tensor("token_embd.weight", GgmlType::F32, &[4, 32], f32s(128));
    w.tensor("output_norm.weight", GgmlType::F32, &[32], f32s(32));
    for (n, shape) in [
        ("attn_norm", vec![32]),
        ("attn_q", vec![32, 32]),
        ("attn_k", vec![16, 32]),
        ("attn_v", vec![16, 32]),
        ("attn_output", vec![32, 32]),
        ("ffn_norm", vec![32]),
        ("ffn_gate", vec![32, 32]),
        ("ffn_up", vec![32, 32]),
        ("ffn_down", vec![32, 32]),
    ] {
        let numel = shape.iter().product();
        w.tensor(
            &format!("blk.0.{n}.weight"),
            GgmlType::F32,
            &shape,
            f32s(numel),
        );
    }
    w
}

fn load_err(w: &GgufWriter) -> (LoadError, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    w.write(&p).unwrap();
    let e = load_model(&p).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with(&p.display().to_string()), "{msg}");
    (e, msg)
}

#[test]
fn a_minimal_llama_loads_and_its_defaults_apply() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    minimal("llama").write(&p).unwrap();
    let m = load_model(&p).unwrap();
    assert_eq!(m.weights.config.head_dim, 16);
    assert_eq!(m.weights.config.rope_base, 10000.0);
    assert_eq!(m.weights.config.vocab_size, 4);
    assert!(m.tokenizer.is_none());
}

#[test]
fn unknown_architecture_is_named() {
    let (e, msg) = load_err(&minimal("mamba"));
    assert!(matches!(e, LoadError::UnsupportedArchitecture { .. }));
    assert!(msg.contains("\"mamba\""), "{msg}");
}

#[test]
fn missing_key_missing_tensor_and_wrong_shape_are_named() {
    let mut w = minimal("llama");
    w.meta("llama.block_count", Value::U32(2));
    let (e, msg) = load_err(&w);
    assert!(matches!(e, LoadError::MissingTensor { .. }), "{msg}");
    assert!(msg.contains("blk.1.attn_norm.weight"), "{msg}");

    let mut w = minimal("llama");
    w.meta("llama.attention.head_count_kv", Value::U32(2));
    let (_, msg) = load_err(&w);
    assert!(
        msg.contains("blk.0.attn_k.weight") && msg.contains("[32, 32]"),
        "{msg}"
    );

    let mut w = minimal("llama");
    w.meta("llama.embedding_length", Value::String("wide".into()));
    let (_, msg) = load_err(&w);
    assert!(msg.contains("llama.embedding_length"), "{msg}");
}

#[test]
fn truncated_and_foreign_files_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let bytes = minimal("llama").to_bytes();
    std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    let msg = load_model(&p).unwrap_err().to_string();
    assert!(msg.contains("out of bounds"), "{msg}");
    std::fs::write(&p, b"{\"not\": \"gguf\"}").unwrap();
    let msg = load_model(&p).unwrap_err().to_string();
    assert!(msg.contains("bad magic"), "{msg}");
    let msg = load_model(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("not a GGUF file nor a directory"), "{msg}");
    let msg = load_model(dir.path().join("absent"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("absent"), "{msg}");
}

#[test]
fn an_unsupported_tokenizer_leaves_the_weights_usable() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let mut w = minimal("llama");
    w.meta("tokenizer.ggml.model", Value::String("llama".into()));
    w.write(&p).unwrap();
    let m = load_model(&p).unwrap();
    assert!(m.tokenizer.is_none());
    let why = m.tokenizer_error.unwrap().to_string();
    assert!(
        why.contains("tokenizer model \"llama\" is not supported"),
        "{why}"
    );

    // Malformed tokenizer metadata is corruption, not a missing feature.
    let mut w = minimal("llama");
    w.meta("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.meta("tokenizer.ggml.tokens", Value::U32(3));
    let (_, msg) = load_err(&w);
    assert!(msg.contains("tokenizer.ggml.tokens"), "{msg}");
}
