//! The first divergence and its causes on fixture trees: origin against
//! inherited, error growth, the truth's verdict, degenerate agreement, and
//! the first-divergence rule as a property.

mod support;

use capture::DType;
use diff::controls;
use diff::report::{Cause, Closer, DiffOutcome, Side, Status};
use std::time::{Duration, Instant};
use support::{is, opts, propagated, taps, MemTree, Shape, Tap};

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
    let v = controls::fixture_validity(&[(Side::A, &a), (Side::B, &b)]).unwrap();
    assert!(!v.passed());
    assert_eq!(v.flagged().len(), 4 * 2);
    assert_eq!(v.flagged()[0].key.to_string(), "L1/v_proj@0");
    let clean = MemTree::new("c", taps(&Shape::default(), |_| {}));
    assert!(controls::fixture_validity(&[(Side::A, &clean)])
        .unwrap()
        .passed());
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
    let v = controls::fixture_validity(&[(Side::A, &a)]).unwrap();
    let found: Vec<String> = v
        .flagged()
        .iter()
        .map(|f| format!("{} {}", f.key, f.what))
        .collect();
    // Capture order is forward order: a decode tree finishes position 0
    // (logits@0) before it reaches position 3.
    assert_eq!(found, ["logits@0 all nonfinite", "L0/ffn_up@3 constant"]);
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

/// Layers far apart (0 and 65,535, the format's last) with none between: a
/// row's inputs are looked for through the run of layers no tap carries as
/// a whole, so the diff costs its taps, not the 65,534 layers between
/// (walked stage by stage for every row: seconds here, a minute in a debug
/// build); and the causes are those of adjacent layers.
#[test]
fn layers_far_apart_cost_their_taps_not_the_layers_between() {
    let last = capture::manifest::MAX_LAYER;
    let shape = Shape {
        layers: 2,
        ..Shape::default()
    };
    let far = |t: &mut Tap| {
        if t.key.layer == Some(1) {
            t.key.layer = Some(last);
        }
    };
    let a = MemTree::new("a", taps(&shape, far));
    let b = MemTree::new(
        "b",
        taps(&shape, |t| {
            far(t);
            if is(t, Some(0), "post_ffn_residual") || is(t, Some(last), "attn_norm") {
                t.values[0] += 1.0;
            }
        }),
    );
    let start = Instant::now();
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    let controls = controls::run(&a, &b, &opts(), None).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(controls.len(), 3);
    let row = |name: &str| r.rows.iter().find(|row| row.name() == name).unwrap();
    assert_eq!(row("L0/post_ffn_residual").cause, Some(Cause::Origin));
    // L65535 reads L0 as layer 1 would: through post_ffn_residual@prev.
    assert_eq!(
        row(&format!("L{last}/attn_norm")).cause,
        Some(Cause::Inherited {
            from: vec!["L0/post_ffn_residual".parse().unwrap()]
        })
    );
}

/// A vocabulary of many thousand stages (a hostile one: 60,000 global
/// stages, each read by the next) costs its size: the two trees'
/// vocabularies are merged by name through a set, and the graph finds the
/// stages after the layers in one pass (each stage of B was looked for in
/// A's growing list, and each pass over the vocabulary found one more).
#[test]
fn a_vocabulary_of_many_stages_costs_its_size() {
    let n = 60_000;
    let mut stages = support::llama();
    stages.extend((0..n).map(|i| {
        let input = match i + 1 == n {
            true => "post_ffn_residual@last".to_string(),
            false => format!("g{}", i + 1),
        };
        capture::StageSpec::global(&format!("g{i}"), &[input.as_str()])
    }));
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = propagated(1, "ffn_up", 0.1).with_stages(stages);
    let start = Instant::now();
    let r = diff::diff(&a, &b, None, &opts()).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let first = r.first_divergence.unwrap();
    assert_eq!(r.rows[first].name(), "L1/ffn_up");
}
