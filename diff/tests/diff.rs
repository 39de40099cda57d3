//! The diff on fixture trees: identity, matching, the first divergence,
//! origin vs inherited, error growth, truth, controls, degenerate taps.

mod support;

use capture::DType;
use diff::controls::{self, At};
use diff::report::{Cause, Closer, DiffOutcome, Status};
use diff::{Options, Tolerance};
use support::{taps, MemTree, Shape, Tap};

fn opts() -> Options<'static> {
    Options::default()
}

fn is(t: &Tap, layer: Option<u32>, stage: &str) -> bool {
    t.key.layer == layer && t.key.stage == stage
}

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
    assert_eq!(r.only_in_a, vec!["L1/ffn_gate@3".to_string()]);
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
        first.reasons.iter().any(|s| s.starts_with("nmse=")),
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
    assert!(first.reasons[0].contains("nonfinite mismatch"));
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
        .map(|row| (row.name(), row.reasons[0].clone()))
        .collect();
    assert_eq!(red.len(), 2, "{red:?}");
    assert_eq!(red[0].0, "L1/k_proj");
    assert!(red[0].1.starts_with("dtype mismatch: F32 vs I32"));
    let q = r.rows.iter().find(|row| row.name() == "L1/q_proj").unwrap();
    assert_eq!(q.status, Status::Pass, "{:?}", q.reasons);
    assert_eq!(red[1].0, "L2/v_proj");
    assert!(red[1].1.starts_with("shape mismatch"));
    assert_eq!(r.outcome, DiffOutcome::Diverged);
}

/// A change at `at` that every later op carries (scaled), like a real bug.
fn propagated(layer: u32, stage: &str, factor: f64) -> MemTree {
    let start = support::forward_index(3, Some(layer), stage);
    MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            let i = support::forward_index(3, t.key.layer, &t.key.stage);
            if i >= start {
                let k = t.values.len();
                for (j, v) in t.values.iter_mut().enumerate() {
                    // Orthogonal-ish noise growing downstream.
                    *v += factor
                        * (1.0 + (i - start) as f64 * 0.1)
                        * support::value("noise", None, 0, None, j % k);
                }
            }
        }),
    )
}

#[test]
fn downstream_red_is_inherited_and_never_the_first_divergence() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = propagated(1, "ffn_up", 0.1);
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    let first = r.first_divergence.unwrap();
    assert_eq!(r.rows[first].name(), "L1/ffn_up");
    assert_eq!(r.rows[first].cause, Some(Cause::Origin));
    assert!(r.rows[..first].iter().all(|row| !row.status.is_red()));
    let swiglu = r
        .rows
        .iter()
        .find(|row| row.name() == "L1/ffn_swiglu")
        .unwrap();
    assert_eq!(
        swiglu.cause,
        Some(Cause::Inherited {
            from: vec!["L1/ffn_up".parse().unwrap()]
        })
    );
    let next_norm = r
        .rows
        .iter()
        .find(|row| row.name() == "L2/attn_norm")
        .unwrap();
    assert_eq!(
        next_norm.cause,
        Some(Cause::Inherited {
            from: vec!["L1/post_ffn_residual".parse().unwrap()]
        })
    );
    // L1/ffn_gate comes before the change and is untouched: green.
    assert_eq!(
        r.rows
            .iter()
            .find(|row| row.name() == "L1/ffn_gate")
            .unwrap()
            .status,
        Status::Equal
    );
}

#[test]
fn error_growth_ranks_the_jump_above_the_first_small_error() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    // Small error from L0/q_proj on (the first matmul of a quantized path),
    // then a jump at L2/ffn_down (one crushed block).
    let start = support::forward_index(3, Some(0), "q_proj");
    let jump = support::forward_index(3, Some(2), "ffn_down");
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            let i = support::forward_index(3, t.key.layer, &t.key.stage);
            let amount = if i >= jump {
                0.3
            } else if i >= start {
                0.02
            } else {
                0.0
            };
            for (j, v) in t.values.iter_mut().enumerate() {
                *v += amount * support::value("noise", None, t.key.pos.start, None, j);
            }
        }),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(r.rows[r.first_divergence.unwrap()].name(), "L0/q_proj");
    let top = &r.rows[r.growth_ranking[0]];
    assert_eq!(top.name(), "L2/ffn_down");
    let g = top.growth.as_ref().unwrap();
    assert!(g.delta > 0.25 && g.ratio > 5.0, "{g:?}");
}

