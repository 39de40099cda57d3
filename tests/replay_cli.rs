//! `taptree replay` end to end: on the fixture models (every op of an f32
//! tree recomputes bit for bit in f32; a q8 tree's matmuls carry local
//! error, its norms and adds none; a planted single-op change is named
//! exactly; what cannot be replayed is exit 2), and where it is cached or
//! under CI on SmolLM2 and llama.cpp (per-op conformance of `--precision
//! llamacpp`).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::harness::clean::{code, fixture, run, text};
use crate::harness::{row_name, CAPTURE};

const TOKENS: &str = "0,75,108,35,104";

fn capture(model: &str, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "capture",
        "--model",
        model,
        "--tokens",
        TOKENS,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert_eq!(code(&o), 0, "{}", text(&o));
}

/// `taptree replay TREE --model M ARGS --json`: its exit code and report.
pub(crate) fn replay_json(tree: &Path, model: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["replay", tree.to_str().unwrap(), "--model", model, "--json"];
    args.extend_from_slice(extra);
    let o = run(&args);
    let c = code(&o);
    assert!(c == 0 || c == 1, "exit {c}: {}", text(&o));
    (c, serde_json::from_slice(&o.stdout).expect("JSON report"))
}

pub(crate) fn rows(report: &Value) -> &Vec<Value> {
    report["rows"].as_array().unwrap()
}

fn err(row: &Value) -> f64 {
    row["local_error"].as_f64().unwrap_or(f64::INFINITY)
}

pub(crate) const MATMULS: [&str; 8] = [
    "q_proj", "k_proj", "v_proj", "o_proj", "ffn_gate", "ffn_up", "ffn_down", "logits",
];

fn is_matmul(row: &Value) -> bool {
    MATMULS.contains(&row["stage"].as_str().unwrap())
}

#[test]
fn every_op_of_an_f32_tree_recomputes_bit_for_bit_in_f32_and_within_tolerance_in_f64() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let tree = d.path().join("f32");
    // A prefill and three decode steps: decode attention reads the keys of
    // the prefill tap and of the earlier steps.
    capture(&m, &tree, &["--gen", "3"]);
    let (c, r) = replay_json(&tree, &m, &["--precision", "f32"]);
    assert_eq!(c, 0);
    let n_stages = 1 + 15 * 3 + 2;
    assert_eq!(rows(&r).len(), n_stages);
    for row in rows(&r) {
        assert_eq!(err(row), 0.0, "{}: {row}", row_name(row));
        assert_eq!(row["whole"]["bitwise_equal"], row["whole"]["n"], "{row}");
        assert_eq!(row["positions"], 7, "{}", row_name(row));
    }
    // In f64 every op is within tolerance but not exact: f32 rounding.
    let (c, r) = replay_json(&tree, &m, &[]);
    assert_eq!(c, 0, "{r}");
    assert_eq!(r["precision"], "f64");
    assert!(rows(&r).iter().all(|row| err(row) < 1e-5), "{r}");
    assert!(rows(&r)
        .iter()
        .filter(|r| is_matmul(r))
        .all(|row| err(row) > 0.0));
    // The red case: the same tree held to a tolerance below f32's rounding.
    let (c, r) = replay_json(&tree, &m, &["--tolerance", "1e-9"]);
    assert_eq!(c, 1);
    assert!(r["rows_above"].as_u64().unwrap() > 0);
}

#[test]
fn a_q8_trees_matmuls_carry_local_error_and_its_norms_and_adds_none() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let tree = d.path().join("q8");
    capture(&m, &tree, &["--precision", "q8", "--gen", "2"]);
    let (c, r) = replay_json(&tree, &m, &[]);
    assert_eq!(c, 1, "q8 matmuls must be above the default tolerance");
    for row in rows(&r) {
        if is_matmul(row) {
            assert!(
                row["above"].as_bool().unwrap(),
                "{}: {}",
                row_name(row),
                err(row)
            );
            assert!(err(row) > 1e-4, "{}: {}", row_name(row), err(row));
        } else {
            // Norms, RoPE, attention, SwiGLU, adds: f32 rounding only.
            assert!(err(row) < 1e-6, "{}: {}", row_name(row), err(row));
        }
    }
    let largest = &rows(&r)[r["largest"].as_u64().unwrap() as usize];
    assert!(is_matmul(largest), "{largest}");
    // Replayed in q8 arithmetic, the q8 tree conforms exactly.
    let (c, r) = replay_json(&tree, &m, &["--precision", "q8"]);
    assert_eq!(c, 0, "{r}");
    assert!(rows(&r).iter().all(|row| err(row) == 0.0), "{r}");
}

