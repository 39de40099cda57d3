//! The GPU figures of docs/PERFORMANCE.md, measured by one binary on the real
//! model: prefill and decode tokens/s with taps disarmed, single and batched;
//! the cost of a full armed capture; the GPU→host tap copy throughput against
//! a plain device-to-host copy into pinned and into pageable memory.
//!
//! Needs a GPU and `TAPTREE_MODEL` (a GGUF path); skips, saying so, without
//! either. Run: `TAPTREE_MODEL=... cargo test --release --features cuda -p
//! kernels --test cuda_perf -- --nocapture`.
#![cfg(feature = "cuda")]

use std::time::{Duration, Instant};

use kernels::cuda::device::{driver_present, Device};
use kernels::cuda::ops::{self, AttentionShape, DeviceMatrix, QuantizedActs};
use kernels::cuda::{CudaForward, EarlyLaunch};
use kernels::switches::Switches;
use kernels::{Forward, Precision};

use cuda_perf_timeline::persistent_timeline;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Device-to-host copy bandwidth in GB/s into pinned and pageable memory:
/// the ceiling the tap throughput is read against.
fn copy_bandwidth(dev: &Device, bytes: usize) -> (f64, f64) {
    let s = dev.stream();
    let n = bytes / 4;
    let src = s.alloc_zeros::<f32>(n).unwrap();
    // SAFETY: the buffer is written by the copy before it is read.
    let mut pinned = unsafe { dev.context().alloc_pinned_with_flags::<f32>(n, 0) }.unwrap();
    let mut pageable = vec![0f32; n];
    let time = |f: &mut dyn FnMut()| {
        f();
        s.synchronize().unwrap();
        let mut t = Vec::new();
        for _ in 0..7 {
            let t0 = Instant::now();
            f();
            s.synchronize().unwrap();
            t.push(bytes as f64 / secs(t0.elapsed()) / 1e9);
        }
        median(t)
    };
    let p = time(&mut || s.memcpy_dtoh(&src, &mut pinned).unwrap());
    let q = time(&mut || s.memcpy_dtoh(&src, &mut pageable).unwrap());
    (p, q)
}

/// Mean time of one call of `f` in microseconds, over 100 calls queued
/// back to back (what the forward does), after 3 warm-up calls.
fn per_call_us(dev: &Device, f: &mut dyn FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    dev.stream().synchronize().unwrap();
    let t0 = Instant::now();
    for _ in 0..100 {
        f();
    }
    dev.stream().synchronize().unwrap();
    secs(t0.elapsed()) * 1e4
}

/// Mean time of one call of `f` in microseconds when 100 calls are replayed
/// as one CUDA graph (no launch overhead on the host: the kernels' own time
/// plus the graph's gap between nodes), the median of 5 replays.
fn per_call_graph_us(dev: &Device, f: &mut dyn FnMut()) -> f64 {
    f();
    let s = dev.stream();
    s.synchronize().unwrap();
    let mode = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    s.begin_capture(mode).unwrap();
    for _ in 0..100 {
        f();
    }
    let g = s
        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    g.launch().unwrap();
    s.synchronize().unwrap();
    let mut t = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        g.launch().unwrap();
        s.synchronize().unwrap();
        t.push(secs(t0.elapsed()) * 1e4);
    }
    median(t)
}

/// Each kernel at the real model's shapes, decode (1 row) and prefill (128
/// rows): where a forward's time goes.
/// SmolLM2-135M's shapes and formats, with seeded values: the kernels'
/// times do not depend on the numbers.
fn smollm2_shaped(name: &str, ty: model::GgmlType, rows: usize, cols: usize) -> model::QTensor {
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
        .collect();
    let data = match ty {
        model::GgmlType::Q4_1 => model::quant::quantize_q4_1(&x).unwrap(),
        _ => model::quant::quantize_q8_0(&x).unwrap(),
    };
    model::QTensor {
        name: name.into(),
        ggml_type: ty,
        shape: vec![rows, cols],
        data: data.into(),
    }
}

