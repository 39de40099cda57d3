//! The CPU forward gives the same bits on 1, 2 and 3 threads, on a model and
//! prompt large enough that every op runs its parallel path (the row passes
//! need 4,096 elements): Q4_1 matrices, a Q8_0 embedding, in f32, q8 and
//! f64, over a prefill and the decode step after it.

use kernels::cpu::CpuForward;
use kernels::switches::Switches;
use kernels::{Forward, Precision};
use model::quant::{quantize_q4_1, quantize_q8_0};
use model::{GgmlType, LayerWeights, LlamaConfig, ModelWeights, QTensor};

/// SplitMix64, so the model is the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn values(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + scale * self.next()).collect()
    }
}

fn tensor(name: &str, shape: [usize; 2], ty: GgmlType, rng: &mut Rng) -> QTensor {
    let x = rng.values(shape[0] * shape[1], 0.2, 0.0);
    let data = match ty {
        GgmlType::Q4_1 => quantize_q4_1(&x).unwrap(),
        GgmlType::Q8_0 => quantize_q8_0(&x).unwrap(),
        _ => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    QTensor {
        name: name.into(),
        ggml_type: ty,
        // [rows, cols], as `QTensor::rows` and `cols` read it.
        shape: shape.to_vec(),
        data: data.into(),
    }
}

fn norm(name: &str, d: usize, rng: &mut Rng) -> QTensor {
    let x = rng.values(d, 0.1, 1.0);
    QTensor {
        name: name.into(),
        ggml_type: GgmlType::F32,
        shape: vec![d],
        data: x
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    }
}

/// Two layers, 128 wide, GQA (4 query heads over 2 KV heads), tied output.
fn model() -> ModelWeights {
    let config = LlamaConfig {
        arch: "llama".into(),
        n_layer: 2,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        n_ff: 256,
        vocab_size: 160,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        context_length: 64,
        family: model::ModelFamily::llama(),
    };
    let (d, kv, ff) = (config.n_embd, 64, config.n_ff);
    let mut rng = Rng(11);
    let q4 = GgmlType::Q4_1;
    let layers = (0..config.n_layer)
        .map(|i| {
            let name = |t: &str| format!("blk.{i}.{t}.weight");
            LayerWeights {
                attn_norm: norm(&name("attn_norm"), d, &mut rng),
                wq: tensor(&name("attn_q"), [d, d], q4, &mut rng),
                wk: tensor(&name("attn_k"), [kv, d], q4, &mut rng),
                wv: tensor(&name("attn_v"), [kv, d], q4, &mut rng),
                wo: tensor(&name("attn_output"), [d, d], q4, &mut rng),
                ffn_norm: norm(&name("ffn_norm"), d, &mut rng),
                w_gate: tensor(&name("ffn_gate"), [ff, d], q4, &mut rng),
                w_up: tensor(&name("ffn_up"), [ff, d], q4, &mut rng),
                w_down: tensor(&name("ffn_down"), [d, ff], q4, &mut rng),
                bq: None,
                bk: None,
                bv: None,
                extra_norms: Default::default(),
            }
        })
        .collect();
    let token_embd = tensor(
        "token_embd.weight",
        [config.vocab_size, d],
        GgmlType::Q8_0,
        &mut rng,
    );
    let output_norm = norm("output_norm.weight", d, &mut rng);
    ModelWeights {
        config,
        token_embd,
        layers,
        output_norm,
        output: None,
    }
}

/// 40 rows: 40 × 128 = 5,120 elements, past the row passes' 4,096.
fn prompt() -> Vec<u32> {
    (0..40u32).map(|i| (i * 37 + 5) % 160).collect()
}

/// The prefill's last logits and the next decode step's, as bits, computed
/// on a pool of `threads`.
fn run(w: &ModelWeights, p: Precision, tokens: &[u32], threads: usize) -> Vec<u32> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let mut f = CpuForward::new(w, p, &Switches::none()).unwrap();
        let mut out = f.forward(None, tokens, 0).unwrap();
        out.extend(f.forward(None, &[7], tokens.len()).unwrap());
        out.iter().map(|v| v.to_bits()).collect()
    })
}

#[test]
fn every_precision_gives_the_same_bits_on_1_2_and_3_threads() {
    let (w, tokens) = (model(), prompt());
    for p in [Precision::F32, Precision::Q8, Precision::F64] {
        let one = run(&w, p, &tokens, 1);
        assert!(
            one.iter().all(|b| f32::from_bits(*b).is_finite()),
            "{p}: finite"
        );
        for threads in [2, 3] {
            assert_eq!(
                one,
                run(&w, p, &tokens, threads),
                "{p} on {threads} threads"
            );
        }
        // The comparison sees a difference where there is one: the same
        // prompt with its first token changed moves the last row's logits
        // (through attention), on any thread count.
        let mut other = tokens.clone();
        other[0] = (other[0] + 1) % 160;
        assert_ne!(one, run(&w, p, &other, 2), "{p}: a changed token");
    }
    // q8 and f32 differ on quantized weights (the q8 path ran).
    assert_ne!(
        run(&w, Precision::F32, &tokens, 2),
        run(&w, Precision::Q8, &tokens, 2)
    );
}
