//! The diff of trees opened from their index's records in place
//! (`TreeReader::open`) against the diff of the same trees opened the owned
//! way (`TreeReader::open_owned`), and one of each: the same report, byte
//! for byte, for equal trees, one changed tap, other dtypes and shapes,
//! slots, prefill against decode, and with a truth.

mod support;

use capture::{DType, Entries, RunInfo, TreeReader};
use support::{is, opts, taps, write, Shape, Tap};

fn json(a: &TreeReader, b: &TreeReader, t: Option<&TreeReader>) -> Vec<u8> {
    let t = t.map(|t| t as &dyn diff::Tree);
    let r = diff::diff(a, b, t, &opts()).unwrap();
    let mut out = Vec::new();
    diff::render::json::write(&r, &mut out).unwrap();
    out
}

fn run() -> RunInfo {
    RunInfo {
        precision: "f32".into(),
        prompt_tokens: vec![1, 2, 3, 4],
        ..RunInfo::default()
    }
}

#[test]
fn trees_read_in_place_diff_as_their_owned_entries_do() {
    let dir = tempfile::tempdir().unwrap();
    let base = Shape::default();
    let f64s = Shape {
        dtype: DType::F64,
        ..Shape::default()
    };
    let batched = Shape {
        batched: true,
        ..Shape::default()
    };
    let slots = Shape {
        slots: vec![Some(0), Some(1)],
        ..Shape::default()
    };
    let changed = |t: &mut Tap| {
        if is(t, Some(1), "ffn_up") && t.key.pos.start == 2 {
            t.values[5] += 0.5;
        }
    };
    let wider = |t: &mut Tap| {
        if is(t, Some(2), "attn_out") {
            t.width += 1;
            t.values.push(0.25);
        }
    };
    let trees: Vec<(&str, Vec<Tap>)> = vec![
        ("a", taps(&base, |_| {})),
        ("same", taps(&base, |_| {})),
        ("changed", taps(&base, changed)),
        ("f64", taps(&f64s, |_| {})),
        ("prefill", taps(&batched, changed)),
        ("wider", taps(&base, wider)),
        ("slots", taps(&slots, |_| {})),
    ];
    let mut opened = Vec::new();
    for (name, taps) in &trees {
        let path = dir.path().join(name);
        write(&path, taps, run());
        let views = TreeReader::open(&path).unwrap();
        assert!(matches!(views.listing(), Entries::Records(_)), "{name}");
        opened.push((views, TreeReader::open_owned(&path).unwrap()));
    }
    let (a, a_owned) = &opened[0];
    for (i, (b, b_owned)) in opened.iter().enumerate() {
        let name = trees[i].0;
        let want = json(a_owned, b_owned, None);
        assert_eq!(json(a, b, None), want, "{name}");
        assert_eq!(json(a, b_owned, None), want, "{name}, B owned");
        assert_eq!(
            json(b_owned, a, None),
            json(b_owned, a_owned, None),
            "{name}, A owned"
        );
    }
    // With a truth (read at each row's worst position).
    let (t, t_owned) = &opened[3];
    let (c, c_owned) = &opened[2];
    assert_eq!(json(a, c, Some(t)), json(a_owned, c_owned, Some(t_owned)));
}