#[test]
fn kernel_figures() {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this host");
        return;
    }
    let dev = Device::open(0).unwrap();
    dev.warm_up().unwrap();
    println!("device: {}", dev.describe());
    let (d, qw, kvw, ff, vocab) = (576, 576, 192, 1536, 49152);
    let (n_head, n_kv, head_dim, rope_base) = (9, 3, 64, 100000.0);
    let q41 = model::GgmlType::Q4_1;
    let embd = smollm2_shaped("token_embd", model::GgmlType::Q8_0, vocab, d);
    let mats = [
        (
            "q_proj",
            DeviceMatrix::upload(&dev, &smollm2_shaped("q", q41, qw, d)).unwrap(),
        ),
        (
            "ffn_gate",
            DeviceMatrix::upload(&dev, &smollm2_shaped("gate", q41, ff, d)).unwrap(),
        ),
        (
            "ffn_down",
            DeviceMatrix::upload(&dev, &smollm2_shaped("down", q41, d, ff)).unwrap(),
        ),
        ("logits", DeviceMatrix::upload(&dev, &embd).unwrap()),
    ];
    let dev = &*dev;
    let s = dev.stream();
    let big = 128 * vocab;
    let x = s.alloc_zeros::<f32>(big).unwrap();
    let mut y = s.alloc_zeros::<f32>(big).unwrap();
    let mut qa = QuantizedActs::alloc(dev, 128 * ff).unwrap();
    let kv = s.alloc_zeros::<f32>(256 * kvw).unwrap();
    let norm = s.alloc_zeros::<f32>(d).unwrap();
    let pos = ops::upload(dev, &(0..128u32).collect::<Vec<_>>()).unwrap();
    let toks = ops::upload(dev, &(0..128u32).collect::<Vec<_>>()).unwrap();
    let emb = &mats[3].1;
    for rows in [1usize, 128] {
        let mut line = format!("kernels, {rows:>3} rows (us/call):");
        for (name, m) in &mats {
            let t = per_call_us(dev, &mut || {
                ops::matmul_f32(
                    dev,
                    m,
                    &x.slice(..rows * m.cols),
                    &mut y.slice_mut(..rows * m.rows),
                    rows,
                )
                .unwrap()
            });
            let q = per_call_us(dev, &mut || {
                ops::quantize_q8(dev, &x.slice(..rows * m.cols), &mut qa, rows * m.cols).unwrap();
                ops::matmul_q8(dev, m, &qa, &mut y.slice_mut(..rows * m.rows), rows).unwrap()
            });
            line += &format!(" {name} {}x{} f32 {t:.1} q8 {q:.1};", m.rows, m.cols);
        }
        let t = per_call_us(dev, &mut || {
            ops::rms_norm(
                dev,
                &x.slice(..rows * d),
                &norm.as_view(),
                &mut y.slice_mut(..rows * d),
                rows,
                1e-5,
            )
            .unwrap()
        });
        line += &format!(" rms_norm {t:.1};");
        let t = per_call_us(dev, &mut || {
            ops::rope(
                dev,
                &mut y.slice_mut(..rows * qw),
                &pos.slice(..rows),
                n_head,
                head_dim,
                rope_base,
            )
            .unwrap()
        });
        line += &format!(" rope(q) {t:.1};");
        let pos0 = 128 - rows + 100;
        let shape = AttentionShape {
            rows,
            pos0: pos0.min(256 - rows),
            n_head,
            n_kv,
            head_dim,
        };
        let keys = shape.pos0 + rows;
        let t = per_call_us(dev, &mut || {
            ops::attention(
                dev,
                &x.slice(..rows * qw),
                &kv.slice(..keys * kvw),
                &kv.slice(..keys * kvw),
                &mut y.slice_mut(..rows * qw),
                shape,
            )
            .unwrap()
        });
        line += &format!(" attention({keys} keys) {t:.1};");
        let t = per_call_us(dev, &mut || {
            ops::swiglu(
                dev,
                &x.slice(..rows * ff),
                &x.slice(..rows * ff),
                &mut y.slice_mut(..rows * ff),
                rows * ff,
            )
            .unwrap()
        });
        line += &format!(" swiglu {t:.1};");
        let t = per_call_us(dev, &mut || {
            ops::add(
                dev,
                &x.slice(..rows * d),
                &x.slice(..rows * d),
                &mut y.slice_mut(..rows * d),
                rows * d,
            )
            .unwrap()
        });
        line += &format!(" add {t:.1};");
        let t = per_call_us(dev, &mut || {
            ops::embedding(dev, emb, &toks.slice(..rows), &mut y.slice_mut(..rows * d)).unwrap()
        });
        line += &format!(" embedding {t:.1}");
        println!("{line}");
    }
    // The logits with their norm at one row, as the fused pass runs them:
    // one block per 16 logits against the streamed grid (100 replays of one
    // graph: the 28 MB matrix may sit in L2, unlike in a real step).
    let nv = norm.as_view();
    let n = || {
        Some(ops::Norm {
            weight: &nv,
            eps: 1e-5,
        })
    };
    let mut line =
        "logits 49152x576 Q8_0 with the output norm, 1 row, graphed (us/call):".to_string();
    for (blocks_per_sm, stages) in [(0, 2), (4, 2), (2, 4), (4, 3), (4, 4), (8, 2), (8, 3)] {
        let how = ops::Streaming {
            blocks_per_sm,
            stages,
        };
        let t = per_call_graph_us(dev, &mut || {
            ops::matmul_streamed(
                dev,
                emb,
                &x.slice(..d),
                n(),
                &mut y.slice_mut(..vocab),
                1,
                how,
            )
            .unwrap()
        });
        line += &format!(" {blocks_per_sm}x{stages} {t:.1};");
    }
    println!("{line} (blocks/SM x stages; 0: one block per 16 logits)");
    let t = per_call_us(dev, &mut || {
        ops::upload(dev, &[1u32]).unwrap();
    });
    println!("one 4-byte upload (allocates): {t:.1} us");
}

