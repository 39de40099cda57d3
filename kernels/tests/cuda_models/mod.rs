//! The seeded models and helpers the CUDA forward tests share
//! (`cuda_forward.rs`, `cuda_fused.rs`, `cuda_chain.rs`, `cuda_tp.rs`).
#![allow(dead_code)]

use std::sync::Mutex;

use kernels::cuda::device::driver_present;
use kernels::cuda::{CudaForward, EarlyLaunch};
use kernels::switches::Switches;
use kernels::{Forward, Precision};
use model::{GgmlType, LayerWeights, LlamaConfig, ModelWeights, QTensor};

/// Capture is process-global: tests that arm it, or run forwards while
/// another one is armed, take turns.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn have_gpu() -> bool {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this host");
        return false;
    }
    true
}

pub struct Rng(pub u64);

impl Rng {
    pub fn f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

pub fn tensor(
    rng: &mut Rng,
    name: &str,
    ty: GgmlType,
    shape: &[usize],
    scale: f32,
    offset: f32,
) -> QTensor {
    let n: usize = shape.iter().product();
    let x: Vec<f32> = (0..n).map(|_| offset + rng.f32() * scale).collect();
    let data = match ty {
        GgmlType::Q4_1 => model::quant::quantize_q4_1(&x).unwrap(),
        GgmlType::Q8_0 => model::quant::quantize_q8_0(&x).unwrap(),
        _ => model::quant::encode_float(ty, &x).unwrap(),
    };
    QTensor {
        name: name.into(),
        ggml_type: ty,
        shape: shape.to_vec(),
        data: data.into(),
    }
}

/// Two layers of the real model's layout at a small size: Q4_1 linear
/// weights, a Q8_0 tied embedding, F32 norms, 4 query heads over 2 KV heads.
pub fn tiny_model() -> ModelWeights {
    let config = LlamaConfig {
        arch: "llama".into(),
        n_layer: 2,
        n_embd: 64,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_ff: 96,
        vocab_size: 97,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        context_length: 64,
        family: model::ModelFamily::llama(),
    };
    let mut r = Rng(42);
    let (d, qw, kvw, ff) = (64, 64, 32, 96);
    let q41 = GgmlType::Q4_1;
    let layers = (0..config.n_layer)
        .map(|l| LayerWeights {
            attn_norm: tensor(
                &mut r,
                &format!("blk.{l}.attn_norm"),
                GgmlType::F32,
                &[d],
                0.2,
                1.0,
            ),
            wq: tensor(&mut r, &format!("blk.{l}.attn_q"), q41, &[qw, d], 0.3, 0.0),
            wk: tensor(&mut r, &format!("blk.{l}.attn_k"), q41, &[kvw, d], 0.3, 0.0),
            wv: tensor(&mut r, &format!("blk.{l}.attn_v"), q41, &[kvw, d], 0.3, 0.0),
            wo: tensor(
                &mut r,
                &format!("blk.{l}.attn_output"),
                q41,
                &[d, qw],
                0.3,
                0.0,
            ),
            ffn_norm: tensor(
                &mut r,
                &format!("blk.{l}.ffn_norm"),
                GgmlType::F32,
                &[d],
                0.2,
                1.0,
            ),
            w_gate: tensor(
                &mut r,
                &format!("blk.{l}.ffn_gate"),
                q41,
                &[ff, d],
                0.3,
                0.0,
            ),
            w_up: tensor(&mut r, &format!("blk.{l}.ffn_up"), q41, &[ff, d], 0.3, 0.0),
            w_down: tensor(
                &mut r,
                &format!("blk.{l}.ffn_down"),
                q41,
                &[d, ff],
                0.3,
                0.0,
            ),
            bq: None,
            bk: None,
            bv: None,
            extra_norms: Default::default(),
        })
        .collect();
    ModelWeights {
        token_embd: tensor(&mut r, "token_embd", GgmlType::Q8_0, &[97, d], 1.0, 0.0),
        output_norm: tensor(&mut r, "output_norm", GgmlType::F32, &[d], 0.2, 1.0),
        output: None,
        layers,
        config,
    }
}

pub fn cuda(w: &ModelWeights, p: Precision) -> Box<dyn Forward> {
    kernels::cuda::open(w, p, &Switches::none()).expect("open the CUDA forward")
}

pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0f64, f64::max)
        / scale
}

