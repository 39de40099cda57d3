//! Comparing trees of different engines without false alarms: declared
//! layouts reconciled, prompts compared (`--align` for an extra BOS), mixed
//! float dtypes, the truth on every row and a truth that is not all f64
//! refused. Each feature has a case that must go red.

use capture::{Capture, CaptureOptions, RunInfo, Selection, TapElem};
use std::path::Path;
use std::process::{Command, Output};

use crate::harness::{text, CAPTURE};

const HEAD_DIM: usize = 8;
const HEADS: usize = 2;
const WIDTH: usize = HEAD_DIM * HEADS;

fn value(stage: &str, pos: u32, i: usize) -> f64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for b in stage.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h ^= ((pos as u64) << 20) ^ i as u64;
    h = (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 29)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((h >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
}

/// A row in half-split rotary order (heads of `head_dim`) from one in
/// interleaved order.
fn half_split(row: &[f64], head_dim: usize) -> Vec<f64> {
    let half = head_dim / 2;
    let mut out = vec![0.0; row.len()];
    for h in 0..row.len() / head_dim {
        for i in 0..half {
            for j in 0..2 {
                out[h * head_dim + j * half + i] = row[h * head_dim + 2 * i + j];
            }
        }
    }
    out
}

/// How one fixture run differs from the reference.
struct Run<'a> {
    /// Its input tokens; the taps cover one position per token.
    tokens: &'a [u32],
    /// Which stages it lays out half-split, and whether it declares it;
    /// the head size of both.
    half_split: bool,
    declare: bool,
    head_dim: usize,
    precision: &'a str,
    extra: serde_json::Value,
    /// (stage, pos, values) -> values, applied last.
    edit: &'a dyn Fn(&str, u32, &mut Vec<f64>),
}

impl Default for Run<'_> {
    fn default() -> Self {
        Run {
            tokens: &[1, 2, 3, 4],
            half_split: false,
            declare: false,
            head_dim: HEAD_DIM,
            precision: "f32",
            extra: serde_json::json!({}),
            edit: &|_, _, _| {},
        }
    }
}

/// Writes a tree of one layer: embedding, attn_norm, q_proj, q_rope, attn,
/// logits. Position `p` holds the value of token `tokens[p]`'s position in
/// the reference prompt [1, 2, 3, 4] (so a shifted prompt holds shifted rows).
fn write<T: TapElem>(out: &Path, run: &Run, convert: impl Fn(f64) -> T) {
    let _turn = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
    let mut stages = kernels::stages::llama();
    if run.declare {
        for s in stages.iter_mut() {
            if ["q_proj", "k_proj", "q_rope", "k_rope"].contains(&s.name.as_str()) {
                s.layout = [
                    ("rotary".to_string(), serde_json::json!("half_split")),
                    ("head_dim".to_string(), serde_json::json!(run.head_dim)),
                ]
                .into_iter()
                .collect();
            }
        }
    }
    let extra = run.extra.as_object().cloned().unwrap_or_default();
    let cap = Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: true,
        stages,
        run: RunInfo {
            model: "fixture".into(),
            backend: "test".into(),
            precision: run.precision.into(),
            prompt_tokens: run.tokens.to_vec(),
            extra: extra.into_iter().collect(),
            ..Default::default()
        },
    })
    .unwrap();
    let n = run.tokens.len() as u32;
    for (stage, layer) in [
        ("embedding", None),
        ("attn_norm", Some(0)),
        ("q_proj", Some(0)),
        ("q_rope", Some(0)),
        ("attn", Some(0)),
        ("logits", None),
    ] {
        let mut data = Vec::new();
        for p in 0..n {
            // The reference position of this token (token t sits at t - 1).
            let at = run.tokens[p as usize].saturating_sub(1);
            let mut row: Vec<f64> = (0..WIDTH).map(|i| value(stage, at, i)).collect();
            if run.half_split && (stage == "q_proj" || stage == "q_rope") {
                row = half_split(&row, run.head_dim);
            }
            (run.edit)(stage, p, &mut row);
            data.extend(row.into_iter().map(&convert));
        }
        capture::tap(stage, layer, 0..n, None, &[n as usize, WIDTH], &data);
    }
    cap.finish().unwrap();
}

