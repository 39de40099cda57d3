//! Writes the trees of scripts/bench_diff.sh through the capture API:
//! `A` (the reference), `B` (every tap slightly different: the full-metric
//! throughput case) and `C` (A with 1% of its taps different: the hash-skip
//! case), each about `MB` megabytes of f32.
//!
//! cargo run --release -p diff --example bench_trees -- OUT_DIR [MB]

use capture::{Capture, CaptureOptions, RunInfo, Scope, Selection, StageSpec};
use std::path::Path;

const LAYERS: u32 = 30;
const ROWS_PER_TAP: u32 = 8;
const WIDTH: usize = 2048;

fn vocab() -> Vec<StageSpec> {
    let layer = [
        "attn_norm",
        "q_proj",
        "k_proj",
        "v_proj",
        "q_rope",
        "k_rope",
        "attn",
        "o_proj",
        "post_attn_residual",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_swiglu",
        "ffn_down",
        "post_ffn_residual",
    ];
    let mut v = vec![StageSpec::global("embedding", &[])];
    v.extend(layer.iter().map(|s| StageSpec::layer(s, &[])));
    v.push(StageSpec::global("final_norm", &["post_ffn_residual@last"]));
    v.push(StageSpec::global("logits", &["final_norm"]));
    v
}

fn write(out: &Path, positions: u32, change: impl Fn(usize) -> f32) -> u64 {
    let stages = vocab();
    let cap = Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: true,
        stages: stages.clone(),
        run: RunInfo {
            model: "bench".into(),
            ..Default::default()
        },
    })
    .expect("capture starts");
    let mut order: Vec<(&str, Option<u32>)> = vec![("embedding", None)];
    for l in 0..LAYERS {
        for s in stages.iter().filter(|s| s.scope == Scope::Layer) {
            order.push((&s.name, Some(l)));
        }
    }
    order.push(("final_norm", None));
    order.push(("logits", None));
    let mut tap_index = 0usize;
    let mut buf = vec![0f32; ROWS_PER_TAP as usize * WIDTH];
    for start in (0..positions).step_by(ROWS_PER_TAP as usize) {
        for &(stage, layer) in &order {
            let eps = change(tap_index);
            let seed = (tap_index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for (i, x) in buf.iter_mut().enumerate() {
                let h = (seed ^ i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
                let v = ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                // A deterministic relative wobble where the tap is to differ.
                *x = v * (1.0 + eps * (((h >> 20) & 0xff) as f32 / 255.0 - 0.5));
            }
            capture::tap(
                stage,
                layer,
                start..start + ROWS_PER_TAP,
                None,
                &[ROWS_PER_TAP as usize, WIDTH],
                &buf,
            );
            tap_index += 1;
        }
    }
    cap.finish().expect("capture finishes").bytes
}

fn main() {
    let mut args = std::env::args().skip(1);
    let out = args.next().expect("usage: bench_trees OUT_DIR [MB]");
    let mb: u64 = args
        .next()
        .map_or(1024, |s| s.parse().expect("MB is a number"));
    let per_position = (LAYERS as u64 * 15 + 3) * WIDTH as u64 * 4;
    let positions = ((mb << 20) / per_position).max(1) as u32;
    let positions = positions.div_ceil(ROWS_PER_TAP) * ROWS_PER_TAP;
    let out = Path::new(&out);
    let a = write(&out.join("A"), positions, |_| 0.0);
    let b = write(&out.join("B"), positions, |_| 1e-3);
    // One tap in a hundred differs.
    let c = write(&out.join("C"), positions, |i| {
        if i % 100 == 37 {
            1e-3
        } else {
            0.0
        }
    });
    println!("A {a} bytes, B {b} bytes, C {c} bytes, {positions} positions");
}
