//! The CPU forward on seeded synthetic models: determinism (on any thread
//! count), prefill/decode agreement, slots, precision modes, bad input.

use kernels::cpu::CpuForward;
use kernels::generate::{greedy, greedy_batch};
use kernels::switches::{ActPrecision, Family, Switches};
use kernels::{Forward, ForwardError, Precision};
use model::quant::{quantize_q4_1, quantize_q8_0};
use model::{GgmlType, LayerWeights, LlamaConfig, ModelWeights, QTensor};

/// SplitMix64: a tiny seeded generator, so the model is the same everywhere.
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
}

fn f32_tensor(name: &str, shape: &[usize], rng: &mut Rng, scale: f32, offset: f32) -> QTensor {
    let n: usize = shape.iter().product();
    let data: Vec<u8> = (0..n)
        .flat_map(|_| (offset + scale * rng.next()).to_le_bytes())
        .collect();
    QTensor {
        name: name.into(),
        ggml_type: GgmlType::F32,
        shape: shape.to_vec(),
        data: data.into(),
    }
}

/// A 3-layer model with GQA (4 query heads over 2 KV heads), untied output.
fn model(tied: bool) -> ModelWeights {
    let config = LlamaConfig {
        arch: "llama".into(),
        n_layer: 3,
        n_embd: 64,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_ff: 96,
        vocab_size: 97,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        context_length: 32,
        family: model::ModelFamily::llama(),
    };
    let mut rng = Rng(7);
    let (d, kv, ff) = (
        config.n_embd,
        config.n_head_kv * config.head_dim,
        config.n_ff,
    );
    let s = 0.25;
    let layers = (0..config.n_layer)
        .map(|i| LayerWeights {
            attn_norm: f32_tensor(
                &format!("blk.{i}.attn_norm.weight"),
                &[d],
                &mut rng,
                0.1,
                1.0,
            ),
            wq: f32_tensor(&format!("blk.{i}.attn_q.weight"), &[d, d], &mut rng, s, 0.0),
            wk: f32_tensor(
                &format!("blk.{i}.attn_k.weight"),
                &[kv, d],
                &mut rng,
                s,
                0.0,
            ),
            wv: f32_tensor(
                &format!("blk.{i}.attn_v.weight"),
                &[kv, d],
                &mut rng,
                s,
                0.0,
            ),
            wo: f32_tensor(
                &format!("blk.{i}.attn_output.weight"),
                &[d, d],
                &mut rng,
                s,
                0.0,
            ),
            ffn_norm: f32_tensor(
                &format!("blk.{i}.ffn_norm.weight"),
                &[d],
                &mut rng,
                0.1,
                1.0,
            ),
            w_gate: f32_tensor(
                &format!("blk.{i}.ffn_gate.weight"),
                &[ff, d],
                &mut rng,
                s,
                0.0,
            ),
            w_up: f32_tensor(
                &format!("blk.{i}.ffn_up.weight"),
                &[ff, d],
                &mut rng,
                s,
                0.0,
            ),
            w_down: f32_tensor(
                &format!("blk.{i}.ffn_down.weight"),
                &[d, ff],
                &mut rng,
                s,
                0.0,
            ),
            bq: None,
            bk: None,
            bv: None,
            extra_norms: Default::default(),
        })
        .collect();
    let token_embd = f32_tensor(
        "token_embd.weight",
        &[config.vocab_size, d],
        &mut rng,
        1.0,
        0.0,
    );
    let output_norm = f32_tensor("output_norm.weight", &[d], &mut rng, 0.1, 1.0);
    let output =
        (!tied).then(|| f32_tensor("output.weight", &[config.vocab_size, d], &mut rng, s, 0.0));
    ModelWeights {
        config,
        token_embd,
        layers,
        output_norm,
        output,
    }
}

const PROMPT: [u32; 9] = [1, 5, 96, 0, 42, 42, 17, 3, 64];

fn open(w: &ModelWeights, p: Precision) -> CpuForward {
    CpuForward::new(w, p, &Switches::none()).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn f32_twice_is_bitwise_identical_whatever_the_thread_count() {
    let w = model(false);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| open(&w, Precision::F32).forward(None, &PROMPT, 0).unwrap())
    };
    let one = run(1);
    assert_eq!(bits(&one), bits(&run(1)));
    assert_eq!(bits(&one), bits(&run(3)));
}

