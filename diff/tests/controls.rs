//! The controls on fixture trees (SELF, PERTURBED, a failed control), and
//! the renderers agreeing on the first divergence.

mod support;

use diff::controls::{self, At};
use diff::render::finding;
use diff::report::{DiffOutcome, Finding};
use support::{is, opts, propagated, taps, MemTree, Shape};

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
                assert!(c.passed(), "{at:?}: {}", finding(&c.finding));
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
        assert!(c.passed(), "{}: {}", c.name().as_str(), finding(&c.finding));
    }
    // Default PERTURBED target: the middle of the forward.
    let mid = controls::middle(&a).unwrap();
    assert_eq!(mid.layer, Some(1));
    assert!(
        matches!(&all[1].finding, Finding::PlantedNamed { at }
            if at.layer == Some(1) && at.stage == mid.stage && at.pos.start == mid.pos.unwrap()),
        "{}",
        finding(&all[1].finding)
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
