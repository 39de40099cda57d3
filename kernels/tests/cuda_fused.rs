//! The fused CUDA forward (five launches a layer, `cuda/forward/fused.rs`)
//! against the unfused one, bitwise: prefill over several row passes,
//! decode steps through the CUDA graph across a cache regrowth, weights in
//! 32-element blocks, K-quants and floats, and a tail block of outputs. The
//! controls: a perturbed weight must move the logits (the comparison can
//! fail), and the forms fusion does not cover (armed, q8, Gemma 3, several
//! slots) must not run fused. Skips, saying so, without a GPU.
#![cfg(feature = "cuda")]

mod cuda_kernels_support;
mod cuda_models;

use cuda_kernels_support as ks;
use cuda_models::*;
use kernels::cuda::ops::{self, DeviceMatrix};
use kernels::cuda::{CudaForward, EarlyLaunch};
use kernels::switches::Switches;
use kernels::{Forward, Precision};
use model::{GgmlType, ModelWeights};

#[test]
fn fused_forward_equals_unfused() {
    let long = long_prompt();
    // The fused kernels launched after the one before has finished, then
    // early (programmatic dependent launch, where the GPU has it), the next
    // kernel let in at a kernel's start or once it has computed: each must
    // give the unfused bits.
    each_launch_mode_and_layout(|dev, early, name, w| {
        let (mut plain, mut fused) = (open_fused(dev, w, false), open_fused(dev, w, true));
        fused.set_persistent(true);
        fused.set_mapped_step(true);
        // The other forms of the step: its copies outside the graph, the
        // logits from one block per 16 (or from one block per SM), the
        // layers in five launches each rather than one persistent
        // launch; and the persistent launch on a grid of one block (each
        // block takes every share of every step) or of seven.
        let mut other = open_fused(dev, w, true);
        other.set_graph_copies(false);
        other.set_logits_streaming(ops::Streaming {
            blocks_per_sm: if early == EarlyLaunch::Off { 0 } else { 1 },
            stages: 2,
        });
        other.set_persistent(false);
        // Five launches a layer with the step mapped (its token,
        // position and logits read and written in page-locked memory by
        // its kernels: the default), and with its copies in the graph.
        let mut five = open_fused(dev, w, true);
        five.set_persistent(false);
        five.set_mapped_step(true);
        let mut copies = open_fused(dev, w, true);
        copies.set_persistent(false);
        copies.set_mapped_step(false);
        let mut narrow = open_fused(dev, w, true);
        narrow.set_persistent(true);
        narrow.set_persistent_blocks(if early == EarlyLaunch::Off { 1 } else { 7 });
        for prompt in [&PROMPT[..], &long[..]] {
            plain.reset();
            fused.reset();
            other.reset();
            narrow.reset();
            narrow.forward(None, prompt, 0).unwrap();
            let want = plain.forward(None, prompt, 0).unwrap();
            assert_eq!(
                want,
                fused.forward(None, prompt, 0).unwrap(),
                "{name}: prefill of {} tokens",
                prompt.len()
            );
            assert_eq!(
                want,
                other.forward(None, prompt, 0).unwrap(),
                "{name}: prefill of {} tokens, the other form",
                prompt.len()
            );
        }
        // 70 steps through the graph, past the cache's regrowth at 64.
        let mut last = Vec::new();
        for i in 0..70 {
            let t = [(i / 2 * 13 % 90) as u32];
            let pos = long.len() + i;
            let a = plain.forward(None, &t, pos).unwrap();
            let b = fused.forward(None, &t, pos).unwrap();
            assert_eq!(a, b, "{name}: decode step {i} (position {pos})");
            let c = other.forward(None, &t, pos).unwrap();
            assert_eq!(
                a, c,
                "{name}: decode step {i} (position {pos}), the other form"
            );
            if i == 0 {
                for f in [&mut five, &mut copies] {
                    f.forward(None, &long, 0).unwrap();
                }
            }
            let m = five.forward(None, &t, pos).unwrap();
            assert_eq!(a, m, "{name}: decode step {i} (position {pos}), mapped");
            let m = copies.forward(None, &t, pos).unwrap();
            assert_eq!(
                a, m,
                "{name}: decode step {i} (position {pos}), copies in the graph"
            );
            let n = narrow.forward(None, &t, pos).unwrap();
            assert_eq!(
                a, n,
                "{name}: decode step {i} (position {pos}), persistent on a narrow grid"
            );
            assert_ne!(b, last, "{name}: step {i} repeated the previous step");
            last = b;
        }
        assert_eq!(plain.fused_runs(), 0, "{name}: fusion off ran fused");
        assert_eq!(fused.fused_runs(), 72, "{name}: not every run was fused");
        assert!(fused.graph_replays() >= 69, "{name}: decode not replayed");
        // Captured again at the cache's regrowth: at least two graphs.
        for (f, what) in [(&fused, "default"), (&narrow, "narrow")] {
            assert!(
                f.persistent_runs() >= 2,
                "{name}: the {what} forward's steps did not run persistent"
            );
        }
        assert_eq!(other.persistent_runs(), 0, "{name}: persistent while off");
        assert!(
            five.mapped_replays() >= 69,
            "{name}: the step did not run mapped"
        );
        assert!(
            fused.mapped_replays() >= 69,
            "{name}: the persistent step not mapped"
        );
        assert_eq!(copies.mapped_replays(), 0, "{name}: mapped while off");
        assert_eq!(
            other.mapped_replays(),
            0,
            "{name}: mapped without the copies"
        );
    });
}