fn f32s(out: &Path, run: &Run) {
    write(out, run, |x| x as f32);
}

fn taptree(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_taptree"))
        .args(args.iter().map(|a| a.as_ref()))
        .args(["--color", "never"])
        .output()
        .unwrap()
}

#[test]
fn declared_layouts_are_reconciled_on_either_side() {
    let d = tempfile::tempdir().unwrap();
    let (il, hs) = (d.path().join("interleaved"), d.path().join("half"));
    f32s(&il, &Run::default());
    f32s(
        &hs,
        &Run {
            half_split: true,
            declare: true,
            ..Default::default()
        },
    );
    for (a, b) in [(&il, &hs), (&hs, &il)] {
        let o = taptree(&[&"diff", a, b]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}{err}");
        assert!(
            out.contains(
                "declared layouts reconciled: q_proj, q_rope compared in interleaved rotary order"
            ),
            "{out}"
        );
        assert!(
            out.contains("bitwise equal by content: 24 positions in 6 rows"),
            "{out}"
        );
    }
    // Both half-split: nothing to reconcile, identical.
    let o = taptree(&[&"diff", &hs, &hs]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o).0.contains("bitwise identical"));
    // Both half-split, over heads of other sizes: each is reconciled with
    // its own head size (compared as they lie, the two orders disagreed).
    let quarter = d.path().join("half-4");
    f32s(
        &quarter,
        &Run {
            half_split: true,
            declare: true,
            head_dim: HEAD_DIM / 2,
            ..Default::default()
        },
    );
    let o = taptree(&[&"diff", &hs, &quarter]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("declared layouts reconciled: q_proj, q_rope"),
        "{out}"
    );
}