/// The tree at `orig` with `L{layer}/attn` of its first tap recomputed with
/// its attention scores scaled by `scale` (the query scaled), and every op
/// after it in forward order recomputed in f32 from the changed values, as
/// a forward with that one op changed would have computed them: written to
/// `out`.
fn plant_attention_scale(model_file: &str, orig: &Path, out: &Path, layer: u32, scale: f32) {
    use capture::{Capture, CaptureOptions, Selection, TreeReader};
    use kernels::cpu::attention::{attention, Heads};
    use kernels::cpu::weights::DenseWeights;
    use replay::ops::{Arith, Ops};
    use replay::taps::Taps;

    let tree = TreeReader::open(orig).unwrap();
    let model = model::load::load_model(model_file).unwrap();
    let dense = DenseWeights::new(&model.weights).unwrap();
    let cfg = &model.weights.config;
    let m = tree.manifest().clone();
    let mut taps = Taps::load(&tree, false).unwrap();
    let ops = Ops::new(cfg, &dense, &m.run, orig.to_path_buf(), Arith::F32).unwrap();
    let at = m
        .entries
        .iter()
        .position(|e| e.key.stage == "attn" && e.key.layer == Some(layer))
        .unwrap();
    let k = &m.entries[at].key;
    let (pos, li) = (k.pos.start..k.pos.end, Some(layer));
    let (q_w, kv_w) = (cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim);
    let mut q = taps
        .get::<f32>(("q_rope", li, None), pos.clone(), q_w, "plant")
        .unwrap();
    q.iter_mut().for_each(|x| *x *= scale);
    let kk = taps
        .get::<f32>(("k_rope", li, None), 0..pos.end, kv_w, "plant")
        .unwrap();
    let v = taps
        .get::<f32>(("v_proj", li, None), 0..pos.end, kv_w, "plant")
        .unwrap();
    let heads = Heads {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
    };
    let a = attention(&q, pos.len(), pos.start as usize, &kk, &v, heads);
    let wide: Vec<f64> = a.iter().map(|x| *x as f64).collect();
    taps.overwrite(&("attn".into(), li, None), pos, &wide);
    for e in &m.entries[at + 1..] {
        let k = &e.key;
        let pos = k.pos.start..k.pos.end;
        let v = ops
            .recompute(&taps, &k.stage, k.layer, k.slot, pos.clone())
            .unwrap();
        taps.overwrite(&(k.stage.clone(), k.layer, k.slot), pos, &v);
    }
    let _one = CAPTURE.lock().unwrap_or_else(|e| e.into_inner());
    let cap = Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: false,
        stages: m.stages.clone(),
        run: m.run.clone(),
    })
    .unwrap();
    for e in &m.entries {
        let k = &e.key;
        let pos = k.pos.start..k.pos.end;
        let width: usize = e.shape[1..].iter().product();
        let v = taps
            .get::<f32>((&k.stage, k.layer, k.slot), pos.clone(), width, "write")
            .unwrap();
        capture::tap(&k.stage, k.layer, pos, k.slot, &e.shape, &v);
    }
    cap.finish().unwrap();
}