#[test]
fn control_a_perturbed_weight_moves_the_fused_logits() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let dev = kernels::cuda::Device::open(0).unwrap();
    let w = tiny_model();
    let mut moved = w.clone();
    // One byte of one block of layer 1's ffn_down: the comparison above
    // would have seen it.
    moved.layers[1].w_down.data[7] ^= 0x11;
    let a = open_fused(&dev, &w, true)
        .forward(None, &PROMPT, 0)
        .unwrap();
    let b = open_fused(&dev, &moved, true)
        .forward(None, &PROMPT, 0)
        .unwrap();
    assert_ne!(a, b, "a changed weight left the fused logits unchanged");
}

#[test]
fn control_a_perturbed_weight_moves_the_persistent_step() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let dev = kernels::cuda::Device::open(0).unwrap();
    let w = tiny_model();
    let mut moved = w.clone();
    // One byte of the last layer's ffn_down, which only the persistent
    // launch computes in a decode step.
    let last = moved.layers.len() - 1;
    moved.layers[last].w_down.data[3] ^= 0x22;
    let step = |w: &ModelWeights| {
        let mut f = open_fused(&dev, w, true);
        f.set_persistent(true);
        f.forward(None, &PROMPT, 0).unwrap();
        let l = f.forward(None, &[7], PROMPT.len()).unwrap();
        assert_eq!(f.persistent_runs(), 1, "the step did not run persistent");
        l
    };
    assert_ne!(
        step(&w),
        step(&moved),
        "a changed weight left the persistent step's logits unchanged"
    );
}

#[test]
fn fusion_stays_off_where_it_does_not_hold() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let dev = kernels::cuda::Device::open(0).unwrap();
    // q8 activations and Gemma 3's layers run unfused.
    let q8 = |w: &ModelWeights| {
        let mut f = CudaForward::new(dev.clone(), w, Precision::Q8, &Switches::none()).unwrap();
        f.forward(None, &PROMPT, 0).unwrap();
        f.fused_runs()
    };
    assert_eq!(q8(&tiny_model()), 0, "q8 ran fused");
    let mut gemma = open_fused(&dev, &tiny_gemma(), true);
    gemma.forward(None, &PROMPT, 0).unwrap();
    assert_eq!(gemma.fused_runs(), 0, "gemma ran fused");
    // Several slots at once run unfused; one slot alone fused.
    let w = tiny_model();
    let mut f = open_fused(&dev, &w, true);
    f.forward(Some(0), &PROMPT, 0).unwrap();
    f.forward(Some(1), &PROMPT[..3], 0).unwrap();
    assert_eq!(f.fused_runs(), 2);
    f.decode_batch(&[4, 5], &[PROMPT.len(), 3]).unwrap();
    assert_eq!(f.fused_runs(), 2, "a batch of two slots ran fused");
    // Armed: the taps need every stage, so the forward runs unfused.
    let dir = tempfile::tempdir().unwrap();
    let cap = capture::Capture::start(capture::CaptureOptions {
        out: dir.path().join("t"),
        selection: capture::Selection::all(),
        force: false,
        stages: kernels::stages::for_config(&w.config),
        run: capture::RunInfo::default(),
    })
    .unwrap();
    let mut armed = open_fused(&dev, &w, true);
    let a = armed.forward(None, &PROMPT, 0).unwrap();
    cap.finish().unwrap();
    assert_eq!(armed.fused_runs(), 0, "an armed forward ran fused");
    let b = open_fused(&dev, &w, true)
        .forward(None, &PROMPT, 0)
        .unwrap();
    assert_eq!(a, b, "armed (unfused) and disarmed (fused) logits differ");
}

