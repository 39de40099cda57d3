//! The CUDA forward end to end on a tiny seeded model: parity with the CPU
//! forward, prefill against one-token-at-a-time, batched decode against each
//! slot run alone (with the controls that make that probe trustworthy), the
//! GPU taps against the CPU taps key by key, and the refusals. Each test
//! skips, saying so, where there is no GPU.
#![cfg(feature = "cuda")]

mod cuda_models;

use cuda_models::*;
use kernels::cpu::CpuForward;
use kernels::cuda::device::driver_present;
use kernels::cuda::CudaForward;
use kernels::switches::{ActPrecision, Family, Switches};
use kernels::{Forward, ForwardError, Precision};
use model::GgmlType;

#[test]
fn logits_match_the_cpu_forward() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = tiny_model();
    for p in [Precision::F32, Precision::Q8] {
        let mut cpu = CpuForward::new(&w, p, &Switches::none()).unwrap();
        let mut gpu = cuda(&w, p);
        let a = gpu.forward(None, &PROMPT, 0).unwrap();
        let b = cpu.forward(None, &PROMPT, 0).unwrap();
        let err = rel_err(&a, &b);
        // f32: the same op order, only exp may round apart; q8: integer
        // block sums against float ones.
        let bound = if p == Precision::F32 { 1e-5 } else { 1e-4 };
        assert!(err < bound, "{p}: logits {err:e} from the CPU forward");
        let a2 = gpu.forward(None, &[7], PROMPT.len()).unwrap();
        let b2 = cpu.forward(None, &[7], PROMPT.len()).unwrap();
        assert!(rel_err(&a2, &b2) < bound, "{p}: decode step");
    }
}

#[test]
fn prefill_equals_one_token_at_a_time() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = tiny_model();
    let mut gpu = cuda(&w, Precision::F32);
    let prefill = gpu.forward(None, &PROMPT, 0).unwrap();
    gpu.reset();
    let mut last = Vec::new();
    for (i, &t) in PROMPT.iter().enumerate() {
        last = gpu.forward(None, &[t], i).unwrap();
    }
    assert_eq!(
        prefill, last,
        "every kernel is row-independent: bitwise equal"
    );
}

#[test]
fn batched_decode_equals_each_slot_alone() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = tiny_model();
    let prompts: [&[u32]; 4] = [&PROMPT, &[3, 4], &[90, 80, 70, 60, 50], &[11]];
    let step = [5u32, 6, 7, 8];

    let run_batched = |prompts: &[&[u32]]| {
        let mut gpu = cuda(&w, Precision::F32);
        for (i, p) in prompts.iter().enumerate() {
            gpu.forward(Some(i as u32), p, 0).unwrap();
        }
        let pos: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
        let first = gpu.decode_batch(&step, &pos).unwrap();
        let pos2: Vec<usize> = pos.iter().map(|p| p + 1).collect();
        let second = gpu.decode_batch(&step, &pos2).unwrap();
        (first, second)
    };
    let (batched, batched2) = run_batched(&prompts);
    assert_eq!(batched.len(), 4);
    for (i, p) in prompts.iter().enumerate() {
        let mut alone = cuda(&w, Precision::F32);
        alone.forward(None, p, 0).unwrap();
        let single = alone.forward(None, &[step[i]], p.len()).unwrap();
        assert_eq!(batched[i], single, "slot {i}: batched differs from alone");
        let single2 = alone.forward(None, &[step[i]], p.len() + 1).unwrap();
        assert_eq!(batched2[i], single2, "slot {i}, second step");
    }
    // Control: the batched run again is identical.
    let (again, _) = run_batched(&prompts);
    assert_eq!(again, batched, "batched decode is not deterministic");
    // Control: a slot fed a different prompt must diverge (the probe reads
    // its input), and the other slots must not move.
    let other: [&[u32]; 4] = [&PROMPT, &[3, 9], &[90, 80, 70, 60, 50], &[11]];
    let (perturbed, _) = run_batched(&other);
    assert_ne!(perturbed[1], batched[1], "slot 1 ignored its prompt");
    for i in [0, 2, 3] {
        assert_eq!(
            perturbed[i], batched[i],
            "slot {i} moved when slot 1 changed"
        );
    }
}

