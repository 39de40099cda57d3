//! The tiny fixture models: GGUF and HF forms load to the same weights, the
//! build is deterministic, and the planted outlier does what the docs say.

mod gguf_python;

use fixtures::{OUTLIER_DIM, OUTLIER_TOKEN, OUTLIER_VALUE};
use model::load::{load_model, LoadedModel, ModelFormat};
use model::GgmlType;

/// Names of tensors whose dequantized values differ in any bit.
fn differing(a: &LoadedModel, b: &LoadedModel) -> Vec<String> {
    a.weights
        .tensors()
        .into_iter()
        .zip(b.weights.tensors())
        .filter(|(x, y)| {
            let (fx, fy) = (x.to_f32().unwrap(), y.to_f32().unwrap());
            x.shape != y.shape
                || fx
                    .iter()
                    .map(|v| v.to_bits())
                    .ne(fy.iter().map(|v| v.to_bits()))
        })
        .map(|(x, _)| x.name.clone())
        .collect()
}

#[test]
fn gguf_and_hf_forms_load_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    for name in fixtures::NAMES {
        let g = load_model(fixtures::write(name, dir.path()).unwrap()).unwrap();
        let h = load_model(fixtures::write_hf(name, dir.path()).unwrap()).unwrap();
        assert_eq!(g.source.format, ModelFormat::Gguf);
        assert_eq!(h.source.format, ModelFormat::HfSafetensors);
        assert_eq!(g.weights.config, h.weights.config, "{name}");
        assert_eq!(g.weights.config, fixtures::config(name).unwrap());
        assert_eq!(g.weights.output.is_some(), h.weights.output.is_some());
        assert_eq!(differing(&g, &h), Vec::<String>::new(), "{name}");

        let (gt, ht) = (g.tokenizer.unwrap(), h.tokenizer.unwrap());
        for text in ["Hello, world! 123", "<|im_start|>user\nhé<|im_end|>\n", ""] {
            assert_eq!(
                gt.encode(text).unwrap(),
                ht.encode(text).unwrap(),
                "{text:?}"
            );
        }
    }
}

#[test]
fn the_comparison_sees_a_single_changed_weight() {
    let dir = tempfile::tempdir().unwrap();
    let g = load_model(fixtures::write("tiny-f32", dir.path()).unwrap()).unwrap();
    let mut h = load_model(fixtures::write_hf("tiny-f32", dir.path()).unwrap()).unwrap();
    h.weights.layers[1].wk.data[5] ^= 1;
    assert_eq!(differing(&g, &h), vec!["blk.1.attn_k.weight".to_string()]);
}

#[test]
fn fixtures_are_deterministic_and_typed_as_documented() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for name in fixtures::NAMES {
        let pa = fixtures::write(name, a.path()).unwrap();
        let pb = fixtures::write(name, b.path()).unwrap();
        assert_eq!(
            std::fs::read(&pa).unwrap(),
            std::fs::read(&pb).unwrap(),
            "{name}"
        );
    }
    let q = load_model(fixtures::write("tiny-q", a.path()).unwrap()).unwrap();
    assert_eq!(q.weights.token_embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(q.weights.layers[2].w_up.ggml_type, GgmlType::Q4_1);
    assert!(q.weights.output.is_none());
    let c = &q.weights.config;
    assert!(c.n_head > c.n_head_kv, "GQA is exercised");
    assert!(fixtures::write("tiny-huge", a.path())
        .unwrap_err()
        .to_string()
        .contains("unknown fixture \"tiny-huge\""));
}

#[test]
fn fixture_tokenizer_is_byte_level_with_bos() {
    let tok = fixtures::tokenizer().unwrap();
    assert_eq!(tok.encode("A").unwrap(), [0, 3 + b'A' as u32]);
    assert_eq!(tok.encode(" é").unwrap(), [0, 3 + 0x20, 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(
        tok.decode(&tok.encode("héllo\n").unwrap()[1..]).unwrap(),
        "héllo\n"
    );
    let chat = tok.encode_chat("hi").unwrap();
    assert_eq!(&chat[..2], &[0, 1]);
    assert_eq!(tok.vocab_size(), 259);
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (v * v) as f64).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, g)| (*v as f64 * r) as f32 * g)
        .collect()
}

