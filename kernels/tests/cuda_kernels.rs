//! Differential tests: every CUDA kernel against its CPU op, on deterministic
//! inputs at boundary sizes (block size - 1, block size, block size + 1, the
//! matmul's 8-lane and 8-row passes, the real model's widths).
//!
//! The f32 kernels are written to sum in the CPU op's order without fused
//! multiply-adds, so most comparisons demand bitwise equality; where exp or
//! an integer dot product makes the two differ, the bound is stated in ulps
//! or relative error. Each test skips, saying so, where there is no GPU.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use kernels::cpu::attention::{attention as cpu_attention, attention_windowed, Heads};
use kernels::cpu::embedding::embed;
use kernels::cpu::ffn::{geglu as cpu_geglu, swiglu as cpu_swiglu};
use kernels::cpu::matmul::{matmul as cpu_matmul, matmul_with_mins, quantize_row, Act, Matrix};
use kernels::cpu::norm::rms_norm as cpu_rms_norm;
use kernels::cpu::rope::{rope as cpu_rope, rope_halves};
use kernels::cuda::device::{driver_present, Device};
use kernels::cuda::ops::{self, AttentionShape, DeviceMatrix, QuantizedActs};
use kernels::cuda::q8::{self, Q8Dot};
use model::RopeStyle;
use model::{GgmlType, QTensor};

/// The GPU, or `None` (with the reason printed) where there is none.
fn gpu() -> Option<Arc<Device>> {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this host");
        return None;
    }
    Some(Device::open(0).expect("a driver is present but GPU 0 would not open"))
}

/// splitmix64: deterministic inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// Distance in units in the last place between two finite floats.
fn ulps(a: f32, b: f32) -> u64 {
    let key = |v: f32| {
        let i = v.to_bits() as i32;
        (if i < 0 { i32::MIN - i } else { i }) as i64
    };
    (key(a) - key(b)).unsigned_abs()
}

/// Worst ulp distance of `gpu` from `cpu`, panicking on a length mismatch or
/// a nonfinite value on either side.
fn worst_ulps(what: &str, gpu: &[f32], cpu: &[f32]) -> u64 {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths differ");
    let mut worst = 0;
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert!(
            g.is_finite() && c.is_finite(),
            "{what}[{i}]: gpu {g}, cpu {c}"
        );
        worst = worst.max(ulps(*g, *c));
    }
    worst
}

fn assert_bitwise(what: &str, gpu: &[f32], cpu: &[f32]) {
    let worst = worst_ulps(what, gpu, cpu);
    assert_eq!(worst, 0, "{what}: the GPU is {worst} ulp from the CPU op");
}

/// Largest |gpu - cpu| relative to the largest |cpu|.
fn rel_err(gpu: &[f32], cpu: &[f32]) -> f64 {
    assert_eq!(gpu.len(), cpu.len());
    let scale = cpu
        .iter()
        .fold(0f64, |m, v| m.max(v.abs() as f64))
        .max(1e-30);
    gpu.iter()
        .zip(cpu)
        .map(|(g, c)| (*g as f64 - *c as f64).abs())
        .fold(0f64, f64::max)
        / scale
}

/// A `[rows, cols]` weight in `ty`, with values in [-scale, scale).
fn weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize, scale: f32) -> QTensor {
    let x = rng.vec(rows * cols, scale);
    let data = match ty {
        GgmlType::Q8_0 => model::quant::quantize_q8_0(&x).unwrap(),
        GgmlType::Q4_1 => model::quant::quantize_q4_1(&x).unwrap(),
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            // No quantizer on the CPU side: random quants under a valid
            // f16 scale exercise every nibble and high bit.
            let mut out = Vec::new();
            for _ in 0..rows * cols / 32 {
                let d = half::f16::from_f32(scale / 8.0 * (0.5 + rng.f32().abs()));
                out.extend_from_slice(&d.to_le_bytes());
                let rest = ty.type_size() - 2;
                out.extend((0..rest).map(|_| rng.next() as u8));
            }
            out
        }
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            // Random quants, scales and mins under valid f16 super-block
            // scales (Q4_K/Q5_K: d and dmin first; Q6_K and Q3_K: d last;
            // Q2_K: d and dmin last).
            let mut out = Vec::new();
            let f16 = |r: &mut Rng| {
                half::f16::from_f32(scale / 64.0 * (0.5 + r.f32().abs())).to_le_bytes()
            };
            for _ in 0..rows * cols / 256 {
                if matches!(ty, GgmlType::Q6_K | GgmlType::Q3_K) {
                    out.extend((0..ty.type_size() - 2).map(|_| rng.next() as u8));
                    out.extend_from_slice(&f16(rng));
                } else if ty == GgmlType::Q2_K {
                    out.extend((0..80).map(|_| rng.next() as u8));
                    out.extend_from_slice(&f16(rng));
                    out.extend_from_slice(&f16(rng));
                } else {
                    out.extend_from_slice(&f16(rng));
                    out.extend_from_slice(&f16(rng));
                    out.extend((4..ty.type_size()).map(|_| rng.next() as u8));
                }
            }
            out
        }
        _ => model::quant::encode_float(ty, &x).unwrap(),
    };
    QTensor {
        name: format!("w_{ty}_{rows}x{cols}"),
        ggml_type: ty,
        shape: vec![rows, cols],
        data: data.into(),
    }
}