/// The logits' streamed matmul against rms_norm then matmul_f32: vocabularies
/// with a tail group (97), whole groups (48), more groups than a small grid
/// (4099) and, sized by the device, six groups per block at one block per
/// SM plus a tail (so every stage's buffer is reused while it holds real
/// rows), one row and nine (two row passes), several weight types.
#[test]
fn streamed_logits_equal_the_plain_launches() {
    let Some(dev) = ks::gpu() else {
        return;
    };
    let dev = &*dev;
    let mut rng = ks::Rng(9);
    let up = |v: &[f32]| ops::upload(dev, v).unwrap();
    let get = |b: &cudarc::driver::CudaSlice<f32>| ops::download(dev, &b.as_view()).unwrap();
    for (ty, cols) in [
        (GgmlType::Q8_0, 576),
        (GgmlType::Q4_1, 64),
        (GgmlType::Q6_K, 256),
        (GgmlType::F16, 72),
    ] {
        for n in [97usize, 48, 4099, 16 * dev.sm_count() * 6 + 3] {
            let w = DeviceMatrix::upload(dev, &ks::weight(&mut rng, ty, n, cols, 0.5)).unwrap();
            for rows in [1usize, 9] {
                let what = format!("{ty} {n}x{cols} rows {rows}");
                let x: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
                let x = up(&x);
                let nw: Vec<f32> = (0..cols).map(|_| 1.0 + 0.2 * rng.f32()).collect();
                let nw = up(&nw);
                let mut h = up(&vec![0.0; rows * cols]);
                let mut want = up(&vec![0.0; rows * n]);
                ops::rms_norm(
                    dev,
                    &x.as_view(),
                    &nw.as_view(),
                    &mut h.as_view_mut(),
                    rows,
                    1e-5,
                )
                .unwrap();
                ops::matmul_f32(dev, &w, &h.as_view(), &mut want.as_view_mut(), rows).unwrap();
                for (blocks_per_sm, stages) in [(1usize, 2usize), (1, 3), (1, 4), (4, 4)] {
                    let how = ops::Streaming {
                        blocks_per_sm,
                        stages,
                    };
                    let mut y = up(&vec![f32::NAN; rows * n]);
                    let norm = Some(ops::Norm {
                        weight: &nw.as_view(),
                        eps: 1e-5,
                    });
                    ops::matmul_streamed(
                        dev,
                        &w,
                        &x.as_view(),
                        norm,
                        &mut y.as_view_mut(),
                        rows,
                        how,
                    )
                    .unwrap();
                    ks::assert_bitwise(&format!("{what}, {how:?}"), &get(&y), &get(&want));
                }
                // Control: another norm weight must move the logits.
                let nw2: Vec<f32> = (0..cols).map(|i| if i == 3 { 2.0 } else { 1.0 }).collect();
                let nw2 = up(&nw2);
                let mut y = up(&vec![0.0; rows * n]);
                let norm = Some(ops::Norm {
                    weight: &nw2.as_view(),
                    eps: 1e-5,
                });
                let how = ops::Streaming {
                    blocks_per_sm: 4,
                    stages: 4,
                };
                ops::matmul_streamed(dev, &w, &x.as_view(), norm, &mut y.as_view_mut(), rows, how)
                    .unwrap();
                assert!(
                    get(&y) != get(&want),
                    "{what}: control: the norm weight changed nothing"
                );
            }
        }
    }
}