#[test]
fn taps_match_the_cpu_taps_key_by_key() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = tiny_model();
    let dir = tempfile::tempdir().unwrap();
    let capture_with = |name: &str, fwd: &mut dyn Forward| {
        let cap = capture::Capture::start(capture::CaptureOptions {
            out: dir.path().join(name),
            selection: capture::Selection::all(),
            force: false,
            stages: kernels::stages::llama(),
            run: capture::RunInfo::default(),
        })
        .unwrap();
        fwd.forward(None, &PROMPT, 0).unwrap();
        fwd.forward(None, &[9], PROMPT.len()).unwrap();
        cap.finish().unwrap();
        capture::TreeReader::open(dir.path().join(name)).unwrap()
    };
    let mut cpu = CpuForward::new(&w, Precision::F32, &Switches::none()).unwrap();
    let a = capture_with("cpu", &mut cpu);
    let b = capture_with("cuda", cuda(&w, Precision::F32).as_mut());
    let c = capture_with("cuda2", cuda(&w, Precision::F32).as_mut());
    let (ea, eb) = (a.entries(), b.entries());
    // embedding + 15 per layer + final_norm + logits, for each of two calls.
    assert_eq!(ea.len(), 2 * (2 + 15 * 2 + 1));
    assert_eq!(ea.len(), eb.len());
    for (x, y) in ea.iter().zip(eb) {
        assert_eq!(x.key, y.key);
        assert_eq!((x.dtype, &x.shape), (y.dtype, &y.shape), "{}", x.key);
        let (vx, vy) = (a.read(x).unwrap().to_f64(), b.read(y).unwrap().to_f64());
        let scale = vx.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
        let err = vx
            .iter()
            .zip(&vy)
            .map(|(p, q)| (p - q).abs())
            .fold(0f64, f64::max)
            / scale;
        assert!(err < 1e-5, "{}: {err:e} from the CPU tap", x.key);
    }
    assert_eq!(b.root(), c.root(), "two CUDA captures differ");
}

#[test]
fn refusals_are_errors_not_panics() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = tiny_model();
    let e = kernels::cuda::open(&w, Precision::F64, &Switches::none())
        .err()
        .unwrap();
    assert!(e.to_string().contains("f64"), "{e}");
    let mut gpu = cuda(&w, Precision::F32);
    assert!(matches!(
        gpu.forward(None, &[97], 0),
        Err(ForwardError::TokenOutOfRange { id: 97, vocab: 97 })
    ));
    assert!(matches!(
        gpu.forward(None, &[1; 65], 0),
        Err(ForwardError::ContextOverflow {
            end: 65,
            context: 64
        })
    ));
    let e = gpu.decode_batch(&[1], &[3]).unwrap_err();
    assert!(e.to_string().contains("slot 0"), "{e}");
    let mut odd = w.clone();
    odd.layers[1].w_up.ggml_type = GgmlType::Q2_K;
    let e = kernels::cuda::open(&odd, Precision::F32, &Switches::none())
        .err()
        .unwrap();
    assert!(e.to_string().contains("blk.1.ffn_up"), "{e}");
}

#[test]
fn without_a_driver_open_is_an_error_not_a_panic() {
    if driver_present() {
        eprintln!("skipped: this host has a CUDA driver");
        return;
    }
    let e = kernels::cuda::open(&tiny_model(), Precision::F32, &Switches::none())
        .err()
        .expect("no driver, yet the CUDA forward opened");
    let msg = e.to_string();
    assert!(msg.contains("no CUDA driver found"), "{msg}");
    assert!(
        msg.contains("libcuda.so"),
        "the message names what was looked for: {msg}"
    );
}

#[test]
fn switches_move_one_family_as_on_the_cpu() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = tiny_model();
    let only_down = Switches::none().with(Family::FfnDown, ActPrecision::Q8);
    let mut cpu = CpuForward::new(&w, Precision::F32, &only_down).unwrap();
    let mut gpu = kernels::cuda::open(&w, Precision::F32, &only_down).unwrap();
    let mut plain = cuda(&w, Precision::F32);
    let a = gpu.forward(None, &PROMPT, 0).unwrap();
    let b = cpu.forward(None, &PROMPT, 0).unwrap();
    let f32_only = plain.forward(None, &PROMPT, 0).unwrap();
    let err = rel_err(&a, &b);
    assert!(err < 1e-4, "ffn_down at q8: logits {err:e} from the CPU");
    // The switch did something: the GPU run moved away from plain f32.
    let moved = rel_err(&a, &f32_only);
    assert!(
        moved > 10.0 * err,
        "ffn_down switch had no effect ({moved:e})"
    );
}

