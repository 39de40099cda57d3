//! HF checkpoints in F16 and BF16, sharded, and with an untied `lm_head`.

use std::collections::BTreeMap;

use model::load::load_model;
use model::quant::encode_float;
use model::GgmlType;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// Rewrites `model.safetensors` of an F32 checkpoint as two shards of `ty`.
fn convert(dir: &std::path::Path, ty: GgmlType) -> BTreeMap<String, Vec<f32>> {
    let src = dir.join("model.safetensors");
    let bytes = std::fs::read(&src).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let dtype = match ty {
        GgmlType::F16 => Dtype::F16,
        GgmlType::BF16 => Dtype::BF16,
        _ => unreachable!(),
    };
    let mut originals = BTreeMap::new();
    let mut encoded: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        encoded.push((
            name.clone(),
            view.shape().to_vec(),
            encode_float(ty, &values).unwrap(),
        ));
        originals.insert(name, values);
    }
    std::fs::remove_file(&src).unwrap();
    let (first, second) = encoded.split_at(encoded.len() / 2);
    for (i, shard) in [first, second].into_iter().enumerate() {
        let views: Vec<(String, TensorView<'_>)> = shard
            .iter()
            .map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
            .collect();
        let path = dir.join(format!("model-0000{}-of-00002.safetensors", i + 1));
        safetensors::serialize_to_file(views, None, &path).unwrap();
    }
    originals
}

#[test]
fn half_precision_sharded_checkpoints_load() {
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = fixtures::write_hf("tiny-outlier", tmp.path()).unwrap();
        let originals = convert(&dir, ty);
        let m = load_model(&dir).unwrap();
        assert_eq!(m.weights.token_embd.ggml_type, ty);
        assert_eq!(m.weights.layers[1].wq.ggml_type, ty);
        let lm_head = m.weights.output.as_ref().expect("tiny-outlier has lm_head");
        assert_eq!(lm_head.ggml_type, ty);

        // Values are the originals rounded to `ty`; V is not permuted.
        let v = m.weights.layers[0].wv.to_f32().unwrap();
        let want: Vec<f32> = originals["model.layers.0.self_attn.v_proj.weight"]
            .iter()
            .map(|&x| match ty {
                GgmlType::F16 => half::f16::from_f32(x).to_f32(),
                _ => half::bf16::from_f32(x).to_f32(),
            })
            .collect();
        assert_eq!(v, want, "{ty}");
        // The outlier survives, rounded (BF16 has steps of 16 there).
        let emb = m.weights.token_embd.to_f32().unwrap();
        let outlier = match ty {
            GgmlType::F16 => -3000.0,
            _ => -3008.0,
        };
        assert_eq!(emb[fixtures::OUTLIER_DIM], outlier);
        assert!(m.source.blake3.len() == 64);
    }
}

#[test]
fn unsupported_dtypes_and_architectures_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixtures::write_hf("tiny-f32", tmp.path()).unwrap();
    let extra = dir.join("zz-extra.safetensors");
    let data = vec![0u8; 4 * 64];
    let view = TensorView::new(Dtype::I32, vec![64], &data).unwrap();
    safetensors::serialize_to_file(
        vec![("model.layers.0.input_layernorm.weight".to_string(), view)],
        None,
        &extra,
    )
    .unwrap();
    let e = load_model(&dir).unwrap_err().to_string();
    assert!(
        e.contains("zz-extra.safetensors") && e.contains("I32"),
        "{e}"
    );
    std::fs::remove_file(&extra).unwrap();

    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"llama\"", "\"gpt_neox\"")
            .replace("LlamaForCausalLM", "GPTNeoXForCausalLM"),
    )
    .unwrap();
    let e = load_model(&dir).unwrap_err().to_string();
    assert!(e.contains("\"gpt_neox\" is not supported"), "{e}");
    // Qwen2 is a llama with biases, but not with its sliding window on.
    std::fs::write(
        &config,
        text.replace("\"llama\"", "\"qwen2\"")
            .replace("LlamaForCausalLM", "Qwen2ForCausalLM")
            .replacen('{', "{\"use_sliding_window\": true, ", 1),
    )
    .unwrap();
    let e = load_model(&dir).unwrap_err().to_string();
    assert!(e.contains("\"qwen2\" is not supported"), "{e}");
}