fn dense(t: &QTensor) -> Matrix {
    Matrix {
        rows: t.rows(),
        cols: t.cols(),
        data: t.to_f32().unwrap(),
        block: t.ggml_type.block_size(),
    }
}

/// A Q4_1 weight's block minimums, `[rows, cols / 32]`: what the CPU's q8
/// dot adds llama.cpp's f16 min term with.
fn q4_1_mins(t: &QTensor) -> Vec<f32> {
    t.data
        .chunks_exact(20)
        .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32())
        .collect()
}

const K_QUANTS: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

const ALL_TYPES: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
];

#[test]
fn comparators_see_one_ulp() {
    // The helpers below must be able to fail: one ulp apart is red.
    let a = [1.0f32, -2.5, 3.0e-3];
    let mut b = a;
    b[2] = f32::from_bits(b[2].to_bits() + 1);
    assert_eq!(worst_ulps("self", &a, &a), 0);
    assert_eq!(worst_ulps("planted", &a, &b), 1);
    assert_eq!(ulps(-0.0, 0.0), 0);
    assert_eq!(ulps(f32::from_bits(1), -f32::from_bits(1)), 2);
}

#[test]
fn embedding_rows_are_the_cpu_dequantization() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(1);
    for ty in ALL_TYPES {
        for cols in [32, 64, 576] {
            let t = weight(&mut rng, ty, 37, cols, 2.0);
            let tokens = [0u32, 36, 5, 5, 17];
            let cpu: Vec<f32> = embed(&dense(&t), &tokens);
            let table = DeviceMatrix::upload(&dev, &t).unwrap();
            let tok = ops::upload(&dev, &tokens).unwrap();
            let mut out = dev
                .stream()
                .alloc_zeros::<f32>(tokens.len() * cols)
                .unwrap();
            ops::embedding(&dev, &table, &tok.as_view(), &mut out.as_view_mut()).unwrap();
            let gpu = ops::download(&dev, &out.as_view()).unwrap();
            assert_bitwise(&format!("embedding {ty} cols {cols}"), &gpu, &cpu);
        }
    }
}

#[test]
fn rms_norm_matches_at_block_boundaries() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(2);
    let mut worst = 0;
    for n in [1, 31, 32, 33, 255, 256, 257, 576, 1025] {
        for rows in [1, 3] {
            let x = rng.vec(rows * n, 4.0);
            let w = rng.vec(n, 1.5);
            let cpu: Vec<f32> = cpu_rms_norm(&x, &w, 1e-5);
            let (xd, wd) = (
                ops::upload(&dev, &x).unwrap(),
                ops::upload(&dev, &w).unwrap(),
            );
            let mut y = dev.stream().alloc_zeros::<f32>(rows * n).unwrap();
            ops::rms_norm(
                &dev,
                &xd.as_view(),
                &wd.as_view(),
                &mut y.as_view_mut(),
                rows,
                1e-5,
            )
            .unwrap();
            let gpu = ops::download(&dev, &y.as_view()).unwrap();
            // The f64 sum of squares may round differently in another order;
            // after rounding the mean to f32 that is at most one ulp.
            worst = worst.max(worst_ulps(
                &format!("rms_norm n {n} rows {rows}"),
                &gpu,
                &cpu,
            ));
        }
    }
    assert!(worst <= 1, "rms_norm: {worst} ulp from the CPU op");
}

