//! Differential tests of the K-quant weights (dequantized and multiplied
//! bitwise as the CPU) and Gemma 3's ops (q/k norms, post norms, GeGLU,
//! RoPE over halves, sliding windows, the embedding scale) against the CPU.
//! Each test skips, saying so, where there is no GPU.
#![cfg(feature = "cuda")]

mod cuda_kernels_support;

use cuda_kernels_support::*;

use kernels::cpu::attention::{attention_windowed, Heads};
use kernels::cpu::embedding::embed;
use kernels::cpu::ffn::{geglu as cpu_geglu, swiglu as cpu_swiglu};
use kernels::cpu::rope::{rope as cpu_rope, rope_halves};
use kernels::cuda::ops::{self, AttentionShape, DeviceMatrix};
use model::RopeStyle;
use model::{GgmlType, QTensor};

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
