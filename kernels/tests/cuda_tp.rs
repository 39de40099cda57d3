//! The CUDA tensor-parallel forward against its oracle, the CPU
//! tensor-parallel forward, and against the one-GPU forward, on a seeded
//! model split unevenly (9 query heads over 3 KV heads, as SmolLM2): its
//! ranks on one GPU (the device-side sum in rank order), NCCL with one
//! rank (the identity), and NCCL over two GPUs. Each test skips, saying
//! so, where there is no GPU, no NCCL library, or fewer than two GPUs.
#![cfg(feature = "cuda")]

mod cuda_models;

use std::sync::Arc;

use cuda_models::{have_gpu, rel_err, serial, tensor, Rng, PROMPT};
use kernels::cpu::tp::TpForward;
use kernels::cuda::device::Device;
use kernels::cuda::tp::reduce::{nccl_present, Reducer};
use kernels::cuda::tp::{CudaTpForward, TpDevices};
use kernels::switches::{Reduce, Switches, TpSkip};
use kernels::{Forward, Precision};
use model::{GgmlType, LayerWeights, LlamaConfig, ModelWeights};

/// Two layers, 9 query heads of 32 over 3 KV heads, FFN 128 (four Q4_1
/// blocks): TP=2 splits heads 4 + 5 with KV head 1 on both ranks.
fn uneven_model() -> ModelWeights {
    let config = LlamaConfig {
        arch: "llama".into(),
        n_layer: 2,
        n_embd: 96,
        n_head: 9,
        n_head_kv: 3,
        head_dim: 32,
        n_ff: 128,
        vocab_size: 97,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        context_length: 64,
        family: model::ModelFamily::llama(),
    };
    let mut r = Rng(17);
    let (d, qw, kvw, ff) = (96, 288, 96, 128);
    let q41 = GgmlType::Q4_1;
    let f32t = GgmlType::F32;
    let layers = (0..config.n_layer)
        .map(|l| {
            let mut t = |name: &str, ty, shape: &[usize], scale, offset| {
                tensor(&mut r, &format!("blk.{l}.{name}"), ty, shape, scale, offset)
            };
            LayerWeights {
                attn_norm: t("attn_norm", f32t, &[d], 0.2, 1.0),
                wq: t("attn_q", q41, &[qw, d], 0.3, 0.0),
                wk: t("attn_k", q41, &[kvw, d], 0.3, 0.0),
                wv: t("attn_v", q41, &[kvw, d], 0.3, 0.0),
                wo: t("attn_output", q41, &[d, qw], 0.3, 0.0),
                ffn_norm: t("ffn_norm", f32t, &[d], 0.2, 1.0),
                w_gate: t("ffn_gate", q41, &[ff, d], 0.3, 0.0),
                w_up: t("ffn_up", q41, &[ff, d], 0.3, 0.0),
                w_down: t("ffn_down", q41, &[d, ff], 0.3, 0.0),
                bq: None,
                bk: None,
                bv: None,
                extra_norms: Default::default(),
            }
        })
        .collect();
    ModelWeights {
        token_embd: tensor(&mut r, "token_embd", GgmlType::Q8_0, &[97, d], 1.0, 0.0),
        output_norm: tensor(&mut r, "output_norm", f32t, &[d], 0.2, 1.0),
        output: None,
        layers,
        config,
    }
}

fn shared(w: &ModelWeights, n: usize, s: &Switches) -> CudaTpForward {
    CudaTpForward::on(w, Precision::F32, s, n, TpDevices::Shared).expect("open CUDA TP")
}

/// Prefill, then one decode step: both logits.
fn two_steps(f: &mut dyn Forward) -> (Vec<f32>, Vec<f32>) {
    let a = f.forward(None, &PROMPT, 0).unwrap();
    let b = f.forward(None, &[9], PROMPT.len()).unwrap();
    (a, b)
}