#[test]
fn a_planted_attention_change_is_named_exactly_where_the_diff_blames_a_later_op() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let orig = d.path().join("f32");
    capture(&m, &orig, &["--gen", "2"]);
    // L0's attention scores 1.2% sharper; everything after it follows.
    let planted = d.path().join("planted");
    plant_attention_scale(&m, &orig, &planted, 0, 1.012);
    let (c, r) = replay_json(&orig, &m, &[]);
    assert_eq!(c, 0, "the unchanged tree: {r}");
    let (c, r) = replay_json(&planted, &m, &[]);
    assert_eq!(c, 1);
    let above: Vec<String> = rows(&r)
        .iter()
        .filter(|row| row["above"].as_bool().unwrap())
        .map(row_name)
        .collect();
    assert_eq!(
        above,
        ["L0/attn"],
        "replay must name exactly the planted op"
    );
    let largest = &rows(&r)[r["largest"].as_u64().unwrap() as usize];
    assert_eq!(row_name(largest), "L0/attn");
    // Every op downstream inherited the change and carries none of its own.
    assert!(rows(&r)
        .iter()
        .filter(|row| row_name(row) != "L0/attn")
        .all(|row| err(row) < 1e-6));
    // The diff's threshold lets the planted op through and blames an op
    // 22 rows later, where the inherited error grew past it.
    let o = run(&["diff", orig.to_str().unwrap(), planted.to_str().unwrap()]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    let t = text(&o);
    let blamed = t
        .lines()
        .find_map(|l| l.strip_prefix("first diverging op: "))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(blamed.starts_with("L1/ffn_down"), "{blamed}");
    eprintln!("$ taptree diff f32 planted\n{t}");
    // The table says it too, and the HTML report marks it.
    let html = d.path().join("replay.html");
    let o = run(&[
        "replay",
        planted.to_str().unwrap(),
        "--model",
        &m,
        "--html",
        html.to_str().unwrap(),
    ]);
    eprintln!("$ taptree replay planted --model tiny-q.gguf\n{}", text(&o));
    assert_eq!(code(&o), 1);
    assert!(
        text(&o).contains("largest local error: L0/attn "),
        "{}",
        text(&o)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("1 of 48 ops above 1.0e-4 local error; largest L0/attn"));
    assert!(page.contains("largest local error (4.0"), "marker");
}

/// Exit 2, with `needle` in the message.
fn refused(args: &[&str], needle: &str) {
    let o = run(args);
    assert_eq!(code(&o), 2, "{args:?}: {}", text(&o));
    assert!(
        text(&o).contains(needle),
        "{args:?}: expected {needle:?} in {}",
        text(&o)
    );
}