/// Each fused launch against the unfused launches it replaces, bitwise:
/// one row and nine (two row passes), weights in 32-blocks, K-quants and
/// f16, an output count with a tail block, positions near the end of a long
/// cache (RoPE's angle in f64). The control: the same comparison between
/// the fused output and the unfused one without its residual must fail.
#[test]
fn fused_launches_equal_the_unfused_ones() {
    let Some(dev) = ks::gpu() else {
        return;
    };
    let dev = &*dev;
    let mut rng = ks::Rng(5);
    let up = |v: &[f32]| ops::upload(dev, v).unwrap();
    let rand = |rng: &mut ks::Rng, n: usize| -> Vec<f32> { (0..n).map(|_| rng.f32()).collect() };
    let get = |b: &cudarc::driver::CudaSlice<f32>| ops::download(dev, &b.as_view()).unwrap();
    // One row goes through the dequantized staging where the width is a
    // multiple of 32 (each type's decoding: Q4_1, Q8_0 and Q4_0 by blocks,
    // Q5_0 by the fallback, K-quants and f16 element by element), and
    // through the weights decoded in the products with it turned off.
    let cases = [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q8_0, 96),
        (GgmlType::Q4_0, 128),
        (GgmlType::Q5_0, 64),
        (GgmlType::Q4_K, 512),
        (GgmlType::F16, 72),
        (GgmlType::F16, 64),
    ];
    for ((ty, cols), deq) in cases.into_iter().flat_map(|c| [(c, true), (c, false)]) {
        ops::set_dequant_staging(Some(deq));
        let (out, ff, hd) = (cols + 16 * 3 + 2, 2 * cols + 6, 16);
        let w = |rng: &mut ks::Rng, r: usize| {
            DeviceMatrix::upload(dev, &ks::weight(rng, ty, r, cols, 0.5)).unwrap()
        };
        let (wo, wg, wu) = (w(&mut rng, out), w(&mut rng, ff), w(&mut rng, ff));
        let (wq, wk, wv) = (
            w(&mut rng, 4 * hd),
            w(&mut rng, 2 * hd),
            w(&mut rng, 2 * hd),
        );
        for rows in [1usize, 9] {
            let what = format!("{ty} cols {cols} rows {rows} dequantized staging {deq}");
            let x = up(&rand(&mut rng, rows * cols));
            let nw = up(&rand(&mut rng, cols)
                .iter()
                .map(|v| 1.0 + 0.2 * v)
                .collect::<Vec<_>>());
            let resid = up(&rand(&mut rng, rows * out));
            let norm = Some(ops::Norm {
                weight: &nw.as_view(),
                eps: 1e-5,
            });
            // norm + matmul + residual add.
            let mut h = up(&vec![0.0; rows * cols]);
            let mut y = up(&vec![0.0; rows * out]);
            let mut a = up(&vec![0.0; rows * out]);
            let mut b = up(&vec![0.0; rows * out]);
            ops::rms_norm(
                dev,
                &x.as_view(),
                &nw.as_view(),
                &mut h.as_view_mut(),
                rows,
                1e-5,
            )
            .unwrap();
            ops::matmul_f32(dev, &wo, &h.as_view(), &mut y.as_view_mut(), rows).unwrap();
            ops::add(
                dev,
                &resid.as_view(),
                &y.as_view(),
                &mut a.as_view_mut(),
                rows * out,
            )
            .unwrap();
            ops::matmul_fused(
                dev,
                &wo,
                &x.as_view(),
                norm,
                Some(&resid.as_view()),
                &mut b.as_view_mut(),
                rows,
            )
            .unwrap();
            ks::assert_bitwise(&format!("{what}: norm + matmul + add"), &get(&b), &get(&a));
            assert!(
                get(&b) != get(&y),
                "{what}: control: the add changed nothing"
            );
            // Without norm and residual: the plain matmul.
            ops::matmul_fused(
                dev,
                &wo,
                &h.as_view(),
                None,
                None,
                &mut b.as_view_mut(),
                rows,
            )
            .unwrap();
            ks::assert_bitwise(&format!("{what}: matmul"), &get(&b), &get(&y));
            // norm + gate/up + SwiGLU.
            let (mut g, mut u) = (up(&vec![0.0; rows * ff]), up(&vec![0.0; rows * ff]));
            let (mut s1, mut s2) = (up(&vec![0.0; rows * ff]), up(&vec![0.0; rows * ff]));
            ops::matmul_f32_many(
                dev,
                &[&wg, &wu],
                &h.as_view(),
                &mut [g.as_view_mut(), u.as_view_mut()],
                rows,
            )
            .unwrap();
            ops::swiglu(
                dev,
                &g.as_view(),
                &u.as_view(),
                &mut s1.as_view_mut(),
                rows * ff,
            )
            .unwrap();
            ops::gate_up_swiglu(
                dev,
                &wg,
                &wu,
                &x.as_view(),
                norm,
                &mut s2.as_view_mut(),
                rows,
            )
            .unwrap();
            ks::assert_bitwise(
                &format!("{what}: norm + gate/up + swiglu"),
                &get(&s2),
                &get(&s1),
            );
            // norm + q/k/v + RoPE + the cache write, near position 8190.
            let cap = 8192;
            let pos: Vec<u32> = (0..rows as u32).map(|r| 8191 - rows as u32 + r).collect();
            let pos = ops::upload(dev, &pos).unwrap();
            let (nq, nk) = (wq.rows, wk.rows);
            let mut q = up(&vec![0.0; rows * nq]);
            let mut k = up(&vec![0.0; rows * nk]);
            let mut v = up(&vec![0.0; rows * nk]);
            let (mut kc1, mut vc1) = (up(&vec![0.0; cap * nk]), up(&vec![0.0; cap * nk]));
            let (mut kc2, mut vc2) = (up(&vec![0.0; cap * nk]), up(&vec![0.0; cap * nk]));
            let mut q2 = up(&vec![0.0; rows * nq]);
            ops::matmul_f32_many(
                dev,
                &[&wq, &wk, &wv],
                &h.as_view(),
                &mut [q.as_view_mut(), k.as_view_mut(), v.as_view_mut()],
                rows,
            )
            .unwrap();
            ops::rope_qk(
                dev,
                &mut q.as_view_mut(),
                &mut k.as_view_mut(),
                &pos.as_view(),
                nq / hd,
                nk / hd,
                hd,
                1e4,
            )
            .unwrap();
            ops::kv_write(
                dev,
                &k.as_view(),
                &v.as_view(),
                &mut kc1.as_view_mut(),
                &mut vc1.as_view_mut(),
                &pos.as_view(),
                nk,
            )
            .unwrap();
            ops::qkv_rope(
                dev,
                [&wq, &wk, &wv],
                &x.as_view(),
                norm,
                ops::QkvOut {
                    q: &mut q2.as_view_mut(),
                    k_cache: &mut kc2.as_view_mut(),
                    v_cache: &mut vc2.as_view_mut(),
                },
                &pos.as_view(),
                hd,
                1e4,
                rows,
            )
            .unwrap();
            ks::assert_bitwise(&format!("{what}: q roped"), &get(&q2), &get(&q));
            ks::assert_bitwise(&format!("{what}: k cache"), &get(&kc2), &get(&kc1));
            ks::assert_bitwise(&format!("{what}: v cache"), &get(&vc2), &get(&vc1));
        }
    }
    ops::set_dequant_staging(None);
}

