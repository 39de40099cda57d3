//! The diff on fixture trees: identity, matching taps cut differently,
//! skipping by hash, tolerance, dtype and shape mismatches, slots, and
//! where the runs' input tokens part. The first divergence and its causes
//! are in `divergence.rs`, the controls in `controls.rs`.

mod support;

use capture::DType;
use diff::report::{Cause, Closer, DiffOutcome, Reason, Status};
use diff::{Options, Tolerance};
use support::{is, opts, taps, MemTree, Shape, Tap};

#[test]
fn equal_roots_are_identical_without_rows() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new("b", taps(&Shape::default(), |_| {}));
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(r.outcome, DiffOutcome::Identical);
    assert!(r.rows.is_empty());
    assert!(
        diff::render::summary(&r).starts_with("bitwise identical: "),
        "{}",
        diff::render::summary(&r)
    );
}

#[test]
fn batched_prefill_tree_diffs_against_decode_tree_per_position() {
    let decode = MemTree::new("decode", taps(&Shape::default(), |_| {}));
    let shape = Shape {
        batched: true,
        ..Shape::default()
    };
    let prefill = MemTree::new("prefill", taps(&shape, |_| {}));
    let r = diff::diff(&prefill, &decode, None, &opts()).unwrap();
    assert_eq!(
        r.outcome,
        DiffOutcome::WithinTolerance,
        "{}",
        diff::render::summary(&r)
    );
    // 3 layers x 15 stages + 3 globals, 4 positions each.
    assert_eq!(r.rows.len(), 48);
    assert_eq!(r.counts.positions, 48 * 4);
    assert!(r.rows.iter().all(|row| row.status == Status::Equal));
    assert!(r.only_in_a.is_empty() && r.only_in_b.is_empty());
    // Forward order: embedding, the layers, then final_norm and logits.
    assert_eq!(r.rows[0].name(), "embedding");
    assert_eq!(r.rows[1].name(), "L0/attn_norm");
    assert_eq!(r.rows[46].name(), "final_norm");
    assert_eq!(r.rows[47].name(), "logits");
}

/// The decode fixture's one-position taps joined into taps that start at
/// `starts` (a chunked prefill): each tap's rows are its positions in order.
fn chunked(starts: &[u32], edit: impl FnMut(&mut Tap)) -> Vec<Tap> {
    let mut out: Vec<Tap> = Vec::new();
    for t in taps(&Shape::default(), edit) {
        let p = t.key.pos.start;
        let joins = out.iter_mut().rev().find(|o| {
            o.key.stage == t.key.stage && o.key.layer == t.key.layer && o.key.slot == t.key.slot
        });
        match joins {
            Some(o) if !starts.contains(&p) => {
                assert_eq!(o.key.pos.end, p, "decode taps come in position order");
                o.key.pos.end = p + 1;
                o.values.extend(t.values);
            }
            _ => out.push(t),
        }
    }
    // Capture order is by first position, as a chunked prefill taps.
    out.sort_by_key(|t| t.key.pos.start);
    out
}

#[test]
fn taps_cut_at_different_positions_are_matched_position_by_position() {
    let a = MemTree::new("a", chunked(&[0, 3], |_| {}));
    let b = MemTree::new("b", chunked(&[0, 1], |_| {}));
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(
        r.outcome,
        DiffOutcome::WithinTolerance,
        "{}",
        diff::render::summary(&r)
    );
    assert_eq!(r.counts.positions, 48 * 4);
    assert!(r.rows.iter().all(|row| row.status == Status::Equal));
    assert!(r.only_in_a.is_empty() && r.only_in_b.is_empty());

    // One changed value at position 2, inside B's tap of positions 1..4 and
    // A's of 0..3: named at that position, and only those taps are read.
    let b = MemTree::new(
        "b",
        chunked(&[0, 1], |t| {
            if is(t, Some(2), "o_proj") && t.key.pos.start == 2 {
                t.values[1] -= 0.25;
            }
        }),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(
        r.outcome,
        DiffOutcome::Diverged,
        "{}",
        diff::render::summary(&r)
    );
    let first = &r.rows[r.first_divergence.unwrap()];
    assert_eq!((first.name().as_str(), first.worst().pos), ("L2/o_proj", 2));
    assert_eq!(first.positions.len(), 4);
    let red: Vec<u32> = first
        .positions
        .iter()
        .filter(|p| !p.pass)
        .map(|p| p.pos)
        .collect();
    assert_eq!(red, vec![2]);
    // Taps of other positions have hashes of other bytes: every one is read.
    assert_eq!(r.counts.taps_compared as usize, a.manifest_len());

    // B without position 3 of one stage: listed once, the rest compared.
    let mut short = chunked(&[0, 1], |_| {});
    let t = short
        .iter_mut()
        .find(|t| is(t, Some(1), "ffn_gate") && t.key.pos.start == 1)
        .unwrap();
    t.key.pos.end = 3;
    t.values.truncate(2 * t.width);
    let r = diff::diff(&a, &MemTree::new("b", short), None, &opts()).unwrap();
    assert_eq!(r.only_in_a, vec!["L1/ffn_gate@3".parse().unwrap()]);
    assert!(r.only_in_b.is_empty());
    assert_eq!(r.counts.positions, 48 * 4 - 1);
}

#[test]
fn one_changed_tap_is_named_and_every_other_tap_is_skipped_unread() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            if is(t, Some(1), "ffn_up") && t.key.pos.start == 2 {
                t.values[5] += 0.5;
            }
        }),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(r.outcome, DiffOutcome::Diverged);
    let first = &r.rows[r.first_divergence.unwrap()];
    assert_eq!(first.name(), "L1/ffn_up");
    assert_eq!(first.worst().pos, 2);
    assert_eq!(first.cause, Some(Cause::Origin));
    assert_eq!(r.counts.taps_compared, 1);
    assert_eq!(r.counts.taps_skipped as usize, a.manifest_len() - 1);
    assert!((first.worst().metrics.max_abs - 0.5).abs() < 1e-6);
    // Only the position read is listed; the three equal by hash are runs,
    // and the row's total still counts all four.
    assert_eq!(first.positions.len(), 1);
    assert!(first.is_equal_at(0, None) && first.is_equal_at(3, None));
    assert!(!first.is_equal_at(2, None));
    assert_eq!(first.total.rows, 4);
}