#[test]
fn what_cannot_be_replayed_is_exit_2_naming_the_tap_and_why() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let other = fixtures::write("tiny-f32", &d.path().join("other"))
        .unwrap()
        .display()
        .to_string();
    let full = d.path().join("full");
    capture(&m, &full, &[]);
    let full_s = full.to_str().unwrap();
    // Another model than the one the tree ran.
    refused(
        &["replay", full_s, "--model", &other],
        "the tree was captured from a model with blake3",
    );
    // A tree holding ffn_down but not its input.
    let part = d.path().join("part");
    capture(&m, &part, &["--select", "stage=ffn_down"]);
    refused(
        &["replay", part.to_str().unwrap(), "--model", &m],
        "cannot replay L0/ffn_down@0..5: its input L0/ffn_swiglu@0 is not in the tree",
    );
    refused(
        &["replay", full_s, "--model", &m, "--precision", "f16"],
        "--precision: bad value \"f16\"",
    );
    refused(
        &["replay", full_s, "--model", &m, "--select", "stage=nothing"],
        "no tap matches the selection",
    );
    refused(
        &[
            "replay",
            d.path().join("absent").to_str().unwrap(),
            "--model",
            &m,
        ],
        "absent",
    );
    // A stage with no computation, and a layout nobody knows.
    let odd = d.path().join("odd");
    write_tree(
        &odd,
        &full,
        |stages, _| {
            stages.push(capture::StageSpec::layer("my_op", &["attn"]));
        },
        Some("my_op"),
    );
    refused(
        &["replay", odd.to_str().unwrap(), "--model", &m],
        "stage my_op (per layer) has no defined computation for a llama model",
    );
    // ... which --select leaves out.
    let o = run(&[
        "replay",
        odd.to_str().unwrap(),
        "--model",
        &m,
        "--select",
        "stage=attn_norm,q_proj",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let lay = d.path().join("layout");
    write_tree(
        &lay,
        &full,
        |stages, _| {
            let q = stages.iter_mut().find(|s| s.name == "q_proj").unwrap();
            q.layout
                .insert("rotary".into(), serde_json::json!("diagonal"));
        },
        None,
    );
    refused(
        &["replay", lay.to_str().unwrap(), "--model", &m],
        "stage q_proj: rotary \"diagonal\"",
    );
}

/// A tree may hold a tap at the format's last position (a writer takes
/// it): replay keeps each tap's own rows, not one row for every position
/// before the last, so such a tree costs its taps' bytes, not the
/// gigabytes sixteen million rows of keys would take (it was refused by
/// the allocator; here, under a 1 GiB limit on the address space).
#[test]
fn a_tap_at_the_last_position_costs_its_rows_not_every_row_before_it() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let full = d.path().join("full");
    capture(&m, &full, &[]);
    let width = capture::TreeReader::open(&full)
        .unwrap()
        .entries()
        .iter()
        .find(|e| e.key.stage == "k_rope")
        .unwrap()
        .shape[1];
    let last = capture::manifest::MAX_POSITION;
    // The same taps, and one more: L1's keys at the last position.
    let with_far = d.path().join("with-far");
    write_tree_and(
        &with_far,
        &full,
        |_| {},
        || {
            let row = vec![0.5f32; width];
            capture::tap("k_rope", Some(1), last - 1..last, None, &[1, width], &row);
        },
    );
    let limited = |args: &[&str]| {
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_taptree"))
            .args(args)
            .output()
            .unwrap()
    };
    let tree = with_far.to_str().unwrap();
    let o = limited(&["replay", tree, "--model", &m, "--select", "stage=attn_norm"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Its own replay needs the keys' input there, which no tap holds.
    let o = limited(&["replay", tree, "--model", &m, "--select", "stage=k_rope"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "cannot replay L1/k_rope@{}: its input L1/k_proj@{} is not in the tree",
            last - 1,
            last - 1
        )),
        "{}",
        text(&o)
    );
}

/// A tap of no width in a stage declared half-split is exit 2 naming it
/// (its rows were put in interleaved order in chunks of no values: a
/// panic).
#[test]
fn a_tap_of_no_width_in_a_half_split_stage_is_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let full = d.path().join("full");
    capture(&m, &full, &[]);
    let odd = d.path().join("odd");
    let half_split = |stages: &mut Vec<capture::StageSpec>| {
        let q = stages.iter_mut().find(|s| s.name == "q_proj").unwrap();
        q.layout.insert("rotary".into(), "half_split".into());
        q.layout.insert("head_dim".into(), 2.into());
    };
    write_tree_and(&odd, &full, half_split, || {
        capture::tap::<f32>("q_proj", Some(0), 100..101, None, &[1, 0], &[]);
    });
    refused(
        &["replay", odd.to_str().unwrap(), "--model", &m],
        "L0/q_proj@100",
    );
}

/// A copy of the tree at `from` written to `out` with its vocabulary
/// edited by `edit` and `more` tapped after its taps.
fn write_tree_and(
    out: &Path,
    from: &Path,
    edit: impl FnOnce(&mut Vec<capture::StageSpec>),
    more: impl FnOnce(),
) {
    use capture::{Capture, CaptureOptions, Selection, TreeReader};
    let tree = TreeReader::open(from).unwrap();
    let m = tree.manifest().clone();
    let mut stages = m.stages.clone();
    edit(&mut stages);
    let _one = CAPTURE.lock().unwrap_or_else(|e| e.into_inner());
    let cap = Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: false,
        stages,
        run: m.run.clone(),
    })
    .unwrap();
    for e in &m.entries {
        let v: Vec<f32> = (tree.read(e).unwrap().to_f64().iter())
            .map(|x| *x as f32)
            .collect();
        let k = &e.key;
        capture::tap(&k.stage, k.layer, k.pos.clone(), k.slot, &e.shape, &v);
    }
    more();
    cap.finish().unwrap();
}

