//! Gemma 3 270M (Q4_K_M) against Hugging Face transformers loading the same
//! GGUF (fixtures/hf_gemma3.py): the tokenizer's ids, the f32 forward's
//! final logits at every position (cosine >= 0.99999, argmax equal) and 16
//! greedy tokens on a chat prompt and a story prompt.

mod gguf_python;

use std::path::{Path, PathBuf};

use kernels::cpu::CpuForward;
use kernels::switches::Switches;
use kernels::{generate, Forward, Precision};
use model::load::load_model;

/// The reference of fixtures/hf_gemma3.py, computed once per test binary
/// (minutes on two cores), or the output directory of an earlier run of it
/// named by `TAPTREE_HF_GEMMA3`.
fn hf_reference(model: &Path) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("TAPTREE_HF_GEMMA3") {
            return PathBuf::from(dir);
        }
        let out = std::env::temp_dir().join(format!("taptree-hf-gemma3-{}", std::process::id()));
        gguf_python::run_script("hf_gemma3.py", &[model.as_os_str(), out.as_os_str()]);
        out
    })
    .clone()
}

fn npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    // numpy's .npy v1: magic, version, header length, a dict header, data.
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}", path.display());
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"));
    let shape_src = &header[header.find("'shape': (").unwrap() + 10..];
    let shape: Vec<usize> = shape_src[..shape_src.find(')').unwrap()]
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let data = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (shape, data)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

fn argmax(v: &[f32]) -> usize {
    generate::argmax(v) as usize
}

/// Logits of every position of `ids`, one decode step at a time (each step's
/// return is that position's logits).
fn logits_per_position(fwd: &mut dyn Forward, ids: &[u32]) -> Vec<Vec<f32>> {
    fwd.reset();
    ids.iter()
        .enumerate()
        .map(|(p, &t)| fwd.forward(None, &[t], p).unwrap())
        .collect()
}

#[test]
fn gemma3_config_is_read_from_the_gguf() {
    let Some(path) = gguf_python::gemma3() else {
        return;
    };
    let m = load_model(&path).unwrap();
    let c = &m.weights.config;
    assert_eq!(c.arch, "gemma3");
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_ff,
            c.n_head,
            c.n_head_kv,
            c.head_dim
        ),
        (18, 640, 2048, 4, 1, 256)
    );
    assert_eq!((c.vocab_size, c.rope_base, c.rms_eps), (262144, 1e6, 1e-6));
    let global: Vec<usize> = (0..18)
        .filter(|&l| c.family.attention(l, c.rope_base).window.is_none())
        .collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!(c.family.attention(0, c.rope_base).window, Some(512));
    assert!(m.weights.output.is_none(), "tied output");
    let l0 = &m.weights.layers[0].extra_norms;
    assert_eq!(l0.q_norm.as_ref().unwrap().shape, [256]);
    assert_eq!(
        l0.post_ffn_norm.as_ref().unwrap().name,
        "blk.0.post_ffw_norm.weight"
    );
    // The stage graph carries the four extra norms, each fed by its op.
    let stages = kernels::stages::for_config(c);
    let inputs = |name: &str| {
        let s = stages.iter().find(|s| s.name == name).unwrap();
        s.inputs.clone()
    };
    assert_eq!(inputs("q_rope"), ["q_norm"]);
    assert_eq!(inputs("q_norm"), ["q_proj"]);
    assert_eq!(inputs("post_attn_residual")[0], "post_attn_norm");
    assert_eq!(inputs("post_ffn_norm"), ["ffn_down"]);
    assert_eq!(inputs("ffn_down"), ["ffn_geglu"]);
    assert!(stages.iter().all(|s| s.name != "ffn_swiglu"));
    // The chat turn is Gemma's, and ends on <end_of_turn>.
    let tok = m.tokenizer.unwrap();
    assert_eq!(
        tok.render_chat("What is the capital of France?").unwrap(),
        "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    );
    assert!(tok.is_end(tok.token_to_id("<end_of_turn>").unwrap()));
}

#[test]
fn gemma3_matches_hugging_face_transformers() {
    if !gguf_python::python_has(&["numpy", "gguf", "torch", "transformers"]) {
        return;
    }
    let Some(path) = gguf_python::gemma3() else {
        return;
    };
    let model = load_model(&path).unwrap();
    let tok = model
        .tokenizer
        .as_ref()
        .expect("gemma3 carries a tokenizer");
    let dir = hf_reference(&path);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();

    // Tokenizer: every text, including spaces, newlines, bytes outside the
    // vocabulary and tokens written in the text.
    for (text, ids) in reference["tokenize"].as_object().unwrap() {
        let want: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
    }

    let mut fwd = CpuForward::new(&model.weights, Precision::F32, &Switches::none()).unwrap();
    for p in reference["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(p["ids"].clone()).unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids);
        let (shape, hf) = npy_f32(&dir.join(p["logits"].as_str().unwrap()));
        assert_eq!(shape, [ids.len(), 262144]);
        let ours = logits_per_position(&mut fwd, &ids);
        let mut worst = 1f64;
        for (pos, row) in ours.iter().enumerate() {
            let theirs = &hf[pos * 262144..(pos + 1) * 262144];
            let cos = cosine(row, theirs);
            worst = worst.min(cos);
            assert!(cos >= 0.99999, "{text:?} position {pos}: cosine {cos}");
            assert_eq!(
                argmax(row),
                argmax(theirs),
                "{text:?} position {pos}: argmax"
            );
        }
        eprintln!(
            "{text:?}: {} positions, worst logits cosine 1 - {:.2e}",
            ids.len(),
            1.0 - worst
        );

        // Greedy tokens: ours (batched prefill, then decode) equal HF's.
        let want: Vec<u32> = serde_json::from_value(p["greedy"].clone()).unwrap();
        fwd.reset();
        let got = generate::greedy(&mut fwd, &ids, want.len(), &[]).unwrap();
        assert_eq!(got.tokens, want, "{text:?}: greedy tokens");
        eprintln!("{text:?} -> {:?}", tok.decode(&got.tokens).unwrap());
    }
}