fn capture_run(dir: &std::path::Path, name: &str, f: &mut dyn Forward) -> capture::TreeReader {
    let cap = capture::Capture::start(capture::CaptureOptions {
        out: dir.join(name),
        selection: capture::Selection::all(),
        force: false,
        stages: kernels::cpu::tp::stages(f.config()),
        run: capture::RunInfo::default(),
    })
    .unwrap();
    two_steps(f);
    cap.finish().unwrap();
    capture::TreeReader::open(dir.join(name)).unwrap()
}

#[test]
fn ranks_on_one_gpu_match_the_cpu_tp_forward_and_the_one_gpu_forward() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = uneven_model();
    let none = Switches::none();
    let mut one = kernels::cuda::open(&w, Precision::F32, &none).unwrap();
    let (o1, o2) = two_steps(one.as_mut());
    for n in [2, 3, 4] {
        let mut cpu = TpForward::new(&w, Precision::F32, &none, n).unwrap();
        let (c1, c2) = two_steps(&mut cpu);
        let mut gpu = shared(&w, n, &none);
        let (g1, g2) = two_steps(&mut gpu);
        for (what, g, c, o) in [("prefill", &g1, &c1, &o1), ("decode", &g2, &c2, &o2)] {
            let to_cpu = rel_err(g, c);
            let to_one = rel_err(g, o);
            eprintln!("tp {n} {what}: {to_cpu:e} from CPU TP, {to_one:e} from the one-GPU forward");
            assert!(
                to_cpu < 1e-5,
                "tp {n} {what}: {to_cpu:e} from the CPU TP forward"
            );
            assert!(
                to_one < 1e-4,
                "tp {n} {what}: {to_one:e} from the one-GPU forward"
            );
        }
    }
}

#[test]
fn a_skipped_all_reduce_contribution_moves_the_logits() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = uneven_model();
    let none = Switches::none();
    let (clean, _) = two_steps(&mut shared(&w, 2, &none));
    for stage in [Reduce::OProj, Reduce::FfnDown] {
        let skip = TpSkip {
            rank: 1,
            layer: 1,
            stage,
        };
        let s = Switches::none().with_tp_skip(skip);
        let (bad, _) = two_steps(&mut shared(&w, 2, &s));
        let (cpu_bad, _) = two_steps(&mut TpForward::new(&w, Precision::F32, &s, 2).unwrap());
        let moved = rel_err(&bad, &clean);
        assert!(moved > 1e-2, "{skip}: logits moved only {moved:e}");
        // The fault is the same fault on both backends.
        assert!(
            rel_err(&bad, &cpu_bad) < 1e-5,
            "{skip}: CUDA and CPU faults differ"
        );
    }
}

#[test]
fn taps_have_the_cpu_tp_keys_and_values_and_shards_are_the_one_gpu_columns() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = uneven_model();
    let none = Switches::none();
    let dir = tempfile::tempdir().unwrap();
    let mut cpu = TpForward::new(&w, Precision::F32, &none, 2).unwrap();
    let a = capture_run(dir.path(), "cpu", &mut cpu);
    let b = capture_run(dir.path(), "cuda", &mut shared(&w, 2, &none));
    let c = capture_run(dir.path(), "cuda-again", &mut shared(&w, 2, &none));
    let (ea, eb) = (a.entries(), b.entries());
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
        assert!(err < 1e-5, "{}: {err:e} from the CPU TP tap", x.key);
    }
    assert_eq!(b.root(), c.root(), "two CUDA TP captures differ");
    // Column-parallel shards: the one-GPU forward's columns, bit for bit.
    let mut one = kernels::cuda::open(&w, Precision::F32, &none).unwrap();
    let cap = capture::Capture::start(capture::CaptureOptions {
        out: dir.path().join("one"),
        selection: capture::Selection::all(),
        force: false,
        stages: kernels::stages::for_config(&w.config),
        run: capture::RunInfo::default(),
    })
    .unwrap();
    two_steps(one.as_mut());
    cap.finish().unwrap();
    let one = capture::TreeReader::open(dir.path().join("one")).unwrap();
    let q_one = one
        .entries()
        .iter()
        .find(|e| is_first_q_proj(&e.key))
        .expect("one-GPU q_proj");
    let full = one.read(q_one).unwrap().to_f64();
    let width = 9 * 32;
    for e in eb.iter().filter(|e| is_first_q_proj(&e.key)) {
        let shard = e.key.shard.expect("a q_proj shard");
        let (s, t) = (shard.start as usize, shard.end as usize);
        let want: Vec<f64> = full
            .chunks_exact(width)
            .flat_map(|r| r[s..t].iter().copied())
            .collect();
        assert_eq!(
            b.read(e).unwrap().to_f64(),
            want,
            "{:?}: not the one-GPU columns",
            e.key
        );
    }
}