/// A copy of the tree at `from` written to `out` with its vocabulary
/// edited, plus (with `extra`) one tap of that stage at L0.
pub(crate) fn write_tree(
    out: &Path,
    from: &Path,
    edit: impl FnOnce(&mut Vec<capture::StageSpec>, &mut capture::RunInfo),
    extra: Option<&str>,
) {
    use capture::{Capture, CaptureOptions, Selection, TreeReader};
    let tree = TreeReader::open(from).unwrap();
    let m = tree.manifest().clone();
    let (mut stages, mut run) = (m.stages.clone(), m.run.clone());
    edit(&mut stages, &mut run);
    let _one = CAPTURE.lock().unwrap_or_else(|e| e.into_inner());
    let cap = Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: false,
        stages,
        run,
    })
    .unwrap();
    for e in &m.entries {
        let v: Vec<f32> = tree
            .read(e)
            .unwrap()
            .to_f64()
            .iter()
            .map(|x| *x as f32)
            .collect();
        let k = &e.key;
        capture::tap(&k.stage, k.layer, k.pos.clone(), k.slot, &e.shape, &v);
    }
    if let Some(stage) = extra {
        capture::tap(stage, Some(0), 0..1, None, &[1, 2], &[1.0f32, 2.0]);
    }
    cap.finish().unwrap();
}

#[test]
fn every_op_of_a_gemma3_tree_recomputes_bit_for_bit_in_f32_and_within_tolerance_in_f64() {
    // q/k norms, post norms, GeGLU, RoPE over halves with two bases,
    // sliding-window attention, the scaled embedding: each alone.
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("gemma");
    let o = run(&[
        "capture",
        "--model",
        "gemma3-270m",
        "--prompt",
        "The capital of France is",
        "--gen",
        "2",
        "--out",
        tree.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let (c, r) = replay_json(&tree, "gemma3-270m", &["--precision", "f32"]);
    assert_eq!(c, 0);
    assert_eq!(rows(&r).len(), 1 + 19 * 18 + 2);
    for row in rows(&r) {
        assert_eq!(err(row), 0.0, "{}: {row}", row_name(row));
    }
    let (c, r) = replay_json(&tree, "gemma3-270m", &[]);
    assert_eq!(c, 0, "{r}");
    assert!(rows(&r).iter().all(|row| err(row) < 1e-5), "{r}");
    // llama.cpp's Gemma arithmetic is modelled: not refused, and this f32
    // tree is not llama.cpp's (its matmuls saw no Q8_K activations): red.
    let (c, r) = replay_json(&tree, "gemma3-270m", &["--precision", "llamacpp"]);
    assert_eq!(c, 1, "{r}");
    assert!(rows(&r).iter().any(|row| err(row) > 1e-4), "{r}");
}

#[test]
fn a_hugging_face_tree_replays_with_its_half_split_layout_reconciled() {
    let ready = Command::new("python3")
        .args([
            "-c",
            "import torch, transformers, numpy, safetensors, blake3",
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ready {
        let why = "python3 with torch and transformers is not available (bash scripts/test.sh installs them)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why}; CI requires it"
        );
        eprintln!("skipping: {why}");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let hf = fixtures::write_hf("tiny-q", d.path()).unwrap();
    let m = hf.to_str().unwrap();
    let tree = d.path().join("hf");
    capture(m, &tree, &["--engine", "hf", "--gen", "2"]);
    let (c, r) = replay_json(&tree, m, &[]);
    assert_eq!(c, 0, "{r}");
    assert_eq!(
        r["reconciled"],
        serde_json::json!(["q_proj", "k_proj", "q_rope", "k_rope"])
    );
    assert!(rows(&r).iter().all(|row| err(row) < 1e-5), "{r}");
    // The red case: the same taps without the declaration are in the wrong
    // pair order for the model's RoPE.
    let undeclared = d.path().join("undeclared");
    write_tree(
        &undeclared,
        &tree,
        |stages, _| stages.iter_mut().for_each(|s| s.layout.clear()),
        None,
    );
    let (c, r) = replay_json(&undeclared, m, &[]);
    assert_eq!(c, 1);
    assert!(
        stages_above(&r).contains("q_rope"),
        "{:?}",
        stages_above(&r)
    );
}

pub(crate) fn stages_above(r: &Value) -> std::collections::BTreeSet<String> {
    rows(r)
        .iter()
        .filter(|row| row["above"].as_bool().unwrap())
        .map(|row| row["stage"].as_str().unwrap().to_string())
        .collect()
}
