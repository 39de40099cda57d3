//! Differential tests of the q8 precision's kernels against the CPU's q8
//! mode: the Q8_0 and Q8_K quantizers bitwise, the DP4A matmul within
//! rounding, the ordered matmul bitwise. Each test skips, saying so, where
//! there is no GPU.
#![cfg(feature = "cuda")]

mod cuda_kernels_support;

use cuda_kernels_support::*;

use kernels::cpu::matmul::{matmul as cpu_matmul, matmul_with_mins, Act};
use kernels::cpu::quant_row::quantize_row;
use kernels::cuda::ops::{self, DeviceMatrix, QuantizedActs};
use kernels::cuda::q8::{self, Q8Dot};
use model::GgmlType;

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