pub const PROMPT: [u32; 7] = [1, 17, 42, 5, 96, 0, 33];

/// Random K-quant blocks under valid f16 scales (no K-quant quantizer on the
/// CPU side): `[rows, cols]`, cols a multiple of 256.
pub fn k_quant(r: &mut Rng, name: &str, ty: GgmlType, rows: usize, cols: usize) -> QTensor {
    let mut data = Vec::new();
    for _ in 0..rows * cols / 256 {
        let mut f16 = || half::f16::from_f32(0.002 * (1.5 + r.f32())).to_le_bytes();
        let (d, dmin) = (f16(), f16());
        let mut bytes =
            |n: usize| -> Vec<u8> { (0..n).map(|_| ((r.f32() + 1.0) * 127.9) as u8).collect() };
        if ty == GgmlType::Q6_K {
            data.extend(bytes(208));
            data.extend_from_slice(&d);
        } else {
            data.extend_from_slice(&d);
            data.extend_from_slice(&dmin);
            data.extend(bytes(ty.type_size() - 4));
        }
    }
    QTensor {
        name: name.into(),
        ggml_type: ty,
        shape: vec![rows, cols],
        data: data.into(),
    }
}

/// [`tiny_model`] as a Gemma 3: q/k norms, post norms, GeGLU, RoPE over
/// halves, a scaled embedding, a window of 4 positions on layer 0 and
/// global attention on layer 1, Q4_K o_proj and Q6_K ffn_down.
pub fn tiny_gemma() -> ModelWeights {
    let mut w = tiny_model();
    let mut r = Rng(7);
    let (d, hd, ff) = (64, 64, 256);
    let c = &mut w.config;
    c.arch = "gemma3".into();
    c.n_head = 4;
    c.n_head_kv = 1;
    c.head_dim = hd;
    c.n_ff = ff;
    c.rms_eps = 1e-6;
    c.family = model::gemma3::family(2, 1e6, 4);
    c.family.layers[1].window = None;
    let q41 = GgmlType::Q4_1;
    let f32n = |r: &mut Rng, name: String, n| tensor(r, &name, GgmlType::F32, &[n], 0.2, 1.0);
    for (l, lw) in w.layers.iter_mut().enumerate() {
        lw.wq = tensor(
            &mut r,
            &format!("blk.{l}.attn_q"),
            q41,
            &[4 * hd, d],
            0.3,
            0.0,
        );
        lw.wk = tensor(&mut r, &format!("blk.{l}.attn_k"), q41, &[hd, d], 0.3, 0.0);
        lw.wv = tensor(&mut r, &format!("blk.{l}.attn_v"), q41, &[hd, d], 0.3, 0.0);
        lw.wo = k_quant(
            &mut r,
            &format!("blk.{l}.attn_output"),
            GgmlType::Q4_K,
            d,
            4 * hd,
        );
        lw.w_gate = tensor(
            &mut r,
            &format!("blk.{l}.ffn_gate"),
            q41,
            &[ff, d],
            0.3,
            0.0,
        );
        lw.w_up = tensor(&mut r, &format!("blk.{l}.ffn_up"), q41, &[ff, d], 0.3, 0.0);
        lw.w_down = k_quant(&mut r, &format!("blk.{l}.ffn_down"), GgmlType::Q6_K, d, ff);
        lw.extra_norms.q_norm = Some(f32n(&mut r, format!("blk.{l}.attn_q_norm"), hd));
        lw.extra_norms.k_norm = Some(f32n(&mut r, format!("blk.{l}.attn_k_norm"), hd));
        lw.extra_norms.post_attn_norm =
            Some(f32n(&mut r, format!("blk.{l}.post_attention_norm"), d));
        lw.extra_norms.post_ffn_norm = Some(f32n(&mut r, format!("blk.{l}.post_ffw_norm"), d));
    }
    w
}

