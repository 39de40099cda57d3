//! Differential tests: each f32 CUDA kernel against its CPU op (the q8
//! kernels: `cuda_kernels_q8.rs`; the K-quants and Gemma 3's ops:
//! `cuda_kernels_gemma.rs`), on deterministic
//! inputs at boundary sizes (block size - 1, block size, block size + 1, the
//! matmul's 8-lane and 8-row passes, the real model's widths).
//!
//! The f32 kernels are written to sum in the CPU op's order without fused
//! multiply-adds, so most comparisons demand bitwise equality; where exp or
//! an integer dot product makes the two differ, the bound is stated in ulps
//! or relative error. Each test skips, saying so, where there is no GPU.
#![cfg(feature = "cuda")]

mod cuda_kernels_support;

use cuda_kernels_support::*;

use kernels::cpu::attention::{attention as cpu_attention, Heads};
use kernels::cpu::embedding::embed;
use kernels::cpu::ffn::swiglu as cpu_swiglu;
use kernels::cpu::matmul::{matmul as cpu_matmul, Act};
use kernels::cpu::norm::rms_norm as cpu_rms_norm;
use kernels::cpu::rope::rope as cpu_rope;
use kernels::cuda::ops::{self, AttentionShape, DeviceMatrix};
use model::{GgmlType, QTensor};

/// Every kernel family compiles with NVRTC as a device compiles it, for
/// sm_90 (the H100/H200 of the GPU runs), with no GPU needed: where the
/// NVRTC library is found (`scripts/test.sh` points at the one PyPI's
/// CUDA packages bring), a `.cu` change that does not compile fails here,
/// before a device session. The control: a source that cannot compile
/// must fail, naming its file. `TAPTREE_REQUIRE_NVRTC=1` fails rather than
/// skips without the library.
#[test]
fn every_kernel_family_compiles_with_nvrtc() {
    use kernels::cuda::device::{compile_all, compile_source, nvrtc_available, Family};
    if !nvrtc_available() {
        assert!(
            std::env::var_os("TAPTREE_REQUIRE_NVRTC").is_none_or(|v| v != "1"),
            "TAPTREE_REQUIRE_NVRTC=1, but no NVRTC library loads here"
        );
        eprintln!("skipped: no NVRTC library on this host");
        return;
    }
    let compiled = compile_all("compute_90").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.len(), Family::ALL.len());
    for (family, ptx_bytes) in compiled {
        assert!(ptx_bytes > 0, "{}: empty PTX", family.file());
    }
    let broken = "extern \"C\" __global__ void k(float* y) { y[0] = not_declared; }";
    let err = compile_source(broken, "broken.cu", "compute_90").unwrap_err();
    assert!(err.to_string().contains("broken.cu"), "{err}");
}

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