#[test]
fn matmul_f32_is_bitwise_the_cpu_dot_order() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(3);
    // Float weights: any width, so the 8-lane tails (cols % 8) are covered;
    // rows around the 8-row pass; outputs around the 16 per block.
    // The last is too wide in f32 to stage in shared memory: the unstaged
    // path.
    let shapes = [
        (1, 7, 1),
        (15, 8, 7),
        (16, 9, 8),
        (17, 33, 9),
        (33, 576, 4),
        (17, 1600, 3),
    ];
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for (out, cols, rows) in shapes {
            check_matmul_f32(&dev, &mut rng, ty, out, cols, rows);
        }
    }
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
    ] {
        for (out, cols, rows) in [(1, 32, 1), (17, 64, 8), (64, 576, 9), (576, 1536, 3)] {
            check_matmul_f32(&dev, &mut rng, ty, out, cols, rows);
        }
    }
}

fn check_matmul_f32(
    dev: &Device,
    rng: &mut Rng,
    ty: GgmlType,
    out: usize,
    cols: usize,
    rows: usize,
) {
    let t = weight(rng, ty, out, cols, 0.5);
    let x = rng.vec(rows * cols, 3.0);
    let cpu: Vec<f32> = cpu_matmul(&x, rows, &dense(&t), Act::Float);
    let w = DeviceMatrix::upload(dev, &t).unwrap();
    let xd = ops::upload(dev, &x).unwrap();
    let mut y = dev.stream().alloc_zeros::<f32>(rows * out).unwrap();
    ops::matmul_f32(dev, &w, &xd.as_view(), &mut y.as_view_mut(), rows).unwrap();
    let gpu = ops::download(dev, &y.as_view()).unwrap();
    assert_bitwise(
        &format!("matmul_f32 {ty} [{out}, {cols}] x {rows} rows"),
        &gpu,
        &cpu,
    );
}

#[test]
fn quantize_q8_matches_the_cpu_quantizer() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(4);
    let mut x = rng.vec(4 * 576, 2.0);
    // A massive activation crushes its block; an all-zero block has scale 0.
    x[7] = -3664.0;
    for v in &mut x[64..96] {
        *v = 0.0;
    }
    let xd = ops::upload(&dev, &x).unwrap();
    let mut qa = QuantizedActs::alloc(&dev, x.len()).unwrap();
    ops::quantize_q8(&dev, &xd.as_view(), &mut qa, x.len()).unwrap();
    let q = ops::download(&dev, &qa.q.as_view()).unwrap();
    let d = ops::download(&dev, &qa.scales.as_view()).unwrap();
    let sums = ops::download(&dev, &qa.sums.as_view()).unwrap();
    let cpu = quantize_row(&x, 32);
    let cpu_q: Vec<i8> = cpu.q.iter().map(|v: &f32| *v as i8).collect();
    assert_eq!(q, cpu_q, "int8 quants");
    assert_bitwise("q8 scales", &d, &cpu.d);
    let cpu_sums: Vec<i32> = cpu_q
        .chunks(32)
        .map(|b| b.iter().map(|&v| v as i32).sum())
        .collect();
    assert_eq!(sums, cpu_sums);
    // block_q8_1's s: the block's sum times its unrounded scale, to f16.
    let s = ops::download(&dev, &qa.s.as_view()).unwrap();
    let cpu_s: Vec<f32> = x
        .chunks(32)
        .zip(&cpu_sums)
        .map(|(b, &sum)| {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            half::f16::from_f32(sum as f32 * scale).to_f32()
        })
        .collect();
    assert_bitwise("q8 block sums s", &s, &cpu_s);
    assert_eq!(q[7], -127, "the massive activation is its block's extreme");
    assert!(
        q[8..32].iter().all(|&v| v.abs() <= 1),
        "and crushes the rest of its block"
    );
}