/// Layer 0's q_proj of the prefill.
fn is_first_q_proj(k: &capture::Key) -> bool {
    k.stage == "q_proj" && k.layer == Some(0) && k.pos.start == 0
}

#[test]
fn refusals_are_errors() {
    if !have_gpu() {
        return;
    }
    let _g = serial();
    let w = uneven_model();
    let none = Switches::none();
    let e = CudaTpForward::on(&w, Precision::F32, &none, 10, TpDevices::Shared)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--tp 10:"), "{e}");
    let e = CudaTpForward::on(&w, Precision::F64, &none, 2, TpDevices::Shared)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("cpu backend only"), "{e}");
    let skip = Switches::none().with_tp_skip(TpSkip {
        rank: 2,
        layer: 0,
        stage: Reduce::OProj,
    });
    let e = CudaTpForward::on(&w, Precision::F32, &skip, 2, TpDevices::Shared)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("rank 2 of layer 0 does not exist"), "{e}");
}

fn have_nccl() -> bool {
    if !have_gpu() {
        return false;
    }
    if !nccl_present() {
        eprintln!("skipped: no NCCL library (libnccl.so) on the library path");
        return false;
    }
    true
}

#[test]
fn nccl_all_reduce_of_one_rank_is_the_identity() {
    if !have_nccl() {
        return;
    }
    let _g = serial();
    let dev = Device::open(0).unwrap();
    let devs = vec![dev.clone()];
    let mut r = Reducer::nccl(&devs).expect("an NCCL communicator of one rank");
    assert_eq!(std::env::var("NCCL_NVLS_ENABLE").as_deref(), Ok("0"));
    let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 11.0).collect();
    let mut buf = kernels::cuda::ops::upload(&dev, &x).unwrap();
    r.all_reduce(&devs, &mut [&mut buf], x.len(), None).unwrap();
    let y = kernels::cuda::ops::download(&dev, &buf.as_view()).unwrap();
    assert_eq!(y, x);
    // With its only rank skipped, the sum is of nothing: zeros.
    r.all_reduce(&devs, &mut [&mut buf], 500, Some(0)).unwrap();
    let z = kernels::cuda::ops::download(&dev, &buf.as_view()).unwrap();
    assert!(z[..500].iter().all(|v| *v == 0.0) && z[500..] == x[500..]);
}

fn gpus() -> usize {
    cudarc::driver::CudaContext::device_count().map_or(0, |n| n as usize)
}

#[test]
fn nccl_over_two_gpus_matches_the_ranks_on_one_gpu() {
    if !have_nccl() {
        return;
    }
    if gpus() < 2 {
        eprintln!(
            "skipped: {} GPU(s) visible; NCCL tensor parallelism needs 2",
            gpus()
        );
        return;
    }
    let _g = serial();
    let w = uneven_model();
    let none = Switches::none();
    let mut nccl = CudaTpForward::on(&w, Precision::F32, &none, 2, TpDevices::Nccl).unwrap();
    let devs: Vec<Arc<Device>> = nccl.rank_devices();
    assert_ne!(devs[0].describe(), "", "two devices opened");
    let (n1, n2) = two_steps(&mut nccl);
    let (s1, s2) = two_steps(&mut shared(&w, 2, &none));
    // Two ranks: a + b is commutative, so NCCL's sum is bitwise p0 + p1.
    assert_eq!(n1, s1);
    assert_eq!(n2, s2);
}
