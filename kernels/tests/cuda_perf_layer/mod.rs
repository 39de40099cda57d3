//! `layer_figures`: one decode layer of the CUDA forward at SmolLM2's
//! shapes, each launch alone and the layer unfused and fused, timed inside
//! CUDA graphs (part of the `cuda_perf` binary).

use std::cell::RefCell;

use kernels::cuda::device::{driver_present, Device, EarlyLaunch};
use kernels::cuda::ops::{self, AttentionShape, DeviceMatrix};

use super::{per_call_graph_us, smollm2_shaped};

/// A named launch of [`layer_figures`], timed alone and in its layer.
type Launch<'a> = (&'static str, Box<dyn FnMut() + 'a>);

/// Prints `line`, then each of `launches` timed alone (µs per launch, 100
/// replays in one graph), their sum, and all of them in one graph.
fn print_launches(dev: &Device, mut line: String, launches: &mut [Launch]) {
    let mut total = 0.0;
    for (name, f) in launches.iter_mut() {
        let t = per_call_graph_us(dev, f.as_mut());
        total += t;
        line += &format!(" {name} {t:.1};");
    }
    let whole = per_call_graph_us(dev, &mut || {
        for (_, f) in launches.iter_mut() {
            f();
        }
    });
    println!(
        "{line} sum {total:.1}; the layer's {} launches in one graph {whole:.1} us",
        launches.len()
    );
}