#[test]
fn an_input_equal_by_hash_at_a_position_carries_no_error_there() {
    // L1/ffn_up differs at position 2 only; L1/ffn_swiglu (which reads it)
    // at position 0 only. At position 0 ffn_up is equal by hash: the error
    // swiglu carries there is all its own.
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            let at = t.key.pos.start;
            if (is(t, Some(1), "ffn_up") && at == 2) || (is(t, Some(1), "ffn_swiglu") && at == 0) {
                t.values[3] += 0.5;
            }
        }),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    let swiglu = r
        .rows
        .iter()
        .find(|row| row.name() == "L1/ffn_swiglu")
        .unwrap();
    let g = swiglu.growth.as_ref().unwrap();
    assert_eq!(g.pos, 0);
    assert_eq!(g.input_error, 0.0, "{g:?}");
    assert_eq!(g.delta, g.output_error);
}

trait Len {
    fn manifest_len(&self) -> usize;
}
impl Len for MemTree {
    fn manifest_len(&self) -> usize {
        diff::Tree::manifest(self).entries.len()
    }
}

#[test]
fn a_three_percent_scale_error_fails_the_default_but_not_cosine_alone() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            if is(t, Some(2), "o_proj") {
                t.values.iter_mut().for_each(|v| *v *= 1.03);
            }
        }),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    let first = &r.rows[r.first_divergence.expect("3% scale must be red")];
    assert_eq!(first.name(), "L2/o_proj");
    assert!(first.worst().metrics.cos > 0.999_999);
    assert!(
        first
            .reasons
            .iter()
            .any(|s| diff::render::reason(s).starts_with("nmse=")),
        "{:?}",
        first.reasons
    );

    let cos_only = Options {
        tolerance: Tolerance::parse("cos>=0.999").unwrap(),
        ..opts()
    };
    let r = diff::diff(&a, &b, None, &cos_only).unwrap();
    assert_eq!(
        r.outcome,
        DiffOutcome::WithinTolerance,
        "cosine is blind to scale"
    );
}

#[test]
fn nan_mismatch_is_red_under_any_tolerance() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            if is(t, Some(0), "attn") && t.key.pos.start == 1 {
                t.values[0] = f64::NAN;
            }
        }),
    );
    let loose = Options {
        tolerance: Tolerance::parse("cos>=-1 | abs<=1e30").unwrap(),
        ..opts()
    };
    let r = diff::diff(&a, &b, None, &loose).unwrap();
    let first = &r.rows[r.first_divergence.unwrap()];
    assert_eq!((first.name().as_str(), first.worst().pos), ("L0/attn", 1));
    assert!(diff::render::reason(&first.reasons[0]).contains("nonfinite mismatch"));
}

#[test]
fn dtype_and_shape_mismatches_are_never_green() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            if is(t, Some(1), "k_proj") {
                t.dtype = DType::I32;
            }
            // Float dtypes are compared by value, in f64.
            if is(t, Some(1), "q_proj") {
                t.dtype = DType::F16;
            }
            if is(t, Some(2), "v_proj") {
                t.values.push(0.0);
                t.width += 1;
            }
        }),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    let red: Vec<_> = r
        .rows
        .iter()
        .filter(|row| row.status == Status::Mismatch)
        .map(|row| (row.name(), diff::render::reason(&row.reasons[0])))
        .collect();
    // The report holds the values; the renderers word them.
    let k = r.rows.iter().find(|row| row.name() == "L1/k_proj").unwrap();
    assert_eq!(
        k.reasons,
        [Reason::DtypeMismatch {
            a: DType::F32,
            b: DType::I32
        }]
    );
    assert_eq!(red.len(), 2, "{red:?}");
    assert_eq!(red[0].0, "L1/k_proj");
    assert!(red[0].1.starts_with("dtype mismatch: F32 vs I32"));
    let q = r.rows.iter().find(|row| row.name() == "L1/q_proj").unwrap();
    assert_eq!(q.status, Status::Pass, "{:?}", q.reasons);
    assert_eq!(red[1].0, "L2/v_proj");
    assert!(red[1].1.starts_with("shape mismatch"));
    assert_eq!(r.outcome, DiffOutcome::Diverged);
}