#[test]
fn prefill_equals_token_by_token_decode_bitwise() {
    // Every op is row-independent with a fixed reduction order, so position
    // p computed in a batch equals position p computed alone.
    let w = model(false);
    for p in [Precision::F32, Precision::F64] {
        let mut a = open(&w, p);
        let batched = a.forward(None, &PROMPT, 0).unwrap();
        let mut b = open(&w, p);
        let mut last = Vec::new();
        for (i, t) in PROMPT.iter().enumerate() {
            last = b.forward(None, &[*t], i).unwrap();
        }
        assert_eq!(bits(&batched), bits(&last), "{p}");
    }
}

#[test]
fn f64_differs_from_f32_but_agrees_closely() {
    let w = model(false);
    let f32_logits = open(&w, Precision::F32).forward(None, &PROMPT, 0).unwrap();
    let f64_logits = open(&w, Precision::F64).forward(None, &PROMPT, 0).unwrap();
    assert_ne!(
        bits(&f32_logits),
        bits(&f64_logits),
        "f64 mode must really run in f64"
    );
    let cos = cosine(&f32_logits, &f64_logits);
    assert!(cos > 0.99999, "cosine {cos}");
}

#[test]
fn q8_on_float_weights_quantizes_nothing() {
    // llama.cpp quantizes activations only for block-quantized weights.
    let w = model(false);
    let f32_logits = open(&w, Precision::F32).forward(None, &PROMPT, 0).unwrap();
    let q8_logits = open(&w, Precision::Q8).forward(None, &PROMPT, 0).unwrap();
    assert_eq!(bits(&f32_logits), bits(&q8_logits));
}

#[test]
fn tied_output_reads_the_embedding() {
    let w = model(true);
    let logits = open(&w, Precision::F32).forward(None, &[3], 0).unwrap();
    assert_eq!(logits.len(), 97);
    assert!(logits.iter().all(|v| v.is_finite()));
}

#[test]
fn rerunning_a_position_replaces_the_cache() {
    let w = model(false);
    let mut f = open(&w, Precision::F32);
    let first = f.forward(None, &PROMPT, 0).unwrap();
    f.forward(None, &[9, 9, 9], 2).unwrap();
    let again = f.forward(None, &PROMPT[2..], 2).unwrap();
    assert_eq!(bits(&first), bits(&again));
}

#[test]
fn slots_decode_like_lone_sequences() {
    let w = model(false);
    let prompts = vec![PROMPT.to_vec(), vec![4, 8, 15, 16, 23, 42], vec![77]];
    let mut f = open(&w, Precision::F32);
    let batch = greedy_batch(&mut f, &prompts, 5, &[]).unwrap();
    for (p, g) in prompts.iter().zip(&batch) {
        let mut lone = open(&w, Precision::F32);
        let alone = greedy(&mut lone, p, 5, &[]).unwrap();
        assert_eq!(alone, *g);
        assert_eq!(g.tokens.len(), 5);
    }
    // The slots really hold different sequences.
    assert_ne!(batch[0].tokens, batch[2].tokens);
}

#[test]
fn greedy_stops_at_a_stop_token_and_prefill_only_generates_nothing() {
    let w = model(false);
    let mut f = open(&w, Precision::F32);
    let g = greedy(&mut f, &PROMPT, 4, &[]).unwrap();
    f.reset();
    let stopped = greedy(&mut f, &PROMPT, 4, &[g.tokens[1]]).unwrap();
    assert!(stopped.stopped);
    assert_eq!(stopped.tokens, g.tokens[..2].to_vec());
    f.reset();
    assert!(greedy(&mut f, &PROMPT, 0, &[]).unwrap().tokens.is_empty());
}

#[test]
fn switches_override_the_precision_per_family() {
    // On float weights q8 is a no-op, so a switched f32 forward equals plain f32.
    let w = model(false);
    let s = Switches::none().with(Family::FfnDown, ActPrecision::Q8);
    let switched = CpuForward::new(&w, Precision::F32, &s)
        .unwrap()
        .forward(None, &PROMPT, 0)
        .unwrap();
    let plain = open(&w, Precision::F32).forward(None, &PROMPT, 0).unwrap();
    assert_eq!(bits(&switched), bits(&plain));
}

