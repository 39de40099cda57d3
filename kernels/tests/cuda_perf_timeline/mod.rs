//! `persistent_timeline`: where the persistent decode step's time goes,
//! from the GPU's global timer at every barrier (part of the `cuda_perf`
//! binary, printed by `gpu_figures`).

use kernels::cuda::ops;
use kernels::cuda::CudaForward;
use kernels::Forward;

use super::median;

/// Where a persistent step's time goes: each block notes when it arrived at
/// and left each barrier (the GPU's global timer), over 8 steps launch by
/// launch; per step kind, the medians over steps and layers of the step
/// (the last block to leave the barrier before it to the last to arrive at
/// the one after) and of the barrier's release (the last arrival to the
/// last departure).
pub(crate) fn persistent_timeline(fwd: &mut CudaForward, prompt: &[u32], vocab: u32) {
    fwd.set_graphs(false);
    fwd.set_persistent(true);
    fwd.set_persistent_blocks(0);
    fwd.set_persistent_timeline(true).unwrap();
    fwd.reset();
    fwd.forward(None, prompt, 0).unwrap();
    let mut steps: Vec<Vec<f64>> = vec![Vec::new(); 5];
    let mut release: Vec<Vec<f64>> = vec![Vec::new(); 5];
    let mut blocks = 0;
    for s in 0..8 {
        fwd.forward(None, &[(s * 31 % vocab as usize) as u32], prompt.len() + s)
            .unwrap();
        let (b, t) = fwd.persistent_timeline().unwrap().expect("a timeline");
        blocks = b;
        let n = ops::timeline_len(fwd.config().n_layer, b) / (2 * b);
        let at = |bar: usize, k: usize, left: usize| t[2 * (bar * b + k) + left] as f64;
        let last = |bar: usize, left: usize| (0..b).map(|k| at(bar, k, left)).fold(0.0, f64::max);
        for bar in 1..n {
            steps[bar % 5].push((last(bar, 0) - last(bar - 1, 1)) / 1e3);
            release[bar % 5].push((last(bar, 1) - last(bar, 0)) / 1e3);
        }
    }
    let names = [
        "q/k/v + RoPE",
        "attention",
        "o_proj + add",
        "gate/up + SwiGLU",
        "down + add",
    ];
    let mut line =
        format!("persistent step's timeline, {blocks} blocks, us (step / barrier release):");
    let (mut total_step, mut total_release) = (0.0, 0.0);
    for k in 0..5 {
        let (a, r) = (median(steps[k].clone()), median(release[k].clone()));
        total_step += a;
        total_release += r;
        line += &format!(" {} {a:.2} / {r:.2};", names[k]);
    }
    println!("{line} a layer {total_step:.2} / {total_release:.2}");
    fwd.set_persistent_timeline(false).unwrap();
    fwd.set_persistent(false);
    fwd.set_graphs(true);
}