/// The fused pass's attention (`attention_split_at`: 16 dimensions a block,
/// the values staged in chunks) against `attention_at`, bitwise, at head
/// sizes 16 to 128, key counts around the staging chunk (512 keys at 16
/// dimensions) and past the keys staged before the wait (481 at 64
/// dimensions, 248 at 128), with a window, the key staging on and off;
/// and `qkv_rope_tabled` with `rope_table`'s cosines and sines against
/// `qkv_rope`. Controls: one changed value of
/// the cache must move the split attention's output, and a table for other
/// positions must move the roped q.
#[test]
fn split_attention_and_rope_table_equal_the_plain_launches() {
    let Some(dev) = ks::gpu() else {
        return;
    };
    let dev = &*dev;
    let mut rng = ks::Rng(17);
    let up = |v: &[f32]| ops::upload(dev, v).unwrap();
    let get = |b: &cudarc::driver::CudaSlice<f32>| ops::download(dev, &b.as_view()).unwrap();
    for (hd, n_head, n_kv) in [(64, 9, 3), (16, 4, 2), (128, 4, 1), (32, 2, 2)] {
        let cap = 1100;
        let kvw = n_kv * hd;
        let kc = rng.vec(cap * kvw, 1.0);
        let mut vc = rng.vec(cap * kvw, 1.0);
        let (k, v) = (up(&kc), up(&vc));
        let cases = [
            (1usize, 0usize, None),
            (1, 227, None),
            (1, 511, None),
            (1, 512, None),
            (3, 600, None),
            (1, 1099, Some(700)),
            (2, 300, Some(64)),
            (3, 1, None),
        ];
        for ((rows, pos0, window), keys) in cases
            .into_iter()
            .flat_map(|c| [(c, Some(true)), (c, Some(false))])
        {
            ops::set_key_staging(keys);
            let what = format!(
                "head {hd} x {n_head}/{n_kv}, rows {rows} at {pos0}, window {window:?}, key staging {keys:?}"
            );
            let q = up(&rng.vec(rows * n_head * hd, 1.0));
            let pos = up_u32(dev, pos0);
            let shape = ops::AttentionShape {
                rows,
                pos0,
                n_head,
                n_kv,
                head_dim: hd,
            };
            let mut a = up(&vec![0.0; rows * n_head * hd]);
            let mut b = up(&vec![0.0; rows * n_head * hd]);
            let (qv, kv, vv) = (q.as_view(), k.as_view(), v.as_view());
            ops::attention_at(
                dev,
                &qv,
                &kv,
                &vv,
                &mut a.as_view_mut(),
                &pos.as_view(),
                shape,
                window,
                cap,
            )
            .unwrap();
            ops::attention_split_at(
                dev,
                &qv,
                &kv,
                &vv,
                &mut b.as_view_mut(),
                &pos.as_view(),
                shape,
                window,
                cap,
                &[],
            )
            .unwrap();
            ks::assert_bitwise(&format!("{what}: split attention"), &get(&b), &get(&a));
        }
        ops::set_key_staging(None);
        // Control: the last visible key's value of KV head 0, dimension 5.
        let (rows, pos0) = (1, 600);
        vc[pos0 * kvw + 5] += 0.5;
        let moved = up(&vc);
        let q = up(&rng.vec(rows * n_head * hd, 1.0));
        let pos = up_u32(dev, pos0);
        let shape = ops::AttentionShape {
            rows,
            pos0,
            n_head,
            n_kv,
            head_dim: hd,
        };
        let mut a = up(&vec![0.0; n_head * hd]);
        let mut b = up(&vec![0.0; n_head * hd]);
        let (qv, kv) = (q.as_view(), k.as_view());
        ops::attention_split_at(
            dev,
            &qv,
            &kv,
            &v.as_view(),
            &mut a.as_view_mut(),
            &pos.as_view(),
            shape,
            None,
            cap,
            &[],
        )
        .unwrap();
        ops::attention_split_at(
            dev,
            &qv,
            &kv,
            &moved.as_view(),
            &mut b.as_view_mut(),
            &pos.as_view(),
            shape,
            None,
            cap,
            &[],
        )
        .unwrap();
        assert_ne!(
            get(&a)[5],
            get(&b)[5],
            "head {hd}: control: a changed value left the output"
        );
        vc[pos0 * kvw + 5] -= 0.5;
    }

    // RoPE from the table against RoPE computed in the launch.
    let (cols, hd, rows, cap) = (96, 16, 3, 8192);
    let w = |rng: &mut ks::Rng, r: usize| {
        DeviceMatrix::upload(dev, &ks::weight(rng, GgmlType::Q4_1, r, cols, 0.5)).unwrap()
    };
    let (wq, wk, wv) = (
        w(&mut rng, 4 * hd),
        w(&mut rng, 2 * hd),
        w(&mut rng, 2 * hd),
    );
    let x = up(&rng.vec(rows * cols, 1.0));
    let at: Vec<u32> = vec![0, 4097, 8191];
    let pos = ops::upload(dev, &at).unwrap();
    let other = ops::upload(dev, &[1u32, 4098, 8190]).unwrap();
    let run = |table: Option<&cudarc::driver::CudaSlice<f32>>| {
        let mut q = up(&vec![0.0; rows * wq.rows]);
        let (mut kc, mut vc) = (up(&vec![0.0; cap * wk.rows]), up(&vec![0.0; cap * wk.rows]));
        let tv = table.map(|t| t.as_view());
        ops::qkv_rope_tabled(
            dev,
            [&wq, &wk, &wv],
            &x.as_view(),
            None,
            ops::QkvOut {
                q: &mut q.as_view_mut(),
                k_cache: &mut kc.as_view_mut(),
                v_cache: &mut vc.as_view_mut(),
            },
            &pos.as_view(),
            tv.as_ref(),
            hd,
            1e4,
            rows,
        )
        .unwrap();
        (get(&q), get(&kc))
    };
    let table_at = |p: &cudarc::driver::CudaSlice<u32>| {
        let mut t = up(&vec![0.0; rows * hd]);
        ops::rope_table(dev, &p.as_view(), &mut t.as_view_mut(), rows, hd, 1e4).unwrap();
        t
    };
    let plain = run(None);
    let tabled = run(Some(&table_at(&pos)));
    ks::assert_bitwise("rope table: q", &tabled.0, &plain.0);
    ks::assert_bitwise("rope table: k cache", &tabled.1, &plain.1);
    let wrong = run(Some(&table_at(&other)));
    assert_ne!(
        wrong.0, plain.0,
        "control: a table for other positions left q unchanged"
    );
}

fn up_u32(dev: &kernels::cuda::Device, pos0: usize) -> cudarc::driver::CudaSlice<u32> {
    ops::upload(dev, &[pos0 as u32]).unwrap()
}
