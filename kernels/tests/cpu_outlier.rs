//! The planted massive activation: on `tiny-outlier`, the `q8` tree departs
//! from `f32` first at a matmul fed by the outlier token (position 0), while
//! `f32` stays close to the `f64` truth there.
//!
//! One test function: a process arms one capture at a time.

use capture::{Capture, CaptureOptions, RunInfo, Selection, TreeReader};
use fixtures::{OUTLIER_DIM, OUTLIER_TOKEN, OUTLIER_VALUE};
use kernels::cpu::CpuForward;
use kernels::switches::Switches;
use kernels::{stages, Forward, Precision};
use std::path::Path;

/// BOS (the outlier token) then a few bytes.
const PROMPT: [u32; 6] = [OUTLIER_TOKEN, 87, 111, 114, 108, 100];

fn capture_run(dir: &Path, name: &str, precision: Precision) -> TreeReader {
    let out = dir.join(name);
    let cap = Capture::start(CaptureOptions {
        out: out.clone(),
        selection: Selection::all(),
        force: false,
        stages: stages::llama(),
        run: RunInfo {
            precision: precision.name().into(),
            ..Default::default()
        },
    })
    .unwrap();
    let w = fixtures::weights("tiny-outlier").unwrap();
    let mut f = CpuForward::new(&w, precision, &Switches::none()).unwrap();
    f.forward(None, &PROMPT, 0).unwrap();
    cap.finish().unwrap();
    TreeReader::open(&out).unwrap()
}

/// Cosine of each row (position) of two `[rows, width]` taps.
fn row_cosines(a: &[f64], b: &[f64], width: usize) -> Vec<f64> {
    a.chunks_exact(width)
        .zip(b.chunks_exact(width))
        .map(|(x, y)| {
            let dot: f64 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            let nx = x.iter().map(|p| p * p).sum::<f64>().sqrt();
            let ny = y.iter().map(|q| q * q).sum::<f64>().sqrt();
            if nx == 0.0 && ny == 0.0 {
                1.0
            } else {
                dot / (nx * ny)
            }
        })
        .collect()
}

/// The first tap, in forward order, whose worst row cosine falls below
/// `min_cos`: (index, worst row, its cosine).
fn first_departure(a: &TreeReader, b: &TreeReader, min_cos: f64) -> Option<(usize, usize, f64)> {
    for (i, (ea, eb)) in a.entries().iter().zip(b.entries()).enumerate() {
        assert_eq!(ea.key, eb.key, "trees in different order");
        let width = *ea.shape.last().unwrap();
        let cos = row_cosines(
            &a.read(ea).unwrap().to_f64(),
            &b.read(eb).unwrap().to_f64(),
            width,
        );
        let (row, worst) = cos
            .iter()
            .enumerate()
            .min_by(|x, y| x.1.total_cmp(y.1))
            .map(|(r, c)| (r, *c))
            .unwrap();
        if worst < min_cos {
            return Some((i, row, worst));
        }
    }
    None
}

#[test]
fn q8_departs_first_at_a_matmul_fed_by_the_outlier_and_f32_tracks_f64() {
    let d = tempfile::tempdir().unwrap();
    let f32_tree = capture_run(d.path(), "f32", Precision::F32);
    let again = capture_run(d.path(), "f32-again", Precision::F32);
    let q8_tree = capture_run(d.path(), "q8", Precision::Q8);
    let f64_tree = capture_run(d.path(), "f64", Precision::F64);

    // The comparator sees no departure between two f32 runs (they are
    // bitwise identical) ...
    assert_eq!(f32_tree.root(), again.root());
    assert_eq!(first_departure(&f32_tree, &again, 0.999), None);

    // ... and the outlier is really there: position 0 of the embedding.
    let emb = f32_tree.read(&f32_tree.entries()[0]).unwrap().to_f64();
    assert_eq!(emb[OUTLIER_DIM], OUTLIER_VALUE as f64);

    // q8 departs first at a layer-0 projection, at the outlier's position.
    let (i, row, cos) =
        first_departure(&f32_tree, &q8_tree, 0.999).expect("q8 must depart from f32");
    let key = &f32_tree.entries()[i].key;
    assert!(
        ["q_proj", "k_proj", "v_proj"].contains(&key.stage.as_str()) && key.layer == Some(0),
        "first departure at {key}, expected a layer-0 attention projection"
    );
    assert_eq!(
        row, 0,
        "worst at position {row}, expected the outlier's position 0"
    );
    assert!(
        cos < 0.95,
        "{key}: q8 cosine {cos} at position 0: crushing should be severe"
    );
    // Everything before it is untouched by q8 (norms and embedding are not matmuls).
    for e in &f32_tree.entries()[..i] {
        let q = q8_tree.entries().iter().find(|x| x.key == e.key).unwrap();
        assert_eq!(
            e.blake3, q.blake3,
            "{}: changed before the first quantized matmul",
            e.key
        );
    }

    // There, f32 is within rounding of the f64 truth, and q8 is the wrong side.
    let width = *f32_tree.entries()[i].shape.last().unwrap();
    let f = f32_tree.read(&f32_tree.entries()[i]).unwrap().to_f64();
    let t = f64_tree.read(&f64_tree.entries()[i]).unwrap().to_f64();
    let q = q8_tree.read(&q8_tree.entries()[i]).unwrap().to_f64();
    let f32_vs_truth = row_cosines(&f, &t, width);
    assert!(
        f32_vs_truth.iter().all(|c| *c > 0.99999),
        "f32 vs f64 at {key}: {f32_vs_truth:?}"
    );
    assert!(row_cosines(&q, &t, width)[0] < 0.95);
    // And the f64 tree is really f64.
    assert_ne!(f32_tree.root(), f64_tree.root());
}