#[test]
fn slots_pair_with_a_lone_sequence() {
    let batch = Shape {
        slots: vec![Some(0), Some(1)],
        ..Shape::default()
    };
    let lone = Shape {
        slots: vec![None],
        ..Shape::default()
    };
    // The lone run computed sequence 1 of the batch: same values as slot 1.
    let a = MemTree::new("batch", taps(&batch, |_| {}));
    let b = MemTree::new(
        "lone",
        taps(&lone, |t| {
            let (stage, layer) = (t.key.stage.clone(), t.key.layer);
            for (j, v) in t.values.iter_mut().enumerate() {
                let p = t.key.pos.start + (j / t.width) as u32;
                *v = support::value(&stage, layer, p, Some(1), j % t.width);
            }
        }),
    );
    let by_default = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(by_default.counts.positions, 0, "slots match by default");
    assert_eq!(by_default.outcome, DiffOutcome::Inconclusive);
    let paired = Options {
        slot_a: Some(Some(1)),
        slot_b: Some(None),
        ..opts()
    };
    let r = diff::diff(&a, &b, None, &paired).unwrap();
    assert_eq!(
        r.outcome,
        DiffOutcome::WithinTolerance,
        "{}",
        diff::render::summary(&r)
    );
    assert_eq!(r.counts.positions, 48 * 4);
    let wrong = Options {
        slot_a: Some(Some(0)),
        slot_b: Some(None),
        ..opts()
    };
    let r = diff::diff(&a, &b, None, &wrong).unwrap();
    assert_eq!(r.rows[r.first_divergence.unwrap()].name(), "embedding");
    assert_eq!(r.rows[0].worst().slot, Some(0));
}

#[test]
fn positions_after_the_generated_tokens_part_are_not_compared() {
    let run = |generated: &[u32]| {
        let mut r = capture::RunInfo {
            prompt_tokens: vec![5, 6],
            ..Default::default()
        };
        r.extra
            .insert("generated_tokens".into(), serde_json::json!([generated]));
        r
    };
    // B picked another token at position 3 and computed other things from there.
    let a = MemTree::new("a", taps(&Shape::default(), |_| {})).with_run(run(&[7, 8, 9]));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            if t.key.pos.start == 3 {
                t.values.iter_mut().for_each(|v| *v = -*v);
            }
        }),
    )
    .with_run(run(&[7, 4, 9]));
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(
        r.outcome,
        DiffOutcome::WithinTolerance,
        "{}",
        diff::render::summary(&r)
    );
    let split = r.inputs_split.as_ref().unwrap();
    assert_eq!((split.pos, split.token_a, split.token_b), (3, 8, 4));
    assert_eq!(r.counts.positions_inputs_differ, 48);
    assert_eq!(r.counts.positions, 48 * 3);
    // Without the token record the same trees diverge at position 3.
    let (a, b) = (
        a.with_run(Default::default()),
        b.with_run(Default::default()),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(r.rows[r.first_divergence.unwrap()].worst().pos, 3);
}

#[test]
fn a_truth_fed_other_tokens_is_not_used_from_there_on() {
    let run = |generated: &[u32]| {
        let mut r = capture::RunInfo {
            prompt_tokens: vec![5, 6],
            ..Default::default()
        };
        r.extra
            .insert("generated_tokens".into(), serde_json::json!([generated]));
        r
    };
    let a = MemTree::new("a", taps(&Shape::default(), |_| {})).with_run(run(&[7, 8]));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            if is(t, Some(1), "attn") && t.key.pos.start == 3 {
                t.values[0] += 1.0;
            }
        }),
    )
    .with_run(run(&[7, 8]));
    // T generated another token at position 3: its position 3 is not a truth.
    let t = MemTree::new("t", taps(&Shape::default(), |_| {})).with_run(run(&[7, 9]));
    let r = diff::diff(&a, &b, Some(&t), &opts()).unwrap();
    let first = &r.rows[r.first_divergence.unwrap()];
    assert_eq!(first.name(), "L1/attn");
    assert_eq!(first.truth.as_ref().unwrap().closer, Closer::Unknown);
    let t = t.with_run(run(&[7, 8]));
    let r = diff::diff(&a, &b, Some(&t), &opts()).unwrap();
    let first = &r.rows[r.first_divergence.unwrap()];
    assert_eq!(first.truth.as_ref().unwrap().closer, Closer::A);
}