/// Symmetric int8 quantization of one block, dequantized back.
fn int8_block(x: &[f32]) -> Vec<f32> {
    let d = x.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
    x.iter().map(|v| (v / d).round() * d).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

#[test]
fn the_planted_outlier_is_crushed_by_int8_blocks() {
    let m = fixtures::weights("tiny-outlier").unwrap();
    let n = m.config.n_embd;
    let emb = m.token_embd.to_f32().unwrap();
    let row0 = &emb[OUTLIER_TOKEN as usize * n..][..n];
    assert_eq!(row0[OUTLIER_DIM], OUTLIER_VALUE);
    assert!(
        emb[n..].iter().all(|v| v.abs() <= 1.0),
        "only token 0 is massive"
    );

    let normed = rms_norm(row0, &m.layers[0].attn_norm.to_f32().unwrap(), 1e-5);
    assert!(normed[OUTLIER_DIM] < -6.0);
    let crushed = int8_block(&normed[..32]);
    let survivors = (0..32)
        .filter(|&i| i != OUTLIER_DIM && crushed[i] != 0.0)
        .count();
    assert_eq!(survivors, 0, "the other 31 values of block 0 round to zero");

    // The Q projection reads nothing from the outlier dimension, so its
    // output at position 0 changes substantially once block 0 is crushed.
    let wq = m.layers[0].wq.to_f32().unwrap();
    assert!(wq.chunks(n).all(|row| row[OUTLIER_DIM] == 0.0));
    let mut q8 = crushed;
    q8.extend(int8_block(&normed[32..]));
    let (exact, approx): (Vec<f32>, Vec<f32>) = wq
        .chunks(n)
        .map(|row| (dot(row, &normed) as f32, dot(row, &q8) as f32))
        .unzip();
    let cos = dot(&exact, &approx) / (dot(&exact, &exact) * dot(&approx, &approx)).sqrt();
    assert!(cos < 0.95, "q_proj cosine after crushing: {cos}");

    // Other tokens are not crushed: their int8 round trip stays close.
    let normed1 = rms_norm(
        &emb[n..2 * n],
        &m.layers[0].attn_norm.to_f32().unwrap(),
        1e-5,
    );
    let q1: Vec<f32> = normed1.chunks(32).flat_map(int8_block).collect();
    let cos1 = dot(&normed1, &q1) / (dot(&normed1, &normed1) * dot(&q1, &q1)).sqrt();
    assert!(cos1 > 0.9999, "{cos1}");
}

#[test]
fn hf_checkpoint_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let hf = fixtures::write_hf("tiny-f32", dir.path()).unwrap();
    let st = hf.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_model(&hf).unwrap_err().to_string();
    assert!(
        e.starts_with(&st.display().to_string()) && e.contains("not a safetensors file"),
        "{e}"
    );
    std::fs::remove_file(&st).unwrap();
    let e = load_model(&hf).unwrap_err().to_string();
    assert!(e.contains("no *.safetensors files"), "{e}");
    std::fs::write(hf.join("config.json"), "{").unwrap();
    let e = load_model(&hf).unwrap_err().to_string();
    assert!(e.contains("config.json: invalid JSON"), "{e}");
}

mod python {
    //! The HF and GGUF forms related by llama.cpp's own converter logic,
    //! in Python (fixtures/hf_vs_gguf.py).

    use super::gguf_python;
    use safetensors::tensor::TensorView;
    use safetensors::SafeTensors;

    fn check(gguf: &std::path::Path, hf: &std::path::Path) -> String {
        gguf_python::run_script("hf_vs_gguf.py", &[gguf.as_os_str(), hf.as_os_str()])
    }

    #[test]
    fn hf_forms_are_what_llama_cpp_would_convert() {
        if !gguf_python::python_has(&["numpy", "gguf", "safetensors"]) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for name in fixtures::NAMES {
            let g = fixtures::write(name, dir.path()).unwrap();
            let h = fixtures::write_hf(name, dir.path()).unwrap();
            let out = check(&g, &h);
            assert!(out.starts_with("checked "), "{name}: {out}");
        }

        // The classic bug: Q rows stored in GGUF order in the HF file.
        let g = dir.path().join("tiny-f32.gguf");
        let h = dir.path().join("tiny-f32-hf");
        let st_path = h.join("model.safetensors");
        let bytes = std::fs::read(&st_path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let owned: Vec<(String, Vec<usize>, Vec<u8>)> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| {
                let mut data = v.data().to_vec();
                if n.ends_with("q_proj.weight") {
                    let (rows, cols) = (v.shape()[0], v.shape()[1]);
                    data = model::load::permute_rope_rows(&data, 4, rows, 4 * cols);
                }
                (n, v.shape().to_vec(), data)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(n, s, d)| {
                let view = TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap();
                (n.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &st_path).unwrap();
        let out = check(&g, &h);
        let bad: Vec<&str> = out.lines().filter(|l| l.ends_with("differs")).collect();
        assert_eq!(
            bad,
            [
                "model.layers.0.self_attn.q_proj.weight -> blk.0.attn_q.weight: differs",
                "model.layers.1.self_attn.q_proj.weight -> blk.1.attn_q.weight: differs",
            ]
        );
    }
}