#[test]
fn matmul_q8_dp4a_matches_the_cpu_q8_mode() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(5);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
    ] {
        for (out, cols, rows) in [(1, 32, 1), (17, 64, 8), (64, 576, 9), (576, 1536, 2)] {
            let t = weight(&mut rng, ty, out, cols, 0.5);
            let x = rng.vec(rows * cols, 3.0);
            let m = dense(&t);
            let mins = (ty == GgmlType::Q4_1).then(|| q4_1_mins(&t));
            let cpu_q8: Vec<f32> = matmul_with_mins(&x, rows, &m, mins.as_deref(), Act::Q8);
            let cpu_f32: Vec<f32> = cpu_matmul(&x, rows, &m, Act::Float);
            let w = DeviceMatrix::upload(&dev, &t).unwrap();
            let xd = ops::upload(&dev, &x).unwrap();
            let mut qa = QuantizedActs::alloc(&dev, rows * cols).unwrap();
            let mut y = dev.stream().alloc_zeros::<f32>(rows * out).unwrap();
            ops::quantize_q8(&dev, &xd.as_view(), &mut qa, rows * cols).unwrap();
            ops::matmul_q8(&dev, &w, &qa, &mut y.as_view_mut(), rows).unwrap();
            let gpu = ops::download(&dev, &y.as_view()).unwrap();
            let what = format!("matmul_q8 {ty} [{out}, {cols}] x {rows} rows");
            // Integer block sums are exact on the GPU and float on the CPU
            // (both with llama.cpp's f16 min term for Q4_1): the two agree to
            // rounding, far closer than either to f32 activations.
            let err = rel_err(&gpu, &cpu_q8);
            assert!(err < 2e-6, "{what}: {err:e} from the CPU q8 mode");
            if cols >= 64 {
                let gap = rel_err(&gpu, &cpu_f32);
                assert!(
                    gap > 10.0 * err,
                    "{what}: q8 is indistinguishable from f32 ({gap:e})"
                );
            }
        }
    }
}

#[test]
fn rope_matches_at_far_positions() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(6);
    for (heads, head_dim, start, rows) in [
        (1, 2, 0, 1),
        (3, 64, 0, 5),
        (9, 64, 7, 1),
        (2, 128, 8190, 2),
    ] {
        let width = heads * head_dim;
        let x = rng.vec(rows * width, 2.0);
        let mut cpu = x.clone();
        cpu_rope(&mut cpu, width, start, head_dim, 100000.0);
        let mut xd = ops::upload(&dev, &x).unwrap();
        let pos: Vec<u32> = (start as u32..(start + rows) as u32).collect();
        let pd = ops::upload(&dev, &pos).unwrap();
        ops::rope(
            &dev,
            &mut xd.as_view_mut(),
            &pd.as_view(),
            heads,
            head_dim,
            100000.0,
        )
        .unwrap();
        let gpu = ops::download(&dev, &xd.as_view()).unwrap();
        // cos and sin in f64 on both sides; CUDA's are within 1 ulp (f64) of
        // libm's, which survives the rounding to f32 but in rare ties.
        let worst = worst_ulps(&format!("rope {heads}x{head_dim} at {start}"), &gpu, &cpu);
        assert!(
            worst <= 1,
            "rope {heads}x{head_dim} at {start}: {worst} ulp"
        );
    }
}

#[test]
fn attention_matches_prefill_and_decode() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(7);
    // (n_head, n_kv, head_dim, start, rows): a first token, a prefill, a GQA
    // decode deep into the cache, more keys than threads per block, and so
    // many keys that the scores need more than the default shared memory.
    for (n_head, n_kv, head_dim, start, rows) in [
        (1, 1, 2, 0, 1),
        (9, 3, 64, 0, 7),
        (9, 3, 64, 40, 1),
        (4, 2, 32, 300, 3),
        (2, 1, 64, 8000, 2),
    ] {
        let (qw, kvw) = (n_head * head_dim, n_kv * head_dim);
        let keys = start + rows;
        let q = rng.vec(rows * qw, 1.0);
        let k = rng.vec(keys * kvw, 1.0);
        let v = rng.vec(keys * kvw, 1.0);
        let cpu: Vec<f32> = cpu_attention(
            &q,
            rows,
            start,
            &k,
            &v,
            Heads {
                n_head,
                n_head_kv: n_kv,
                head_dim,
            },
        );
        let (qd, kd, vd) = (
            ops::upload(&dev, &q).unwrap(),
            ops::upload(&dev, &k).unwrap(),
            ops::upload(&dev, &v).unwrap(),
        );
        let mut out = dev.stream().alloc_zeros::<f32>(rows * qw).unwrap();
        let shape = AttentionShape {
            rows,
            pos0: start,
            n_head,
            n_kv,
            head_dim,
        };
        ops::attention(
            &dev,
            &qd.as_view(),
            &kd.as_view(),
            &vd.as_view(),
            &mut out.as_view_mut(),
            shape,
        )
        .unwrap();
        let gpu = ops::download(&dev, &out.as_view()).unwrap();
        let what = format!("attention {n_head}/{n_kv}x{head_dim} at {start}+{rows}");
        // Same summation order; only exp may round differently (half an ulp
        // from double on the GPU, libm's expf on the CPU).
        let err = rel_err(&gpu, &cpu);
        assert!(err < 1e-6, "{what}: {err:e}");
    }
}