#[test]
fn bad_input_is_refused_before_running() {
    let w = model(false);
    let mut f = open(&w, Precision::F32);
    assert!(matches!(
        f.forward(None, &[97], 0),
        Err(ForwardError::TokenOutOfRange { id: 97, vocab: 97 })
    ));
    assert!(matches!(
        f.forward(None, &[1; 33], 0),
        Err(ForwardError::ContextOverflow {
            end: 33,
            context: 32
        })
    ));
    assert!(
        f.forward(None, &[1; 32], 0).is_ok(),
        "exactly the context fits"
    );
    f.reset();
    assert!(matches!(
        f.forward(None, &[], 0),
        Err(ForwardError::Unsupported(_))
    ));
    assert!(
        matches!(f.forward(None, &[1], 3), Err(ForwardError::Unsupported(_))),
        "a gap in the cache"
    );
    // A decode step of a slot that was never prefilled, and a ragged batch.
    assert!(matches!(
        f.decode_batch(&[1], &[5]),
        Err(ForwardError::Unsupported(_))
    ));
    assert!(matches!(
        f.decode_batch(&[1, 2], &[0]),
        Err(ForwardError::Unsupported(_))
    ));
}

// The same bits on 1, 2 and 3 threads, on a model and prompt large enough
// that every op runs its parallel path (the row passes need 4,096
// elements): Q4_1 matrices, a Q8_0 embedding, in f32, q8 and f64, over a
// prefill and the decode step after it.

fn q_tensor(name: &str, shape: [usize; 2], ty: GgmlType, rng: &mut Rng) -> QTensor {
    let x: Vec<f32> = (0..shape[0] * shape[1]).map(|_| 0.2 * rng.next()).collect();
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

fn q_norm(name: &str, d: usize, rng: &mut Rng) -> QTensor {
    let x: Vec<f32> = (0..d).map(|_| 1.0 + 0.1 * rng.next()).collect();
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
fn wide_q4_model() -> ModelWeights {
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
                attn_norm: q_norm(&name("attn_norm"), d, &mut rng),
                wq: q_tensor(&name("attn_q"), [d, d], q4, &mut rng),
                wk: q_tensor(&name("attn_k"), [kv, d], q4, &mut rng),
                wv: q_tensor(&name("attn_v"), [kv, d], q4, &mut rng),
                wo: q_tensor(&name("attn_output"), [d, d], q4, &mut rng),
                ffn_norm: q_norm(&name("ffn_norm"), d, &mut rng),
                w_gate: q_tensor(&name("ffn_gate"), [ff, d], q4, &mut rng),
                w_up: q_tensor(&name("ffn_up"), [ff, d], q4, &mut rng),
                w_down: q_tensor(&name("ffn_down"), [d, ff], q4, &mut rng),
                bq: None,
                bk: None,
                bv: None,
                extra_norms: Default::default(),
            }
        })
        .collect();
    let token_embd = q_tensor(
        "token_embd.weight",
        [config.vocab_size, d],
        GgmlType::Q8_0,
        &mut rng,
    );
    let output_norm = q_norm("output_norm.weight", d, &mut rng);
    ModelWeights {
        config,
        token_embd,
        layers,
        output_norm,
        output: None,
    }
}

/// 40 rows: 40 × 128 = 5,120 elements, past the row passes' 4,096.
fn wide_prompt() -> Vec<u32> {
    (0..40u32).map(|i| (i * 37 + 5) % 160).collect()
}

/// The prefill's last logits and the next decode step's, as bits, computed
/// on a pool of `threads`.
fn run_on(w: &ModelWeights, p: Precision, tokens: &[u32], threads: usize) -> Vec<u32> {
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
    let (w, tokens) = (wide_q4_model(), wide_prompt());
    for p in [
        Precision::F32,
        Precision::Q8,
        Precision::F64,
        Precision::LlamaCpp,
    ] {
        let one = run_on(&w, p, &tokens, 1);
        assert!(
            one.iter().all(|b| f32::from_bits(*b).is_finite()),
            "{p}: finite"
        );
        for threads in [2, 3] {
            assert_eq!(
                one,
                run_on(&w, p, &tokens, threads),
                "{p} on {threads} threads"
            );
        }
        // The comparison sees a difference where there is one: the same
        // prompt with its first token changed moves the last row's logits
        // (through attention), on any thread count.
        let mut other = tokens.clone();
        other[0] = (other[0] + 1) % 160;
        assert_ne!(one, run_on(&w, p, &other, 2), "{p}: a changed token");
    }
    // q8 and f32 differ on quantized weights (the q8 path ran).
    assert_ne!(
        run_on(&w, Precision::F32, &tokens, 2),
        run_on(&w, Precision::Q8, &tokens, 2)
    );
}