#[test]
fn gpu_figures() {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this host");
        return;
    }
    let Some(path) = std::env::var_os("TAPTREE_MODEL") else {
        eprintln!("skipped: TAPTREE_MODEL (a GGUF path) is not set");
        return;
    };
    let model = model::load::load_model(&path).expect("load TAPTREE_MODEL");
    let w = &model.weights;
    let vocab = w.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..128u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let dev = Device::open(0).unwrap();
    println!("device: {}", dev.describe());
    let mut fwd = CudaForward::new(dev.clone(), w, Precision::F32, &Switches::none()).unwrap();

    // Prefill, disarmed: the whole prompt in one forward.
    let mut prefill = Vec::new();
    for i in 0..6 {
        fwd.reset();
        let t0 = Instant::now();
        fwd.forward(None, &prompt, 0).unwrap();
        if i > 0 {
            prefill.push(prompt.len() as f64 / secs(t0.elapsed()));
        }
    }
    println!(
        "prefill {} tokens, disarmed: {:.0} tokens/s (median of 5)",
        prompt.len(),
        median(prefill)
    );

    // Decode, disarmed: one token at a time after a 128-token prefill,
    // launch by launch and as a CUDA graph per step, unfused and fused, the
    // fused kernels launched after the one before has finished and early.
    // Every configuration's logits, step by step, must be the first one's
    // bits (checked on the first round, by a hash of each step's logits).
    let steps = 64;
    let mut reference: Option<Vec<blake3::Hash>> = None;
    let (off, start, late) = (EarlyLaunch::Off, EarlyLaunch::AtStart, EarlyLaunch::Late);
    let after_wait = EarlyLaunch::AfterWait;
    // (graphs, fused, early launch, the step's copies outside its graph, in
    // it, or replaced by the mapped step's reads and writes of page-locked
    // memory (the default where the step is fused), the
    // logits' blocks per SM (0: one block per 16 logits) and stages, the
    // layers in one persistent launch: None for five launches a layer, else
    // the most blocks of its grid, 0 for as many as fit).
    // The next field forces the one-row fused matmuls' dequantized staging
    // on or off (None: as the mode has it, on for `start`, `after-wait`
    // and `staged`), the last split attention's key staging (None: on
    // wherever the launches are early).
    let five = None;
    let staged = EarlyLaunch::Staged;
    const OUTSIDE: u8 = 0;
    const COPIES: u8 = 1;
    const MAPPED: u8 = 2;
    #[rustfmt::skip]
    let configs = [
        (false, false, off, COPIES, (4, 4), five, None, None),
        (true, false, off, COPIES, (4, 4), five, None, None),
        (false, true, off, COPIES, (4, 4), five, None, None),
        (true, true, off, COPIES, (4, 4), five, None, None),
        (false, true, late, COPIES, (4, 4), five, None, None),
        (false, true, staged, COPIES, (4, 4), five, None, None),
        (true, true, late, COPIES, (4, 2), five, None, None),
        (true, true, late, COPIES, (4, 2), five, Some(true), None),
        (true, true, start, COPIES, (4, 2), five, None, None),
        (true, true, start, COPIES, (4, 2), five, Some(false), None),
        (true, true, after_wait, COPIES, (4, 2), five, None, None),
        (true, true, staged, COPIES, (4, 2), five, Some(false), None),
        (true, true, staged, OUTSIDE, (0, 2), five, None, None),
        (true, true, staged, MAPPED, (8, 3), five, None, None),
        (true, true, staged, COPIES, (4, 2), five, None, None),
        (true, true, staged, MAPPED, (4, 2), five, None, None),
        (true, true, staged, MAPPED, (4, 2), five, None, Some(false)),
        (true, true, staged, COPIES, (4, 2), five, None, Some(true)),
        (false, true, staged, COPIES, (4, 2), Some(0), None, None),
        (true, true, staged, COPIES, (4, 2), Some(0), None, None),
        (true, true, staged, COPIES, (4, 2), Some(66), None, None),
    ];
    for (graphs, fused, early, io, (blocks_per_sm, stages), persist, deq, keys) in configs {
        let copies = io != OUTSIDE;
        ops::set_dequant_staging(deq);
        ops::set_key_staging(keys);
        fwd.set_persistent(persist.is_some());
        fwd.set_persistent_blocks(persist.unwrap_or(0));
        fwd.set_graphs(graphs);
        fwd.set_fused(fused);
        fwd.set_early_launch(early);
        fwd.set_graph_copies(copies);
        fwd.set_mapped_step(io == MAPPED);
        fwd.set_logits_streaming(ops::Streaming {
            blocks_per_sm,
            stages,
        });
        let mut decode = Vec::new();
        let mut gpu_only = Vec::new();
        let persisted = fwd.persistent_runs();
        for round in 0..5 {
            fwd.reset();
            fwd.forward(None, &prompt, 0).unwrap();
            let mut hashes = Vec::new();
            let t0 = Instant::now();
            for s in 0..steps {
                let l = fwd
                    .forward(None, &[(s * 31 % vocab as usize) as u32], prompt.len() + s)
                    .unwrap();
                if round == 0 {
                    let bytes: Vec<u8> = l.iter().flat_map(|v| v.to_le_bytes()).collect();
                    hashes.push(blake3::hash(&bytes));
                }
            }
            decode.push(steps as f64 / secs(t0.elapsed()));
            if graphs && round > 0 {
                // The same step's graph replayed back to back: the GPU's
                // own share of a step.
                let t0 = Instant::now();
                fwd.replay_last_step(steps).unwrap();
                gpu_only.push(secs(t0.elapsed()) / steps as f64 * 1e6);
            }
            if round == 0 {
                match &reference {
                    None => reference = Some(hashes),
                    Some(r) => assert!(
                        *r == hashes,
                        "graphs {graphs} fused {fused} early {early:?} persistent {persist:?}: decode logits differ from launch by launch, unfused"
                    ),
                }
            }
        }
        let tokens_per_s = median(decode);
        assert_eq!(
            fwd.persistent_runs() > persisted,
            fused && persist.is_some(),
            "persistent {persist:?}: the persistent step ran, or did not, against the setting"
        );
        println!(
            "decode at 128..192, disarmed, m=1, {}, {}{}{}{}{}{}: {:.0} tokens/s (median of 5; 64 steps' logits bitwise the unfused launch-by-launch ones)",
            if graphs {
                "CUDA graph"
            } else {
                "launch by launch"
            },
            if fused { "fused" } else { "unfused" },
            match early {
                EarlyLaunch::Off => "",
                EarlyLaunch::AtStart => ", early launch at start",
                EarlyLaunch::AfterWait => ", early launch after the wait",
                EarlyLaunch::Late => ", early launch late",
                EarlyLaunch::Staged => ", early launch staged",
            },
            match (graphs && copies, fused) {
                (true, true) => format!(
                    ", {} the graph, logits {blocks_per_sm} blocks/SM x {stages} stages",
                    if io == MAPPED {
                        "inputs and logits mapped, no copies in"
                    } else {
                        "copies in"
                    }
                ),
                (false, true) => format!(", logits {blocks_per_sm} blocks/SM x {stages} stages"),
                (true, false) => ", copies in the graph".to_string(),
                (false, false) => String::new(),
            },
            match (fused, persist) {
                (true, Some(0)) => ", layers persistent".to_string(),
                (true, Some(n)) => format!(", layers persistent on at most {n} blocks"),
                _ => String::new(),
            },
            match (fused && persist.is_none(), deq) {
                (true, Some(true)) => ", dequantized staging forced on",
                (true, Some(false)) => ", dequantized staging forced off",
                _ => "",
            },
            match (fused && persist.is_none(), keys) {
                (true, Some(true)) => ", key staging forced on",
                (true, Some(false)) => ", key staging forced off",
                _ => "",
            },
            tokens_per_s
        );
        if graphs {
            let step_us = 1e6 / tokens_per_s;
            let gpu_us = median(gpu_only);
            println!(
                "    a step {step_us:.1} us; its graph replayed back to back {gpu_us:.1} us a step (median of 4 rounds); the host's share between steps {:.1} us",
                step_us - gpu_us
            );
        }
    }

    ops::set_dequant_staging(None);
    ops::set_key_staging(None);
    persistent_timeline(&mut fwd, &prompt, vocab);
    // The defaults again, for the figures below.
    fwd.set_early_launch(EarlyLaunch::DEFAULT);
    fwd.set_logits_streaming(ops::Streaming {
        blocks_per_sm: 4,
        stages: 2,
    });

    // The host's own share of a step: the returned logits copied out of the
    // page-locked buffer into a new Vec (as each step does), alone.
    // SAFETY: page-locked memory, written below before it is read.
    let mut pinned = unsafe {
        dev.context()
            .alloc_pinned_with_flags::<f32>(vocab as usize, 0)
            .unwrap()
    };
    pinned.as_mut_slice().unwrap().fill(1.0);
    let src = pinned.as_slice().unwrap();
    let mut copies = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..steps {
            std::hint::black_box(src.to_vec());
        }
        copies.push(secs(t0.elapsed()) * 1e6 / steps as f64);
    }
    println!(
        "a step's logits from page-locked memory into a new Vec, host alone: {:.1} us (median of 5 rounds of {steps})",
        median(copies)
    );

    // Greedy decode of one sequence, disarmed, at the defaults: stepped
    // from the host (each step's logits read back, the greedy token picked
    // there and written for the next step's graph) against chained on the
    // device (forward/chain.rs: each step's graph picks its token and the
    // host queues the steps back to back). The same 64 tokens, every round.
    // One untimed step first captures the step's graph (and grows the
    // cache past the timed positions).
    fwd.set_graphs(true);
    fwd.set_fused(true);
    fwd.set_graph_copies(true);
    fwd.set_mapped_step(true);
    fwd.set_persistent(false);
    let mut rates = [Vec::new(), Vec::new()];
    let mut picked: Option<Vec<u32>> = None;
    for _ in 0..5 {
        for (k, chained) in [false, true].into_iter().enumerate() {
            fwd.set_chained(chained);
            fwd.reset();
            let l = fwd.forward(None, &prompt, 0).unwrap();
            let first = kernels::generate::argmax(&l);
            let p = prompt.len();
            let (mut tokens, t0) = if chained {
                let warm = fwd.greedy_steps(first, p, 1, &[]).unwrap().unwrap();
                let t0 = Instant::now();
                let rest = fwd
                    .greedy_steps(warm[0], p + 1, steps, &[])
                    .unwrap()
                    .unwrap();
                (rest, t0)
            } else {
                let l = fwd.forward(None, &[first], p).unwrap();
                let mut next = kernels::generate::argmax(&l);
                let t0 = Instant::now();
                let mut t = Vec::with_capacity(steps);
                for s in 0..steps {
                    let l = fwd.forward(None, &[next], p + 1 + s).unwrap();
                    next = kernels::generate::argmax(&l);
                    t.push(next);
                }
                (t, t0)
            };
            rates[k].push(steps as f64 / secs(t0.elapsed()));
            tokens.insert(0, first);
            match &picked {
                None => picked = Some(tokens),
                Some(want) => assert_eq!(
                    *want, tokens,
                    "greedy tokens, chained {chained}: not the first round's"
                ),
            }
        }
    }
    assert!(fwd.chained_steps() > 0, "no step ran chained");
    fwd.set_chained(true);
    for (chained, r) in [false, true].into_iter().zip(rates) {
        let rate = median(r);
        println!(
            "greedy decode at 129..193, disarmed, m=1, graph, fused, mapped, {}: {rate:.0} tokens/s, {:.1} us a step (median of 5; the same 64 tokens)",
            if chained {
                "chained on the device"
            } else {
                "stepped from the host"
            },
            1e6 / rate
        );
    }

    // Batched decode, disarmed: m = 4 slots per forward.
    let m = 4;
    let mut batched = Vec::new();
    for _ in 0..3 {
        fwd.reset();
        for i in 0..m {
            fwd.forward(Some(i as u32), &prompt[..64 + i], 0).unwrap();
        }
        let t0 = Instant::now();
        for s in 0..steps {
            let toks: Vec<u32> = (0..m)
                .map(|i| ((s + i) * 31 % vocab as usize) as u32)
                .collect();
            let pos: Vec<usize> = (0..m).map(|i| 64 + i + s).collect();
            fwd.decode_batch(&toks, &pos).unwrap();
        }
        batched.push((steps * m) as f64 / secs(t0.elapsed()));
    }
    println!(
        "decode, disarmed, m=4 batched: {:.0} tokens/s (median of 3)",
        median(batched)
    );

    // A full armed capture of the same prefill and 16 decode steps, against
    // the same work disarmed.
    let work = |fwd: &mut dyn Forward| {
        fwd.reset();
        fwd.forward(None, &prompt, 0).unwrap();
        for s in 0..16 {
            fwd.forward(None, &[(s * 31 % vocab as usize) as u32], prompt.len() + s)
                .unwrap();
        }
    };
    work(&mut fwd);
    let t0 = Instant::now();
    work(&mut fwd);
    let disarmed = secs(t0.elapsed());
    let dir = tempfile::tempdir().unwrap();
    let (b0, c0) = kernels::cuda::tap_copy_stats();
    let t0 = Instant::now();
    let cap = capture::Capture::start(capture::CaptureOptions {
        out: dir.path().join("tree"),
        selection: capture::Selection::all(),
        force: false,
        stages: kernels::stages::llama(),
        run: capture::RunInfo::default(),
    })
    .unwrap();
    work(&mut fwd);
    let forward_done = secs(t0.elapsed());
    let summary = cap.finish().unwrap();
    let armed = secs(t0.elapsed());
    let (b1, c1) = kernels::cuda::tap_copy_stats();
    let (bytes, copy) = (b1 - b0, secs(c1 - c0));
    println!(
        "prefill 128 + decode 16: disarmed {:.3} s; armed full capture {:.3} s until the last tap, {:.3} s with the tree written ({} taps, {:.1} MB; finish {:.3} s): x{:.1}",
        disarmed,
        forward_done,
        armed,
        summary.taps,
        summary.bytes as f64 / 1e6,
        armed - forward_done,
        armed / disarmed
    );
    let (pinned, pageable) = copy_bandwidth(&dev, 64 << 20);
    println!(
        "tap copies: {:.1} MB, asynchronous; the host waited {:.3} s for them in all; plain 64 MiB device-to-host copy: pinned {:.2} GB/s, pageable {:.2} GB/s",
        bytes as f64 / 1e6,
        copy,
        pinned,
        pageable
    );
    assert!(bytes > 0 && summary.taps > 0);
}

// One decode layer, launch by launch and fused: its own file.
mod cuda_perf_layer;
// The persistent step's timeline: its own file.
mod cuda_perf_timeline;