#[test]
fn swiglu_and_add_match() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(8);
    for n in [1, 255, 256, 257, 1536 * 3] {
        let g = rng.vec(n, 12.0);
        let u = rng.vec(n, 2.0);
        let (gd, ud) = (
            ops::upload(&dev, &g).unwrap(),
            ops::upload(&dev, &u).unwrap(),
        );
        let mut out = dev.stream().alloc_zeros::<f32>(n).unwrap();
        ops::swiglu(
            &dev,
            &gd.as_view(),
            &ud.as_view(),
            &mut out.as_view_mut(),
            n,
        )
        .unwrap();
        let gpu = ops::download(&dev, &out.as_view()).unwrap();
        let worst = worst_ulps(&format!("swiglu {n}"), &gpu, &cpu_swiglu(&g, &u));
        assert!(worst <= 2, "swiglu {n}: {worst} ulp");

        ops::add(
            &dev,
            &gd.as_view(),
            &ud.as_view(),
            &mut out.as_view_mut(),
            n,
        )
        .unwrap();
        let gpu = ops::download(&dev, &out.as_view()).unwrap();
        let cpu: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
        assert_bitwise(&format!("add {n}"), &gpu, &cpu);
    }
}

#[test]
fn launchers_refuse_short_buffers() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(9);
    let t = weight(&mut rng, GgmlType::Q8_0, 4, 64, 1.0);
    let w = DeviceMatrix::upload(&dev, &t).unwrap();
    let x = dev.stream().alloc_zeros::<f32>(64).unwrap();
    let mut y = dev.stream().alloc_zeros::<f32>(4).unwrap();
    let e = ops::matmul_f32(&dev, &w, &x.as_view(), &mut y.as_view_mut(), 2).unwrap_err();
    assert!(e.to_string().contains("the launch needs 128"), "{e}");
}

#[test]
fn fused_launches_equal_their_single_kernels() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(10);
    // Three matrices of mixed types in one launch (q, k, v), then two (gate,
    // up); block counts that do not divide evenly; both row regimes.
    for (types, outs, rows) in [
        (
            vec![GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F32],
            vec![17, 33, 5],
            9,
        ),
        (vec![GgmlType::Q4_1, GgmlType::Q4_1], vec![96, 96], 1),
    ] {
        let cols = 64;
        let ts: Vec<QTensor> = types
            .iter()
            .zip(&outs)
            .map(|(&ty, &o)| weight(&mut rng, ty, o, cols, 0.5))
            .collect();
        let x = rng.vec(rows * cols, 2.0);
        let ws: Vec<DeviceMatrix> = ts
            .iter()
            .map(|t| DeviceMatrix::upload(&dev, t).unwrap())
            .collect();
        let xd = ops::upload(&dev, &x).unwrap();
        let mut ys: Vec<cudarc::driver::CudaSlice<f32>> = outs
            .iter()
            .map(|&o| dev.stream().alloc_zeros::<f32>(rows * o).unwrap())
            .collect();
        {
            let refs: Vec<&DeviceMatrix> = ws.iter().collect();
            let mut views: Vec<_> = ys.iter_mut().map(|y| y.as_view_mut()).collect();
            ops::matmul_f32_many(&dev, &refs, &xd.as_view(), &mut views, rows).unwrap();
        }
        for (t, y) in ts.iter().zip(&ys) {
            let cpu: Vec<f32> = cpu_matmul(&x, rows, &dense(t), Act::Float);
            let gpu = ops::download(&dev, &y.as_view()).unwrap();
            assert_bitwise(&format!("matmul_f32_many {}", t.name), &gpu, &cpu);
        }
    }

    let (n_q, n_k, head_dim, start, rows) = (9, 3, 64, 5, 4);
    let q = rng.vec(rows * n_q * head_dim, 2.0);
    let k = rng.vec(rows * n_k * head_dim, 2.0);
    let (mut cq, mut ck) = (q.clone(), k.clone());
    cpu_rope(&mut cq, n_q * head_dim, start, head_dim, 100000.0);
    cpu_rope(&mut ck, n_k * head_dim, start, head_dim, 100000.0);
    let (mut qd, mut kd) = (
        ops::upload(&dev, &q).unwrap(),
        ops::upload(&dev, &k).unwrap(),
    );
    let pos: Vec<u32> = (start as u32..(start + rows) as u32).collect();
    let pd = ops::upload(&dev, &pos).unwrap();
    ops::rope_qk(
        &dev,
        &mut qd.as_view_mut(),
        &mut kd.as_view_mut(),
        &pd.as_view(),
        n_q,
        n_k,
        head_dim,
        100000.0,
    )
    .unwrap();
    let gq = ops::download(&dev, &qd.as_view()).unwrap();
    let gk = ops::download(&dev, &kd.as_view()).unwrap();
    assert!(worst_ulps("rope_qk q", &gq, &cq) <= 1);
    assert!(worst_ulps("rope_qk k", &gk, &ck) <= 1);
}

