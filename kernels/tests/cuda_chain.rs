//! The chained greedy decode on the device (`cuda/forward/chain.rs`):
//! `step_next`, the chained step's greedy pick, against `generate::argmax`,
//! and a chained greedy run against the host's step by step over the fused
//! tests' weight layouts and every early-launch mode. Skips, saying so,
//! without a GPU.
#![cfg(feature = "cuda")]

mod cuda_kernels_support;
mod cuda_models;

use cuda_kernels_support as ks;
use cuda_models::*;
use kernels::cuda::ops;
use kernels::Forward;

/// `step_next`, the chained step's greedy pick, against `generate::argmax`
/// over logits that test its rules: the first of equal largest values
/// (equals in one thread's stride, in different threads and warps, and
/// -0 against +0), NaN never winning (first, everywhere, beside the
/// largest), nothing above -inf giving 0, +inf, and sizes from one logit
/// to a SmolLM2 vocabulary. The pick goes to the next step's input (the
/// position one past) and to the tokens at the step's position.
#[test]
fn step_next_picks_what_argmax_picks() {
    let Some(dev) = ks::gpu() else {
        return;
    };
    let mut rng = ks::Rng(23);
    let mut cases: Vec<(String, Vec<f32>)> = Vec::new();
    for n in [1usize, 2, 97, 1024, 1025, 4099, 49_152] {
        let random: Vec<f32> = (0..n).map(|_| rng.f32() * 8.0 - 4.0).collect();
        cases.push((format!("random {n}"), random.clone()));
        let top = random.iter().cloned().fold(f32::NEG_INFINITY, f32::max) + 1.0;
        // Equal largest values: in one thread's stride (i, i + 1024), in
        // two warps, in neighbours; the first must win.
        for ties in [
            [n / 3, n / 3 + 1024],
            [n - 1, n / 2],
            [n / 2, n / 2 + 1],
            [5, 37],
        ] {
            let mut v = random.clone();
            for &i in &ties {
                if i < n {
                    v[i] = top;
                }
            }
            cases.push((format!("ties {ties:?} of {n}"), v));
        }
        let mut v = random.clone();
        v[0] = f32::NAN;
        v[n / 2] = f32::NAN;
        cases.push((format!("NaN first and in the middle of {n}"), v));
        let mut v = vec![-0.0f32; n];
        v[n - 1] = 0.0;
        cases.push((format!("-0 then +0 of {n}"), v));
        cases.push((format!("all NaN {n}"), vec![f32::NAN; n]));
        cases.push((format!("all -inf {n}"), vec![f32::NEG_INFINITY; n]));
        let mut v: Vec<f32> = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    f32::NAN
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        cases.push((format!("NaN and -inf {n}"), v.clone()));
        v[n - 1] = f32::INFINITY;
        cases.push((format!("+inf last of {n}"), v));
    }
    let mut differs = 0;
    for (k, (name, v)) in cases.iter().enumerate() {
        let want = kernels::generate::argmax(v);
        let logits = ops::upload(&dev, v).unwrap();
        let pos = (k % 60) as u32;
        let input = ops::upload(&dev, &[12345u32, pos]).unwrap();
        let toks = dev.stream().alloc_zeros::<u32>(64).unwrap();
        {
            use cudarc::driver::DevicePtr;
            let (i, _g) = input.device_ptr(dev.stream());
            let (t, _g2) = toks.device_ptr(dev.stream());
            // SAFETY: two u32s and 64 u32s of device memory, pos < 64.
            unsafe { ops::step_next(&dev, &logits.as_view(), i, t) }.unwrap();
        }
        let got = dev.stream().clone_dtoh(&input).unwrap();
        let at = dev.stream().clone_dtoh(&toks).unwrap()[pos as usize];
        assert_eq!(got, [want, pos + 1], "{name}: the next step's input");
        assert_eq!(at, want, "{name}: the step's token");
        differs += usize::from(want != 0);
    }
    // The cases pick more than index 0: a kernel that always wrote 0 fails.
    assert!(differs > 20, "only {differs} cases pick a token past 0");
}

/// Greedy generation chained on the device (`forward/chain.rs`) against
/// the host's step by step, unfused and without graphs: the same tokens for
/// each weight layout and early-launch mode (69 steps, each its own window
/// at the default window of one; `TAPTREE_CUDA_CHAIN_WINDOW=8` runs them as
/// windows of eight and a remainder), past the cache's first capacity
/// (grown before the first chained step), stopped at a stop token at the
/// same place, and the cache then as stepping leaves it (the next step's
/// logits equal). The control: the chained forward did chain.
#[test]
fn chained_greedy_equals_step_by_step() {
    let long = long_prompt();
    each_launch_mode_and_layout(|dev, _, name, w| {
        let mut host = open_fused(dev, w, false);
        host.set_chained(false);
        let mut chained = open_fused(dev, w, true);
        let want = kernels::generate::greedy(&mut host, &long, 70, &[]).unwrap();
        let got = kernels::generate::greedy(&mut chained, &long, 70, &[]).unwrap();
        assert_eq!(want, got, "{name}: 70 greedy tokens");
        assert_eq!(host.chained_steps(), 0, "{name}: chained while off");
        assert_eq!(
            chained.chained_steps(),
            69,
            "{name}: not every step chained"
        );
        // Stopped at the 12th token (its first appearance).
        let stop = want.tokens[11];
        let first = want.tokens.iter().position(|&t| t == stop).unwrap();
        host.reset();
        chained.reset();
        let want = kernels::generate::greedy(&mut host, &long, 70, &[stop]).unwrap();
        let got = kernels::generate::greedy(&mut chained, &long, 70, &[stop]).unwrap();
        assert_eq!(want, got, "{name}: stopped at {stop}");
        assert!(
            got.stopped && got.tokens.len() == first + 1,
            "{name}: {got:?}"
        );
        // The cache holds what stepping left: the stop token's step.
        let pos = long.len() + got.tokens.len() - 1;
        let a = host.forward(None, &[stop], pos).unwrap();
        let b = chained.forward(None, &[stop], pos).unwrap();
        assert_eq!(a, b, "{name}: the step after the stop token");
    });
}