#[test]
fn truth_names_the_inaccurate_side() {
    let exact = taps(&Shape::default(), |_| {});
    let t = MemTree::new("t", taps(&Shape::default(), |t| t.dtype = DType::F64));
    let a = MemTree::new("a", exact);
    let b = propagated(2, "ffn_down", 0.05);
    let r = diff::diff(&a, &b, Some(&t), &opts()).unwrap();
    let first = &r.rows[r.first_divergence.unwrap()];
    assert_eq!(first.name(), "L2/ffn_down");
    let v = first.truth.as_ref().unwrap();
    assert_eq!(v.closer, Closer::A, "{v:?}");
    assert!(v.error_a < 1e-6 && v.error_b > 1e-2, "{v:?}");
    // And the other way round.
    let r = diff::diff(&b, &a, Some(&t), &opts()).unwrap();
    let first = &r.rows[r.first_divergence.unwrap()];
    assert_eq!(first.truth.as_ref().unwrap().closer, Closer::B);
    let text = diff::render::table::render(&r, &Default::default());
    assert!(
        text.contains("truth: A is the inaccurate side at L2/ffn_down@"),
        "{text}"
    );
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
fn degenerate_agreement_is_not_agreement() {
    let zero = |t: &mut Tap| {
        if is(t, Some(1), "v_proj") {
            t.values.iter_mut().for_each(|v| *v = 0.0);
        }
    };
    let a = MemTree::new("a", taps(&Shape::default(), zero));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            zero(t);
            // Different bits, equal values: the row is read, and agrees.
            if is(t, Some(1), "v_proj") && t.key.pos.start == 0 {
                t.values[0] = -0.0;
            }
        }),
    );
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    let row = r.rows.iter().find(|row| row.name() == "L1/v_proj").unwrap();
    assert_eq!(row.status, Status::Degenerate);
    assert_eq!(r.outcome, DiffOutcome::Inconclusive);
    let v = controls::fixture_validity(&[("A", &a), ("B", &b)]).unwrap();
    assert!(!v.passed);
    assert_eq!(v.flagged.len(), 4 * 2);
    assert_eq!(v.flagged[0].key, "L1/v_proj@0");
    let clean = MemTree::new("c", taps(&Shape::default(), |_| {}));
    assert!(controls::fixture_validity(&[("A", &clean)]).unwrap().passed);
}

#[test]
fn constant_and_nonfinite_taps_are_flagged() {
    let a = MemTree::new(
        "a",
        taps(&Shape::default(), |t| {
            if is(t, Some(0), "ffn_up") && t.key.pos.start == 3 {
                t.values.iter_mut().for_each(|v| *v = 0.25);
            }
            if is(t, None, "logits") && t.key.pos.start == 0 {
                t.values.iter_mut().for_each(|v| *v = f64::NAN);
            }
        }),
    );
    let v = controls::fixture_validity(&[("A", &a)]).unwrap();
    let found: Vec<String> = v
        .flagged
        .iter()
        .map(|f| format!("{} {}", f.key, f.what))
        .collect();
    // Capture order is forward order: a decode tree finishes position 0
    // (logits@0) before it reaches position 3.
    assert_eq!(found, ["logits@0 all nonfinite", "L0/ffn_up@3 constant"]);
}

#[test]
fn perturbed_control_names_every_stage_exactly() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    for spec in support::llama() {
        let layers: Vec<Option<u32>> = match spec.scope {
            capture::Scope::Layer => vec![Some(0), Some(1), Some(2)],
            capture::Scope::Global => vec![None],
        };
        for layer in layers {
            for pos in [0, 3] {
                let at = At {
                    layer,
                    stage: spec.name.clone(),
                    pos: Some(pos),
                    slot: None,
                };
                let c = controls::perturbed(&a, &opts(), Some(&at)).unwrap();
                assert!(c.passed, "{at:?}: {}", c.detail);
            }
        }
    }
}

#[test]
fn perturbed_planted_on_disk_trees_names_every_stage_exactly() {
    // The same, with real trees through the reader: B is A with one row changed.
    let dir = tempfile::tempdir().unwrap();
    let shape = Shape {
        layers: 2,
        positions: 2,
        ..Shape::default()
    };
    let a_path = dir.path().join("a");
    support::write(&a_path, &taps(&shape, |_| {}), Default::default());
    let a = capture::TreeReader::open(&a_path).unwrap();
    for spec in support::llama() {
        let layer = (spec.scope == capture::Scope::Layer).then_some(1);
        let b_path = dir.path().join("b");
        support::write(
            &b_path,
            &taps(&shape, |t| {
                if is(t, layer, &spec.name) && t.key.pos.start == 1 {
                    t.values[3] = 7.0;
                }
            }),
            Default::default(),
        );
        let b = capture::TreeReader::open(&b_path).unwrap();
        let r = diff::diff(&a, &b, None, &opts()).unwrap();
        let first = &r.rows[r.first_divergence.unwrap()];
        let name = match layer {
            Some(l) => format!("L{l}/{}", spec.name),
            None => spec.name.clone(),
        };
        assert_eq!((first.name(), first.worst().pos), (name, 1));
        assert_eq!(r.counts.rows_red, 1);
        assert_eq!(r.counts.taps_compared, 1);
    }
}