#[test]
fn k_quants_dequantize_and_multiply_bitwise_as_the_cpu() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(11);
    for ty in K_QUANTS {
        for cols in [256, 1024] {
            let t = weight(&mut rng, ty, 37, cols, 2.0);
            let tokens = [0u32, 36, 5, 5, 17];
            let cpu: Vec<f32> = embed(&dense(&t), &tokens);
            let tok = ops::upload(&dev, &tokens).unwrap();
            let gpu_rows = |t: &QTensor| {
                let table = DeviceMatrix::upload(&dev, t).unwrap();
                let mut out = dev
                    .stream()
                    .alloc_zeros::<f32>(tokens.len() * cols)
                    .unwrap();
                ops::embedding(&dev, &table, &tok.as_view(), &mut out.as_view_mut()).unwrap();
                ops::download(&dev, &out.as_view()).unwrap()
            };
            assert_bitwise(&format!("embedding {ty} cols {cols}"), &gpu_rows(&t), &cpu);
            // Control: one changed scale byte of row 5 must show.
            let mut planted = t.clone();
            let scales = match ty {
                GgmlType::Q6_K => 192,
                GgmlType::Q3_K => 96,
                GgmlType::Q2_K => 0,
                _ => 4,
            };
            let at = 5 * ty.row_bytes(cols) + scales;
            planted.data[at] ^= 0x01;
            assert!(
                worst_ulps("planted", &gpu_rows(&planted), &cpu) > 0,
                "{ty}: a changed scale went unseen"
            );
        }
        for (out, cols, rows) in [(1, 256, 1), (17, 512, 8), (64, 1024, 9), (640, 2048, 3)] {
            check_matmul_f32(&dev, &mut rng, ty, out, cols, rows);
        }
    }
}