#[test]
fn an_undeclared_layout_is_red_with_a_layout_hint() {
    let d = tempfile::tempdir().unwrap();
    let (il, hs) = (d.path().join("interleaved"), d.path().join("half"));
    f32s(&il, &Run::default());
    f32s(
        &hs,
        &Run {
            half_split: true,
            declare: false,
            ..Default::default()
        },
    );
    let o = taptree(&[&"diff", &il, &hs]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("first diverging op: L0/q_proj@"), "{out}");
    assert!(
        out.contains("layout? cos") && out.contains("while L0/attn (which reads it) agrees"),
        "{out}"
    );
    // A declared layout that the data does not have is red too.
    let wrong = d.path().join("wrong");
    f32s(
        &wrong,
        &Run {
            half_split: false,
            declare: true,
            ..Default::default()
        },
    );
    let o = taptree(&[&"diff", &il, &wrong]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
}

#[test]
fn shifted_prompts_exit_2_and_align_lines_them_up() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    f32s(&a, &Run::default());
    // B was fed an extra BOS (token 1 twice): its rows are A's, one later.
    f32s(
        &b,
        &Run {
            tokens: &[1, 1, 2, 3, 4],
            ..Default::default()
        },
    );
    let o = taptree(&[&"diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains("first differing token at position 1: A has 2, B has 1")
            && err.contains("the prompts agree under --align 1"),
        "{err}"
    );
    let o = taptree(&[&"diff", &a, &b, &"--align", &"1"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("aligned: position p of A is compared with position p+1 of B"),
        "{out}"
    );
    assert!(out.contains("24 positions in 6 rows"), "{out}");
    let o = taptree(&[&"diff", &b, &a, &"--align", &"-1"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    // Aligned, a real difference is still found.
    let c = d.path().join("c");
    f32s(
        &c,
        &Run {
            tokens: &[1, 1, 2, 3, 4],
            edit: &|stage, p, v| {
                if stage == "attn" && p == 3 {
                    v[5] += 1.0;
                }
            },
            ..Default::default()
        },
    );
    let o = taptree(&[&"diff", &a, &c, &"--align", &"1"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("first diverging op: L0/attn@2"), "{out}");
    // A wrong shift compares other prompts: exit 2.
    let o = taptree(&[&"diff", &a, &b, &"--align", &"2"]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
}

#[test]
fn mixed_float_dtypes_compare_in_f64() {
    let d = tempfile::tempdir().unwrap();
    let (f64s, f32t, bf16t) = (
        d.path().join("f64"),
        d.path().join("f32"),
        d.path().join("bf16"),
    );
    write(&f64s, &Run::default(), |x| x);
    f32s(&f32t, &Run::default());
    write(&bf16t, &Run::default(), |x| {
        capture::half::bf16::from_f64(x)
    });
    for (a, b) in [
        (&f64s, &f32t),
        (&f32t, &f64s),
        (&f32t, &bf16t),
        (&bf16t, &f64s),
    ] {
        let o = taptree(&[&"diff", a, b]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}{err}");
        assert!(
            !out.contains("MISMATCH") && !out.contains("dtype mismatch"),
            "{out}"
        );
    }
    // A real difference across dtypes is red, and says so by value.
    let bad = d.path().join("bad");
    f32s(
        &bad,
        &Run {
            edit: &|stage, p, v| {
                if stage == "q_rope" && p == 1 {
                    v.iter_mut().for_each(|x| *x = -*x);
                }
            },
            ..Default::default()
        },
    );
    let o = taptree(&[&"diff", &f64s, &bad]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("first diverging op: L0/q_rope@1"), "{out}");
    assert!(!out.contains("dtype mismatch"), "{out}");
}

/// A truth, and A and B that differ from it by `a` and `b` (relative) noise.
fn truth_trio(d: &Path, a_noise: f64, b_noise: f64) -> [std::path::PathBuf; 3] {
    let (a, b, t) = (d.join("a"), d.join("b"), d.join("t"));
    write(
        &t,
        &Run {
            precision: "f64",
            ..Default::default()
        },
        |x| x,
    );
    for (out, noise) in [(&a, a_noise), (&b, b_noise)] {
        f32s(
            out,
            &Run {
                edit: &move |stage, p, v| {
                    for (i, x) in v.iter_mut().enumerate() {
                        *x += noise * value(&format!("noise{stage}"), p, i);
                    }
                },
                ..Default::default()
            },
        );
    }
    [a, b, t]
}

#[test]
fn the_truth_judges_every_row_green_ones_too() {
    let d = tempfile::tempdir().unwrap();
    let [a, b, t] = truth_trio(d.path(), 1e-6, 1e-4);
    let o = taptree(&[&"diff", &a, &b, &"--truth", &t]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("within tolerance"), "{out}");
    let green_rows_with_a_closer = out
        .lines()
        .filter(|l| l.contains(" ok ") && l.contains(" A<"))
        .count();
    assert_eq!(green_rows_with_a_closer, 6, "{out}");
    assert!(
        out.contains("truth over every row: A is closer to T in 6 rows, B in 0, neither clearly in 0 (of 6 rows"),
        "{out}"
    );
    // The other way round, B is closer everywhere.
    let o = taptree(&[&"diff", &b, &a, &"--truth", &t]);
    let (out, _) = text(&o);
    assert!(out.contains("A is closer to T in 0 rows, B in 6"), "{out}");
}

#[test]
fn a_truth_that_is_not_all_f64_is_refused_unless_forced() {
    let d = tempfile::tempdir().unwrap();
    let [a, b, _] = truth_trio(d.path(), 1e-6, 1e-4);
    // An f32 tree as truth.
    let o = taptree(&[&"diff", &a, &b, &"--truth", &a]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains("not a truth: its precision is \"f32\", not f64"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    let o = taptree(&[&"diff", &a, &b, &"--truth", &a, &"--force-truth"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    // "f64" whose engine says some ops ran in float32 (Hugging Face's RMSNorm).
    let hf = d.path().join("hf64");
    write(
        &hf,
        &Run {
            precision: "f64",
            extra: serde_json::json!({
                "all_ops_f64": false,
                "float32_islands": ["RMSNorm (LlamaRMSNorm) computes in float32"]
            }),
            ..Default::default()
        },
        |x| x,
    );
    let o = taptree(&[&"diff", &a, &b, &"--truth", &hf]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "its engine reports ops outside f64: RMSNorm (LlamaRMSNorm) computes in float32"
        ),
        "{err}"
    );
    // f64 by name, f32 taps.
    let liar = d.path().join("liar");
    f32s(
        &liar,
        &Run {
            precision: "f64",
            ..Default::default()
        },
    );
    let o = taptree(&[&"diff", &a, &b, &"--truth", &liar]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("is F32, not F64"), "{:?}", text(&o));
}