#[test]
fn self_and_default_perturbed_controls_pass_on_a_sound_tree() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let all = controls::run(&a, &a, &opts(), None).unwrap();
    for c in &all {
        assert!(c.passed, "{}: {}", c.name, c.detail);
    }
    // Default PERTURBED target: the middle of the forward.
    let mid = controls::middle(&a).unwrap();
    assert_eq!(mid.layer, Some(1));
    assert!(
        all[1].detail.contains(&format!("L1/{}", mid.stage)),
        "{}",
        all[1].detail
    );
}

#[test]
fn a_failed_control_makes_the_outcome_could_not_compare() {
    let a = MemTree::new(
        "a",
        taps(&Shape::default(), |t| {
            if is(t, Some(0), "q_proj") {
                t.values.iter_mut().for_each(|v| *v = 0.0);
            }
        }),
    );
    let b = MemTree::new("b", taps(&Shape::default(), |_| {}));
    let mut r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert_eq!(r.outcome, DiffOutcome::Diverged);
    let c = controls::run(&a, &b, &opts(), None).unwrap();
    controls::attach(&mut r, c);
    assert_eq!(r.outcome, DiffOutcome::ControlFailed);
}

#[test]
fn renderers_agree_on_the_first_divergence() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = propagated(1, "attn", 0.1);
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    let table = diff::render::table::render(&r, &Default::default());
    assert!(table.contains("first diverging op: L1/attn@"), "{table}");
    assert!(!table.contains("\x1b["), "no color unless asked");
    let json: serde_json::Value = serde_json::from_str(&diff::render::json::render(&r)).unwrap();
    let i = json["first_divergence"].as_u64().unwrap() as usize;
    assert_eq!(json["rows"][i]["stage"], "attn");
    assert_eq!(json["rows"][i]["layer"], 1);
    assert_eq!(json["outcome"], "diverged");
    let html = diff::render::html::render(&r);
    assert!(html.starts_with("<!doctype html>") && html.contains("first diverging op: L1/attn@"));
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

mod first_divergence_rule {
    use super::*;
    use proptest::prelude::*;

    /// Rows of the fixture vocabulary: (layer, stage) for 3 layers.
    fn rows() -> Vec<(Option<u32>, String)> {
        let mut v = Vec::new();
        for spec in support::llama() {
            match spec.scope {
                capture::Scope::Layer => (0..3).for_each(|l| v.push((Some(l), spec.name.clone()))),
                capture::Scope::Global => v.push((None, spec.name.clone())),
            }
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Planted changes anywhere: the first divergence is the earliest
        /// planted row in forward order, whatever is red after it, and the red
        /// rows are exactly the planted ones.
        #[test]
        fn the_earliest_red_row_wins(
            picks in prop::collection::btree_set((0usize..48, 0u32..4), 1..5),
        ) {
            let all = rows();
            let planted: Vec<(Option<u32>, String, u32)> = picks
                .iter()
                .map(|&(r, p)| (all[r].0, all[r].1.clone(), p))
                .collect();
            let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
            let b = MemTree::new(
                "b",
                taps(&Shape::default(), |t| {
                    for (l, s, p) in &planted {
                        if is(t, *l, s) && t.key.pos.start == *p {
                            t.values[1] += 1.0;
                        }
                    }
                }),
            );
            let r = diff::diff(&a, &b, None, &opts()).unwrap();
            let earliest = planted
                .iter()
                .min_by_key(|(l, s, _)| support::forward_index(3, *l, s))
                .unwrap();
            let first = &r.rows[r.first_divergence.unwrap()];
            prop_assert_eq!((first.layer, first.stage.clone()), (earliest.0, earliest.1.clone()));
            prop_assert_eq!(first.cause.clone(), Some(Cause::Origin));
            let red: std::collections::BTreeSet<(Option<u32>, String)> = r
                .rows
                .iter()
                .filter(|row| row.status.is_red())
                .map(|row| (row.layer, row.stage.clone()))
                .collect();
            let want: std::collections::BTreeSet<(Option<u32>, String)> =
                planted.iter().map(|(l, s, _)| (*l, s.clone())).collect();
            prop_assert_eq!(red, want);
        }
    }
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