/// Random Q5_0 blocks under a valid f16 scale (no Q5_0 quantizer on the CPU
/// side): `[rows, cols]`.
pub fn q5_0(r: &mut Rng, name: &str, rows: usize, cols: usize) -> QTensor {
    let mut data = Vec::new();
    for _ in 0..rows * cols / 32 {
        data.extend_from_slice(&half::f16::from_f32(0.02 * (1.5 + r.f32())).to_le_bytes());
        data.extend((0..20).map(|_| ((r.f32() + 1.0) * 127.9) as u8));
    }
    QTensor {
        name: name.into(),
        ggml_type: GgmlType::Q5_0,
        shape: vec![rows, cols],
        data: data.into(),
    }
}

/// A CUDA forward over `w` in f32, fused or not.
pub fn open_fused(
    dev: &std::sync::Arc<kernels::cuda::Device>,
    w: &ModelWeights,
    fused: bool,
) -> CudaForward {
    let mut f = CudaForward::new(dev.clone(), w, Precision::F32, &Switches::none()).unwrap();
    f.set_fused(fused);
    f
}

/// The llama skeleton over several weight layouts: the tiny model (Q4_1
/// projections, a Q8_0 tied embedding, 97 logits: a tail block of one), the
/// tiny Gemma's weights (Q4_K o_proj, Q6_K ffn_down, head_dim 64, one KV
/// head), and float weights with an untied F16 output.
pub fn weight_layouts() -> Vec<(&'static str, ModelWeights)> {
    let mut gemma_weights = tiny_gemma();
    gemma_weights.config.family = model::ModelFamily::llama();
    for lw in &mut gemma_weights.layers {
        lw.extra_norms = Default::default();
    }
    let mut floats = tiny_model();
    let mut r = Rng(11);
    for (l, lw) in floats.layers.iter_mut().enumerate() {
        lw.wq = tensor(
            &mut r,
            &format!("blk.{l}.attn_q"),
            GgmlType::F32,
            &[64, 64],
            0.3,
            0.0,
        );
        lw.w_up = tensor(
            &mut r,
            &format!("blk.{l}.ffn_up"),
            GgmlType::F16,
            &[96, 64],
            0.3,
            0.0,
        );
        lw.w_down = tensor(
            &mut r,
            &format!("blk.{l}.ffn_down"),
            GgmlType::Q8_0,
            &[64, 96],
            0.3,
            0.0,
        );
    }
    floats.output = Some(tensor(&mut r, "output", GgmlType::F16, &[97, 64], 0.5, 0.0));
    let mut out = vec![
        ("q4_1", tiny_model()),
        ("k-quants", gemma_weights),
        ("floats", floats),
    ];
    for (_, w) in &mut out {
        // Room past the cache's first capacity (64 positions).
        w.config.context_length = 256;
    }
    out
}

/// 20 tokens: three row passes of eight, the last partial.
pub fn long_prompt() -> Vec<u32> {
    (0..20u32).map(|i| (i * 37 + 5) % 97).collect()
}

/// Runs `f` on GPU 0 for every early-launch mode (the device set to it)
/// and every one of [`weight_layouts`], with the layout's name and the
/// mode in `name`, taking turns with the other tests; says why and runs
/// nothing without a GPU.
pub fn each_launch_mode_and_layout(
    mut f: impl FnMut(&std::sync::Arc<kernels::cuda::Device>, EarlyLaunch, &str, &ModelWeights),
) {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let dev = kernels::cuda::Device::open(0).unwrap();
    for early in EarlyLaunch::ALL {
        dev.set_early_launch(early);
        for (name, w) in weight_layouts() {
            f(&dev, early, &format!("{name}, early launch {early:?}"), &w);
        }
    }
}