#[test]
fn gemma_family_matches_the_cpu_forward() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = tiny_gemma();
    let mut cpu = CpuForward::new(&w, Precision::F32, &Switches::none()).unwrap();
    let mut gpu = cuda(&w, Precision::F32);
    let a = gpu.forward(None, &PROMPT, 0).unwrap();
    let b = cpu.forward(None, &PROMPT, 0).unwrap();
    let err = rel_err(&a, &b);
    assert!(
        err < 1e-5,
        "gemma prefill: logits {err:e} from the CPU forward"
    );
    for (i, t) in [7u32, 8, 9].into_iter().enumerate() {
        let a = gpu.forward(None, &[t], PROMPT.len() + i).unwrap();
        let b = cpu.forward(None, &[t], PROMPT.len() + i).unwrap();
        let err = rel_err(&a, &b);
        assert!(err < 1e-5, "gemma decode step {i}: {err:e}");
    }
    // Control: the llama skeleton over the same weights is another model.
    let mut llama = w.clone();
    llama.config.family = model::ModelFamily::llama();
    let mut plain = cuda(&llama, Precision::F32);
    let c = plain.forward(None, &PROMPT, 0).unwrap();
    let moved = rel_err(&c, &b);
    assert!(
        moved > 1e-2,
        "the family's layers changed nothing ({moved:e})"
    );
    // Batched decode equals each slot alone, bitwise.
    let prompts: [&[u32]; 4] = [&PROMPT, &[3, 4], &[90, 80, 70, 60, 50], &[11]];
    let mut batched = cuda(&w, Precision::F32);
    for (i, p) in prompts.iter().enumerate() {
        batched.forward(Some(i as u32), p, 0).unwrap();
    }
    let pos: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    let out = batched.decode_batch(&[5, 6, 7, 8], &pos).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let mut alone = cuda(&w, Precision::F32);
        alone.forward(None, p, 0).unwrap();
        let single = alone.forward(None, &[5 + i as u32], p.len()).unwrap();
        assert_eq!(out[i], single, "gemma slot {i}: batched differs from alone");
    }
}

/// Captures a prefill and one decode step of `fwd` into `dir/name`.
fn capture_run(dir: &std::path::Path, name: &str, fwd: &mut dyn Forward) -> capture::TreeReader {
    let cap = capture::Capture::start(capture::CaptureOptions {
        out: dir.join(name),
        selection: capture::Selection::all(),
        force: false,
        stages: kernels::stages::for_config(fwd.config()),
        run: capture::RunInfo::default(),
    })
    .unwrap();
    fwd.forward(None, &PROMPT, 0).unwrap();
    fwd.forward(None, &[9], PROMPT.len()).unwrap();
    cap.finish().unwrap();
    capture::TreeReader::open(dir.join(name)).unwrap()
}