#[test]
fn gemma_ops_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(12);
    // RoPE over halves (q and k in one launch).
    for (n_q, n_k, head_dim, start, rows) in
        [(1, 1, 4, 0, 1), (4, 1, 256, 3, 5), (4, 1, 256, 8190, 2)]
    {
        let (qw, kw) = (n_q * head_dim, n_k * head_dim);
        let q = rng.vec(rows * qw, 2.0);
        let k = rng.vec(rows * kw, 2.0);
        let (mut cq, mut ck) = (q.clone(), k.clone());
        rope_halves(&mut cq, qw, start, head_dim, 1e6);
        rope_halves(&mut ck, kw, start, head_dim, 1e6);
        let (mut qd, mut kd) = (
            ops::upload(&dev, &q).unwrap(),
            ops::upload(&dev, &k).unwrap(),
        );
        let pos: Vec<u32> = (start as u32..(start + rows) as u32).collect();
        let pd = ops::upload(&dev, &pos).unwrap();
        ops::rope_qk_styled(
            &dev,
            RopeStyle::Halves,
            &mut qd.as_view_mut(),
            &mut kd.as_view_mut(),
            &pd.as_view(),
            n_q,
            n_k,
            head_dim,
            1e6,
        )
        .unwrap();
        let (gq, gk) = (
            ops::download(&dev, &qd.as_view()).unwrap(),
            ops::download(&dev, &kd.as_view()).unwrap(),
        );
        let what = format!("rope halves {n_q}+{n_k}x{head_dim} at {start}");
        assert!(worst_ulps(&what, &gq, &cq) <= 1, "{what}: q");
        assert!(worst_ulps(&what, &gk, &ck) <= 1, "{what}: k");
        if start > 0 {
            // Control: the interleaved layout is a different rotation.
            let mut il = q.clone();
            cpu_rope(&mut il, qw, start, head_dim, 1e6);
            assert!(
                worst_ulps("interleaved", &gq, &il) > 1,
                "{what}: layouts agree"
            );
        }
    }
    // Sliding-window attention: windows shorter and longer than the keys.
    for (window, start, rows) in [(2, 0, 3), (4, 10, 3), (512, 600, 2), (512, 3, 4)] {
        let (n_head, n_kv, head_dim) = (4, 1, 256);
        let (qw, kvw) = (n_head * head_dim, n_kv * head_dim);
        let keys = start + rows;
        let q = rng.vec(rows * qw, 1.0);
        let k = rng.vec(keys * kvw, 1.0);
        let v = rng.vec(keys * kvw, 1.0);
        let heads = Heads {
            n_head,
            n_head_kv: n_kv,
            head_dim,
        };
        let cpu: Vec<f32> = attention_windowed(&q, rows, start, &k, &v, heads, Some(window));
        let (qd, kd, vd) = (
            ops::upload(&dev, &q).unwrap(),
            ops::upload(&dev, &k).unwrap(),
            ops::upload(&dev, &v).unwrap(),
        );
        let mut out = dev.stream().alloc_zeros::<f32>(rows * qw).unwrap();
        let shape = AttentionShape {
            rows,
            pos0: start,
            n_head,
            n_kv,
            head_dim,
        };
        ops::attention_windowed(
            &dev,
            &qd.as_view(),
            &kd.as_view(),
            &vd.as_view(),
            &mut out.as_view_mut(),
            shape,
            Some(window),
        )
        .unwrap();
        let gpu = ops::download(&dev, &out.as_view()).unwrap();
        let what = format!("attention window {window} at {start}+{rows}");
        let err = rel_err(&gpu, &cpu);
        assert!(err < 1e-6, "{what}: {err:e}");
        if keys > window {
            // Control: without the window the rows that lost keys differ.
            let full: Vec<f32> = attention_windowed(&q, rows, start, &k, &v, heads, None);
            assert!(
                rel_err(&gpu, &full) > 1e-3,
                "{what}: the window changed nothing"
            );
        }
    }
    // GeGLU.
    for n in [1, 255, 257, 2048 * 3] {
        let g = rng.vec(n, 6.0);
        let u = rng.vec(n, 2.0);
        let (gd, ud) = (
            ops::upload(&dev, &g).unwrap(),
            ops::upload(&dev, &u).unwrap(),
        );
        let mut out = dev.stream().alloc_zeros::<f32>(n).unwrap();
        ops::geglu(
            &dev,
            &gd.as_view(),
            &ud.as_view(),
            &mut out.as_view_mut(),
            n,
        )
        .unwrap();
        let gpu = ops::download(&dev, &out.as_view()).unwrap();
        // tanh rounded from double against libm's tanhf: an ulp apart, which
        // 1 + tanh magnifies where tanh is near -1 (a 3-ulp output was seen
        // on the H200), so the bound is relative to the largest output.
        let cpu = cpu_geglu(&g, &u);
        worst_ulps(&format!("geglu {n}"), &gpu, &cpu);
        let err = rel_err(&gpu, &cpu);
        assert!(err < 1e-6, "geglu {n}: {err:e}");
        // Control: SwiGLU on the same inputs is another function.
        assert!(
            rel_err(&gpu, &cpu_swiglu(&g, &u)) > 1e-3,
            "geglu {n}: equals swiglu"
        );
    }
}