/// One decode layer at SmolLM2-135M's shapes (Q4_1 weights, 9 query heads
/// over 3 KV heads of 64, 228 keys in the cache): each launch alone and the
/// whole layer, unfused (twelve launches) and fused (five), each timed as
/// 100 replays in one CUDA graph: the GPU's own time per launch.
#[test]
fn layer_figures() {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this host");
        return;
    }
    let dev = Device::open(0).unwrap();
    dev.warm_up().unwrap();
    let (d, qw, kvw, ff, hd, nh, nkv) = (576, 576, 192, 1536, 64, 9, 3);
    let q41 = model::GgmlType::Q4_1;
    let m =
        |name: &str, r, c| DeviceMatrix::upload(&dev, &smollm2_shaped(name, q41, r, c)).unwrap();
    let (wq, wk, wv, wo) = (m("q", qw, d), m("k", kvw, d), m("v", kvw, d), m("o", d, qw));
    let (wg, wu, wd) = (m("gate", ff, d), m("up", ff, d), m("down", d, ff));
    let dev = &*dev;
    // Each buffer in a RefCell: the closures below take turns writing them.
    let buf = |n: usize| {
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
            .collect();
        RefCell::new(ops::upload(dev, &v).unwrap())
    };
    let (x, x2, h, norm) = (buf(d), buf(d), buf(d), buf(d));
    let (q, k, v, att, o) = (buf(qw), buf(kvw), buf(kvw), buf(qw), buf(d));
    let (g, u, sg, dn) = (buf(ff), buf(ff), buf(ff), buf(d));
    let cap = 256;
    let (kc, vc) = (buf(cap * kvw), buf(cap * kvw));
    let keys = 228;
    let pos = ops::upload(dev, &[(keys - 1) as u32]).unwrap();
    let shape = AttentionShape {
        rows: 1,
        pos0: keys - 1,
        n_head: nh,
        n_kv: nkv,
        head_dim: hd,
    };
    let line = String::from("one decode layer, graph-replayed (us per launch):");
    let mut unfused: Vec<Launch> = Vec::new();
    unfused.push((
        "rms_norm",
        Box::new(|| {
            ops::rms_norm(
                dev,
                &x.borrow().as_view(),
                &norm.borrow().as_view(),
                &mut h.borrow_mut().as_view_mut(),
                1,
                1e-5,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "qkv",
        Box::new(|| {
            ops::matmul_f32_many(
                dev,
                &[&wq, &wk, &wv],
                &h.borrow().as_view(),
                &mut [
                    q.borrow_mut().as_view_mut(),
                    k.borrow_mut().as_view_mut(),
                    v.borrow_mut().as_view_mut(),
                ],
                1,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "rope_qk",
        Box::new(|| {
            ops::rope_qk(
                dev,
                &mut q.borrow_mut().as_view_mut(),
                &mut k.borrow_mut().as_view_mut(),
                &pos.as_view(),
                nh,
                nkv,
                hd,
                1e5,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "kv_write",
        Box::new(|| {
            ops::kv_write(
                dev,
                &k.borrow().as_view(),
                &v.borrow().as_view(),
                &mut kc.borrow_mut().as_view_mut(),
                &mut vc.borrow_mut().as_view_mut(),
                &pos.as_view(),
                kvw,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "attention",
        Box::new(|| {
            ops::attention_at(
                dev,
                &q.borrow().as_view(),
                &kc.borrow().as_view(),
                &vc.borrow().as_view(),
                &mut att.borrow_mut().as_view_mut(),
                &pos.as_view(),
                shape,
                None,
                cap,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "o_proj",
        Box::new(|| {
            ops::matmul_f32(
                dev,
                &wo,
                &att.borrow().as_view(),
                &mut o.borrow_mut().as_view_mut(),
                1,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "add",
        Box::new(|| {
            ops::add(
                dev,
                &x.borrow().as_view(),
                &o.borrow().as_view(),
                &mut x2.borrow_mut().as_view_mut(),
                d,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "rms_norm",
        Box::new(|| {
            ops::rms_norm(
                dev,
                &x2.borrow().as_view(),
                &norm.borrow().as_view(),
                &mut h.borrow_mut().as_view_mut(),
                1,
                1e-5,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "gate_up",
        Box::new(|| {
            ops::matmul_f32_many(
                dev,
                &[&wg, &wu],
                &h.borrow().as_view(),
                &mut [g.borrow_mut().as_view_mut(), u.borrow_mut().as_view_mut()],
                1,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "swiglu",
        Box::new(|| {
            ops::swiglu(
                dev,
                &g.borrow().as_view(),
                &u.borrow().as_view(),
                &mut sg.borrow_mut().as_view_mut(),
                ff,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "ffn_down",
        Box::new(|| {
            ops::matmul_f32(
                dev,
                &wd,
                &sg.borrow().as_view(),
                &mut dn.borrow_mut().as_view_mut(),
                1,
            )
            .unwrap()
        }),
    ));
    unfused.push((
        "add",
        Box::new(|| {
            ops::add(
                dev,
                &x2.borrow().as_view(),
                &dn.borrow().as_view(),
                &mut h.borrow_mut().as_view_mut(),
                d,
            )
            .unwrap()
        }),
    ));
    print_launches(dev, line, &mut unfused);
    drop(unfused);
    let norm = norm.borrow();
    let nw = norm.as_view();
    // RoPE's table, once a step in the fused forward: timed alone.
    let table = buf(hd);
    let t = per_call_graph_us(dev, &mut || {
        ops::rope_table(
            dev,
            &pos.as_view(),
            &mut table.borrow_mut().as_view_mut(),
            1,
            hd,
            1e5,
        )
        .unwrap()
    });
    let mut line =
        format!("fused, once a step: rope_table {t:.1}; before the table and the split attention:");
    let mut before: Vec<Launch> = Vec::new();
    before.push((
        "qkv_rope computing RoPE",
        Box::new(|| {
            ops::qkv_rope(
                dev,
                [&wq, &wk, &wv],
                &x.borrow().as_view(),
                Some(ops::Norm {
                    weight: &nw,
                    eps: 1e-5,
                }),
                ops::QkvOut {
                    q: &mut q.borrow_mut().as_view_mut(),
                    k_cache: &mut kc.borrow_mut().as_view_mut(),
                    v_cache: &mut vc.borrow_mut().as_view_mut(),
                },
                &pos.as_view(),
                hd,
                1e5,
                1,
            )
            .unwrap()
        }),
    ));
    before.push((
        "attention (a block per head)",
        Box::new(|| {
            ops::attention_at(
                dev,
                &q.borrow().as_view(),
                &kc.borrow().as_view(),
                &vc.borrow().as_view(),
                &mut att.borrow_mut().as_view_mut(),
                &pos.as_view(),
                shape,
                None,
                cap,
            )
            .unwrap()
        }),
    ));
    for (name, f) in before.iter_mut() {
        line += &format!(" {name} {:.1};", per_call_graph_us(dev, f.as_mut()));
    }
    println!("{line}");
    drop(before);
    let mut fused: Vec<Launch> = Vec::new();
    fused.push((
        "qkv_rope",
        Box::new(|| {
            ops::qkv_rope_tabled(
                dev,
                [&wq, &wk, &wv],
                &x.borrow().as_view(),
                Some(ops::Norm {
                    weight: &nw,
                    eps: 1e-5,
                }),
                ops::QkvOut {
                    q: &mut q.borrow_mut().as_view_mut(),
                    k_cache: &mut kc.borrow_mut().as_view_mut(),
                    v_cache: &mut vc.borrow_mut().as_view_mut(),
                },
                &pos.as_view(),
                Some(&table.borrow().as_view()),
                hd,
                1e5,
                1,
            )
            .unwrap()
        }),
    ));
    fused.push((
        "attention",
        Box::new(|| {
            ops::attention_split_at(
                dev,
                &q.borrow().as_view(),
                &kc.borrow().as_view(),
                &vc.borrow().as_view(),
                &mut att.borrow_mut().as_view_mut(),
                &pos.as_view(),
                shape,
                None,
                cap,
                &[&wo, &wg, &wu, &wd],
            )
            .unwrap()
        }),
    ));
    fused.push((
        "o_proj+add",
        Box::new(|| {
            ops::matmul_fused(
                dev,
                &wo,
                &att.borrow().as_view(),
                None,
                Some(&x.borrow().as_view()),
                &mut x2.borrow_mut().as_view_mut(),
                1,
            )
            .unwrap()
        }),
    ));
    fused.push((
        "norm+gate_up+swiglu",
        Box::new(|| {
            ops::gate_up_swiglu(
                dev,
                &wg,
                &wu,
                &x2.borrow().as_view(),
                Some(ops::Norm {
                    weight: &nw,
                    eps: 1e-5,
                }),
                &mut sg.borrow_mut().as_view_mut(),
                1,
            )
            .unwrap()
        }),
    ));
    fused.push((
        "ffn_down+add",
        Box::new(|| {
            ops::matmul_fused(
                dev,
                &wd,
                &sg.borrow().as_view(),
                None,
                Some(&x2.borrow().as_view()),
                &mut dn.borrow_mut().as_view_mut(),
                1,
            )
            .unwrap()
        }),
    ));
    for early in EarlyLaunch::ALL {
        dev.set_early_launch(early);
        print_launches(dev, format!("fused, early launch {early:?}:"), &mut fused);
    }
}

/// The fused decode layer as a forward runs it: 30 layers, each with its
/// own weights (69 MB in all, more than the GPU's L2 holds, so every
/// layer's weights come from memory as in a real decode step, where the
/// figures above replay one layer's weights out of L2), one step's RoPE
/// table first, timed as 20 replays of the 30 layers in one CUDA graph.
#[test]
fn streamed_layer_figures() {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this host");
        return;
    }
    let dev = Device::open(0).unwrap();
    dev.warm_up().unwrap();
    let (d, qw, kvw, ff, hd, nh, nkv, layers) = (576, 576, 192, 1536, 64, 9, 3, 30);
    let q41 = model::GgmlType::Q4_1;
    let m =
        |name: &str, r, c| DeviceMatrix::upload(&dev, &smollm2_shaped(name, q41, r, c)).unwrap();
    let ws: Vec<[DeviceMatrix; 7]> = (0..layers)
        .map(|l| {
            let n = |what: &str| format!("blk.{l}.{what}");
            [
                m(&n("q"), qw, d),
                m(&n("k"), kvw, d),
                m(&n("v"), kvw, d),
                m(&n("o"), d, qw),
                m(&n("gate"), ff, d),
                m(&n("up"), ff, d),
                m(&n("down"), d, ff),
            ]
        })
        .collect();
    let dev = &*dev;
    let buf = |n: usize| {
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
            .collect();
        ops::upload(dev, &v).unwrap()
    };
    let (mut x, mut x2, norm) = (buf(d), buf(d), buf(d));
    let (mut q, mut att, mut sg, mut table) = (buf(qw), buf(qw), buf(ff), buf(hd));
    let cap = 256;
    let (mut kc, mut vc) = (buf(layers * cap * kvw), buf(layers * cap * kvw));
    let keys = 228;
    let pos = ops::upload(dev, &[(keys - 1) as u32]).unwrap();
    let shape = AttentionShape {
        rows: 1,
        pos0: keys - 1,
        n_head: nh,
        n_kv: nkv,
        head_dim: hd,
    };
    let nw = norm.as_view();
    let n = Some(ops::Norm {
        weight: &nw,
        eps: 1e-5,
    });
    let mut step = || {
        ops::rope_table(dev, &pos.as_view(), &mut table.as_view_mut(), 1, hd, 1e5).unwrap();
        for (l, [wq, wk, wv, wo, wg, wu, wd]) in ws.iter().enumerate() {
            let layer = l * cap * kvw..(l + 1) * cap * kvw;
            ops::qkv_rope_tabled(
                dev,
                [wq, wk, wv],
                &x.as_view(),
                n,
                ops::QkvOut {
                    q: &mut q.as_view_mut(),
                    k_cache: &mut kc.slice_mut(layer.clone()),
                    v_cache: &mut vc.slice_mut(layer.clone()),
                },
                &pos.as_view(),
                Some(&table.as_view()),
                hd,
                1e5,
                1,
            )
            .unwrap();
            ops::attention_split_at(
                dev,
                &q.as_view(),
                &kc.slice(layer.clone()),
                &vc.slice(layer),
                &mut att.as_view_mut(),
                &pos.as_view(),
                shape,
                None,
                cap,
                &[wo, wg, wu, wd],
            )
            .unwrap();
            ops::matmul_fused(
                dev,
                wo,
                &att.as_view(),
                None,
                Some(&x.as_view()),
                &mut x2.as_view_mut(),
                1,
            )
            .unwrap();
            ops::gate_up_swiglu(dev, wg, wu, &x2.as_view(), n, &mut sg.as_view_mut(), 1).unwrap();
            ops::matmul_fused(
                dev,
                wd,
                &sg.as_view(),
                None,
                Some(&x2.as_view()),
                &mut x.as_view_mut(),
                1,
            )
            .unwrap();
        }
    };
    // per_call_graph_us replays 100 steps: µs per step, then per layer;
    // each launch after the one before has finished, then launched early.
    // Each mode with the one-row dequantized staging as the mode has it,
    // then forced the other way.
    for early in EarlyLaunch::ALL {
        for deq in [None, Some(!early.stages_weights())] {
            ops::set_dequant_staging(deq);
            dev.set_early_launch(early);
            let per_step = per_call_graph_us(dev, &mut step);
            println!(
                "fused, 30 layers with their own weights (streamed from memory), one graph, early launch {early:?}, dequantized staging {}: {per_step:.1} us a step, {:.1} us a layer",
                deq.unwrap_or(early.stages_weights()),
                per_step / layers as f64
            );
        }
    }
    ops::set_dequant_staging(None);
}