#[test]
fn gemma_q8_matches_the_cpu_q8_forward() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    // Gemma 3's real mix: Q5_0 q/k/v/gate/up (Q8_0 activations), Q4_K
    // o_proj and Q6_K ffn_down (Q8_K activations).
    let mut w = tiny_gemma();
    let mut r = Rng(21);
    let (d, hd, ff) = (64, 64, 256);
    for (l, lw) in w.layers.iter_mut().enumerate() {
        lw.wq = q5_0(&mut r, &format!("blk.{l}.attn_q"), 4 * hd, d);
        lw.wk = q5_0(&mut r, &format!("blk.{l}.attn_k"), hd, d);
        lw.wv = q5_0(&mut r, &format!("blk.{l}.attn_v"), hd, d);
        lw.w_gate = q5_0(&mut r, &format!("blk.{l}.ffn_gate"), ff, d);
        lw.w_up = q5_0(&mut r, &format!("blk.{l}.ffn_up"), ff, d);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cpu = CpuForward::new(&w, Precision::Q8, &Switches::none()).unwrap();
    let a = capture_run(dir.path(), "cpu", &mut cpu);
    let b = capture_run(dir.path(), "cuda", cuda(&w, Precision::Q8).as_mut());
    let f = capture_run(dir.path(), "cuda-f32", cuda(&w, Precision::F32).as_mut());
    let (ea, eb, ef) = (a.entries(), b.entries(), f.entries());
    assert_eq!(ea.len(), eb.len());
    let mut bitwise = 0;
    let mut worst = 0f64;
    let mut q8_moved = 0f64;
    for ((x, y), z) in ea.iter().zip(eb).zip(ef) {
        assert_eq!(x.key, y.key);
        let (vx, vy) = (a.read(x).unwrap().to_f64(), b.read(y).unwrap().to_f64());
        let vz = f.read(z).unwrap().to_f64();
        let rel = |p: &[f64], q: &[f64]| {
            let scale = p.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
            p.iter()
                .zip(q)
                .map(|(u, v)| (u - v).abs())
                .fold(0f64, f64::max)
                / scale
        };
        let err = rel(&vx, &vy);
        q8_moved = q8_moved.max(rel(&vx, &vz));
        worst = worst.max(err);
        if err == 0.0 {
            bitwise += 1;
        }
        eprintln!("{}: {err:e} from the CPU q8 tap", x.key);
        // Every quantized matmul, the quantizers and the norms sum in the
        // CPU's order: until attention's exp (the one op that rounds apart)
        // the two forwards are the same bits.
        let early = [
            "attn_norm",
            "q_proj",
            "k_proj",
            "v_proj",
            "q_norm",
            "k_norm",
        ];
        let stage = x.key.stage.as_str();
        if stage == "embedding" || (x.key.layer == Some(0) && early.contains(&stage)) {
            assert_eq!(err, 0.0, "{}: the CPU's order, yet not bitwise", x.key);
        }
        assert!(err < 1e-2, "{}: {err:e} from the CPU q8 tap", x.key);
    }
    eprintln!(
        "{bitwise} of {} taps bitwise; worst {worst:e}; q8 vs f32 {q8_moved:e}",
        ea.len()
    );
    // Control: q8 runs (the f32 GPU forward is far from the CPU's q8).
    assert!(
        q8_moved > 10.0 * worst.max(1e-7),
        "q8 indistinguishable from f32 ({q8_moved:e} vs {worst:e})"
    );
}

#[test]
fn decode_graph_equals_launch_by_launch() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let dev = kernels::cuda::Device::open(0).unwrap();
    // Gemma at q8: Q4_1 projections on Q8_0 activations and Q4_K/Q6_K ones
    // on Q8_K, both quantizers inside the graph; a window on layer 0.
    for (name, mut w) in [("llama", tiny_model()), ("gemma", tiny_gemma())] {
        // Room past the cache's first capacity (64 positions).
        w.config.context_length = 256;
        for p in [Precision::F32, Precision::Q8] {
            let open = |graphs: bool| {
                let mut f = CudaForward::new(dev.clone(), &w, p, &Switches::none()).unwrap();
                f.set_graphs(graphs);
                f
            };
            let (mut eager, mut graphed) = (open(false), open(true));
            assert_eq!(
                eager.forward(None, &PROMPT, 0).unwrap(),
                graphed.forward(None, &PROMPT, 0).unwrap(),
                "{name} {p}: prefill"
            );
            // 70 steps: past the cache's first capacity (64 positions), so
            // the graph is captured again over the grown cache. The same
            // token twice in a row: only the position tells the steps apart.
            let mut last = Vec::new();
            for i in 0..70 {
                let t = [(i / 2 * 13 % 90) as u32];
                let pos = PROMPT.len() + i;
                let a = eager.forward(None, &t, pos).unwrap();
                let b = graphed.forward(None, &t, pos).unwrap();
                assert_eq!(a, b, "{name} {p}: decode step {i} (position {pos})");
                assert_ne!(b, last, "{name} {p}: step {i} repeated the previous step");
                last = b;
            }
            assert_eq!(eager.graph_replays(), 0, "{name} {p}");
            assert_eq!(
                graphed.graph_replays(),
                70,
                "{name} {p}: steps not replayed"
            );
            // Armed, the decode step runs launch by launch (its taps copy
            // out), and still computes the same bits.
            let dir = tempfile::tempdir().unwrap();
            let cap = capture::Capture::start(capture::CaptureOptions {
                out: dir.path().join("t"),
                selection: capture::Selection::all(),
                force: false,
                stages: kernels::stages::for_config(&w.config),
                run: capture::RunInfo::default(),
            })
            .unwrap();
            let t = [5u32];
            let pos = PROMPT.len() + 70;
            let b = graphed.forward(None, &t, pos).unwrap();
            cap.finish().unwrap();
            assert_eq!(
                graphed.graph_replays(),
                70,
                "{name} {p}: an armed step replayed"
            );
            assert_eq!(
                eager.forward(None, &t, pos).unwrap(),
                b,
                "{name} {p}: armed step"
            );
        }
    }
}