#[test]
fn quantize_q8_k_matches_the_cpu_quantizer() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(12);
    let mut x = rng.vec(5 * 256, 2.0);
    // Block 0: a massive activation; block 1: all zeros (d = 0); block 2: a
    // tie of magnitudes, +5 first then -5 (the first one sets the sign of
    // the scale); block 3: a positive outlier; block 4: plain.
    x[7] = -3664.0;
    x[256..512].fill(0.0);
    x[512 + 3] = 5.0;
    x[512 + 200] = -5.0;
    x[768 + 255] = 900.0;
    let gpu_q8k = |x: &[f32]| {
        let xd = ops::upload(&dev, x).unwrap();
        let mut qa = QuantizedActs::alloc(&dev, x.len()).unwrap();
        q8::quantize_q8_k(&dev, &xd.as_view(), &mut qa, x.len()).unwrap();
        let q = ops::download(&dev, &qa.q.as_view()).unwrap();
        let d = ops::download(&dev, &qa.scales.as_view()).unwrap();
        (q, d[..x.len() / 256].to_vec())
    };
    let cpu_q8k = |x: &[f32]| {
        let blocks = model::quant::quantize_row_q8_k(x).unwrap();
        let q: Vec<i8> = blocks.iter().flat_map(|b| b.qs).collect();
        let d: Vec<f32> = blocks.iter().map(|b| b.d).collect();
        (q, d)
    };
    let (gq, gd) = gpu_q8k(&x);
    let (cq, cd) = cpu_q8k(&x);
    assert_eq!(gq, cq, "Q8_K quants");
    assert_bitwise("Q8_K scales", &gd, &cd);
    assert_eq!(gq[7], -127, "the outlier maps to exactly -127");
    assert_eq!(gd[1], 0.0, "an all-zero block has d = 0");
    assert_eq!(
        (gq[512 + 3], gq[512 + 200]),
        (-127, 127),
        "the first of a tie wins"
    );
    // Control: with the tie the other way round the sign of the scale, and
    // so every other quant of the block, flips: a quantizer that broke ties
    // the other way would fail the comparison above.
    let mut swapped = x.clone();
    swapped.swap(512 + 3, 512 + 200);
    let (sq, _) = cpu_q8k(&swapped);
    assert_ne!(
        sq[512..768],
        gq[512..768],
        "the tie block does not test the rule"
    );
    // A partial block is refused, not read past.
    let xd = ops::upload(&dev, &x[..300]).unwrap();
    let mut qa = QuantizedActs::alloc(&dev, 512).unwrap();
    assert!(q8::quantize_q8_k(&dev, &xd.as_view(), &mut qa, 300).is_err());
}

#[test]
fn matmul_q8_ordered_is_bitwise_the_cpu_q8_mode() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(13);
    let types = [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0];
    for ty in types.into_iter().chain(K_QUANTS) {
        let block = ty.block_size();
        assert_eq!(
            Q8Dot::of(ty).unwrap().block(),
            if ty.block_size() == 256 { 256 } else { 32 }
        );
        for (out, cols, rows) in [(1, 256, 1), (17, 512, 8), (64, 1024, 9), (33, 2048, 3)] {
            let t = weight(&mut rng, ty, out, cols, 0.5);
            let mut x = rng.vec(rows * cols, 3.0);
            // A massive activation in row 0, as Gemma's residual stream has.
            x[5] = -900.0;
            let m = dense(&t);
            let cpu_q8: Vec<f32> = matmul_with_mins(&x, rows, &m, None, Act::Q8);
            let w = DeviceMatrix::upload(&dev, &t).unwrap();
            let gpu_run = |x: &[f32]| {
                let xd = ops::upload(&dev, x).unwrap();
                let mut qa = QuantizedActs::alloc(&dev, rows * cols).unwrap();
                let mut y = dev.stream().alloc_zeros::<f32>(rows * out).unwrap();
                if block == 256 {
                    q8::quantize_q8_k(&dev, &xd.as_view(), &mut qa, rows * cols).unwrap();
                } else {
                    ops::quantize_q8(&dev, &xd.as_view(), &mut qa, rows * cols).unwrap();
                }
                q8::matmul_q8_ordered(&dev, &w, &qa, &mut y.as_view_mut(), rows).unwrap();
                ops::download(&dev, &y.as_view()).unwrap()
            };
            let gpu = gpu_run(&x);
            let what = format!("matmul_q8_ordered {ty} [{out}, {cols}] x {rows} rows");
            assert_bitwise(&what, &gpu, &cpu_q8);
            // Controls: q8 is not f32, and one changed activation shows.
            let cpu_f32: Vec<f32> = cpu_matmul(&x, rows, &m, Act::Float);
            assert!(
                worst_ulps(&what, &gpu, &cpu_f32) > 0,
                "{what}: q8 equals f32"
            );
            let mut planted = x.clone();
            planted[cols - 1] += 50.0;
            assert!(
                worst_ulps(&what, &gpu_run(&planted), &cpu_q8) > 0,
                "{what}: a changed activation went unseen"
            );
        }
    }
    // Q4_1's min term is llama.cpp's f16 sum: the DP4A path's, refused here.
    let t = weight(&mut rng, GgmlType::Q4_1, 4, 64, 0.5);
    let w = DeviceMatrix::upload(&dev, &t).unwrap();
    let qa = QuantizedActs::alloc(&dev, 64).unwrap();
    let mut y = dev.stream().alloc_zeros::<f32>(4).unwrap();
    assert!(q8::matmul_q8_ordered(&dev, &w, &qa, &mut y.as_view_mut(), 1).is_err());
}
