//! `taptree diff` and `taptree stat` end to end: exit codes 0/1/2, the named
//! first divergence, JSON and HTML output, controls, truth, bad input.

use crate::diff_support::*;

#[test]
fn identical_trees_exit_0_bitwise_identical() {
    let (_d, a, b) = dirs();
    plain(&a);
    plain(&b);
    let o = taptree(&[&"diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("bitwise identical: 99 tensors"), "{out}");
}

#[test]
fn diverged_trees_exit_1_naming_the_first_op_and_position() {
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, pos, v| {
            if layer == Some(1) && pos == 2 && stage == "ffn_down" {
                v[7] += 3.0;
            }
            // Everything after it carries the error too.
            if layer == Some(1) && pos == 2 && stage == "post_ffn_residual" {
                v[7] += 3.0;
            }
        },
    );
    let o = taptree(&[&"diff", &a, &b, &"--color", &"never"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("first diverging op: L1/ffn_down@2 (origin)"),
        "{out}"
    );
    assert!(out.contains("inherited <- L1/ffn_down"), "{out}");
    assert!(out.contains("rows bitwise equal"), "{out}");
    assert!(!out.contains("\x1b["), "no color when not a terminal");

    let o = taptree(&[&"diff", &a, &b, &"--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"], "diverged");
    let i = v["first_divergence"].as_u64().unwrap() as usize;
    assert_eq!(v["rows"][i]["stage"], "ffn_down");
    assert_eq!(
        v["rows"][i]["positions"][v["rows"][i]["worst"].as_u64().unwrap() as usize]["pos"],
        2
    );
    assert_eq!(v["schema"], 1);
}

#[test]
fn only_red_never_calls_hidden_rows_within_tolerance_bitwise_equal() {
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, pos, v| {
            if layer == Some(1) && pos == 2 && stage == "ffn_down" {
                v[7] += 1e-3;
            }
        },
    );
    let o = taptree(&[&"diff", &a, &b, &"--only-red", &"--color", &"never"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    // One row differs inside tolerance: the folded line must say so rather
    // than count it among the bitwise-equal rows.
    assert!(out.contains("bitwise equal, 1 within tolerance"), "{out}");
    assert!(!out.contains(" rows bitwise equal\n"), "{out}");
}

#[test]
fn a_three_percent_magnitude_error_exits_1_with_the_default_tolerance() {
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, _, v| {
            if layer == Some(0) && stage == "attn" {
                v.iter_mut().for_each(|x| *x *= 1.03);
            }
        },
    );
    let o = taptree(&[&"diff", &a, &b]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o).0);
    let o = taptree(&[&"diff", &a, &b, &"-t", &"cos>=0.999"]);
    assert_eq!(o.status.code(), Some(0), "cosine alone is blind to scale");
}

#[test]
fn incomplete_missing_and_corrupt_trees_exit_2_naming_the_file() {
    let (d, a, b) = dirs();
    plain(&a);
    plain(&b);
    // Incomplete: no manifest.
    let inc = d.path().join("incomplete");
    std::fs::create_dir_all(inc.join("L000")).unwrap();
    std::fs::write(inc.join(".taptree"), "").unwrap();
    std::fs::write(inc.join("L000/attn.p0-1.safetensors"), b"junk").unwrap();
    let o = taptree(&[&"diff", &a, &inc]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("incomplete") && err.contains("incomplete capture"),
        "{err}"
    );
    // Missing.
    let o = taptree(&[&"diff", &a, &d.path().join("nope")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("nope"), "{}", text(&o).1);
    // Corrupt: a tap file of B truncated, in a tap that differs from A's.
    tree(
        &b,
        |x| x,
        |stage, layer, pos, v| {
            if layer == Some(0) && pos == 0 && stage == "q_proj" {
                v[0] = 9.0;
            }
        },
    );
    let f = b.join("L000/q_proj.p0-1.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len - 100).unwrap();
    let o = taptree(&[&"diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(err.contains("q_proj.p0-1.safetensors"), "{err}");
}

#[test]
fn bad_tolerance_exits_2_quoting_the_bad_part() {
    let (_d, a, _) = dirs();
    plain(&a);
    let o = taptree(&[&"diff", &a, &a, &"-t", &"cos>=0.999 & nsme<=1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("\"nsme<=1\""), "{}", text(&o).1);
}

#[test]
fn controls_pass_on_sound_trees_and_fail_on_degenerate_ones() {
    let (d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, _, v| {
            if layer == Some(1) && stage == "q_rope" {
                v[0] += 1e-6;
            }
        },
    );
    let o = taptree(&[&"diff", &a, &b, &"--controls"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("control SELF: passed"), "{out}");
    assert!(
        out.contains("control PERTURBED: passed: planted change at L1/"),
        "{out}"
    );
    assert!(out.contains("control FIXTURE VALIDITY: passed"), "{out}");
    let o = taptree(&[&"diff", &a, &b, &"--controls", &"--perturb-at", &"logits@1"]);
    assert!(text(&o)
        .0
        .contains("planted change at logits@1: named exactly"));

    // Both sides all zero at one tap: agreement that proves nothing.
    let (z1, z2) = (d.path().join("z1"), d.path().join("z2"));
    let zero = |stage: &str, layer: Option<u32>, _: u32, v: &mut Vec<f32>| {
        if layer == Some(0) && stage == "v_proj" {
            v.iter_mut().for_each(|x| *x = 0.0);
        }
    };
    tree(&z1, |x| x, zero);
    tree(
        &z2,
        |x| x,
        |s, l, p, v| {
            zero(s, l, p, v);
            if l == Some(1) && s == "ffn_up" {
                v[1] += 1e-7;
            }
        },
    );
    let o = taptree(&[&"diff", &z1, &z2, &"--controls"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("control FIXTURE VALIDITY: FAILED"), "{out}");
    assert!(out.contains("A L0/v_proj@0 is all zero"), "{out}");
}

#[test]
fn truth_names_the_inaccurate_side_and_html_is_written() {
    let (d, a, b) = dirs();
    let t = d.path().join("t");
    plain(&a);
    tree(&t, |x| x as f64, |_, _, _, _| {});
    tree(
        &b,
        |x| x,
        |stage, layer, _, v| {
            if layer == Some(1) && stage == "o_proj" {
                v.iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x += 0.05 * value("n", None, 0, i));
            }
        },
    );
    let html = d.path().join("report.html");
    let o = taptree(&[&"diff", &a, &b, &"--truth", &t, &"--html", &html, &"-m"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("truth: B is the inaccurate side at L1/o_proj@"),
        "{out}"
    );
    assert!(out.contains("sqnr dB"), "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<table class=\"heat\">") && page.contains("L1/o_proj"));
}

#[test]
fn stat_shows_the_crushed_block_of_a_massive_activation() {
    let (_d, a, _) = dirs();
    tree(
        &a,
        |x| x,
        |stage, layer, pos, v| {
            if layer == Some(1) && stage == "ffn_norm" && pos == 0 {
                v[260] = -3664.0;
            }
        },
    );
    let o = taptree(&[&"stat", &a, &"--at", &"L1/ffn_norm@0"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("L1/ffn_norm@"))
            .count(),
        1,
        "{out}"
    );
    assert!(out.contains("260:-3664"), "{out}");
    assert!(
        out.contains("1/2 x"),
        "one of two 256-blocks crushed: {out}"
    );
    let o = taptree(&[&"stat", &a, &"--at", &"L1/ffn_norm@1", &"--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["taps"][0]["positions"][0]["blocks"][0]["crushed"], 0);
    let o = taptree(&[&"stat", &a, &"--at", &"L9/ffn_norm"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("no tap \"L9/ffn_norm\""),
        "{}",
        text(&o).1
    );
}

#[test]
fn swapped_and_linked_tap_files_exit_2() {
    let (d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, _, v| {
            if layer == Some(0) && (stage == "q_proj" || stage == "k_proj") {
                v[0] += 1.0;
            }
        },
    );
    // Two files of B swapped: each header now disagrees with the manifest.
    let (q, k) = (
        b.join("L000/q_proj.p0-1.safetensors"),
        b.join("L000/k_proj.p0-1.safetensors"),
    );
    let tmp = d.path().join("swap");
    std::fs::rename(&q, &tmp).unwrap();
    std::fs::rename(&k, &q).unwrap();
    std::fs::rename(&tmp, &k).unwrap();
    let o = taptree(&[&"diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains("_proj.p0-1.safetensors") && err.contains("disagree"),
        "{err}"
    );

    // A tap file replaced by a link to a file outside the tree.
    tree(
        &b,
        |x| x,
        |stage, layer, _, v| {
            if layer == Some(0) && stage == "q_proj" {
                v[0] += 1.0;
            }
        },
    );
    let outside = d.path().join("outside.safetensors");
    std::fs::rename(&q, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &q).unwrap();
    let o = taptree(&[&"diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(err.contains("outside the tree"), "{err}");
}

/// Two real captures of a fixture model fed different prompts: by default
/// the diff compares only the positions before the inputs part (and agrees
/// there); `--all-positions` compares the rest too, and the first diverging
/// op is the embedding at the first different token.
#[test]
fn different_prompts_exit_2_unless_all_positions() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    for (out, tokens) in [(&a, "1,5,9,12"), (&b, "1,5,7,12")] {
        let o = taptree(&[
            &"capture",
            &"--model",
            &"tiny-q",
            &"--tokens",
            &tokens,
            &"--gen",
            &"0",
            &"--out",
            out,
        ]);
        assert!(o.status.success(), "{:?}", text(&o));
    }
    // Other prompts: nothing is compared, and the first differing token is named.
    let o = taptree(&[&"diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains(
            "fed different prompts: first differing token at position 2: A has 9, B has 7"
        ),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    let o = taptree(&[&"diff", &a, &b, &"--all-positions"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("first diverging op: embedding@2 (origin)"),
        "{out}"
    );
    assert!(
        out.contains("compared all the same (--all-positions)"),
        "{out}"
    );
}

#[test]
fn a_change_inside_tolerance_is_named_as_the_first_op_not_bitwise_equal() {
    // The real change (a scale, as 1/sqrt(d) against 1/sqrt(d+1)) is in
    // L0/q_rope, small enough to stay in tolerance; it leaves tolerance
    // only at L0/attn. That row's inputs already differ: never "origin".
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, _pos, v| {
            if layer == Some(0) && stage == "q_rope" {
                v.iter_mut().for_each(|x| *x *= 1.0 + 1e-6);
            }
            if layer == Some(0) && stage == "attn" {
                v.iter_mut().for_each(|x| *x *= 1.3);
            }
        },
    );
    let o = taptree(&[&"diff", &a, &b, &"--color", &"never"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("first diverging op: L0/attn@0 (grew past tolerance <- L0/q_rope"),
        "{out}"
    );
    assert!(
        out.contains("first op not bitwise equal: L0/q_rope"),
        "{out}"
    );
    assert!(!out.contains("(origin"), "{out}");
    let o = taptree(&[&"diff", &a, &b, &"--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let e = v["first_inexact"].as_u64().unwrap() as usize;
    assert_eq!(v["rows"][e]["stage"], "q_rope");
    let d = v["first_divergence"].as_u64().unwrap() as usize;
    assert_eq!(v["rows"][d]["cause"]["kind"], "grew_from");
}

#[test]
fn the_first_failing_position_is_named_not_only_the_worst() {
    // A decode-only bug from position 1 on, worse at position 2.
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, pos, v| {
            if layer == Some(1) && stage == "ffn_down" && pos >= 1 {
                v[3] += pos as f32;
            }
        },
    );
    let o = taptree(&[&"diff", &a, &b, &"--color", &"never"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("first diverging op: L1/ffn_down@1 (origin, worst @2)"),
        "{out}"
    );
    assert!(
        out.contains("first diverging op L1/ffn_down@1 (worst @2,"),
        "{out}"
    );
}

#[test]
fn taps_in_one_tree_only_are_never_agreement() {
    let (d, a, _) = dirs();
    plain(&a);
    // B lacks layer 1 (a capture that stopped early): what both hold is equal.
    let narrow = d.path().join("narrow");
    tree(&narrow, |x| x, |_, _, _, _| {});
    let reader = capture::TreeReader::open(&narrow).unwrap();
    let mut m = reader.manifest().clone();
    m.entries.retain(|e| e.key.layer != Some(1));
    (m.dirs, m.root) = m.hashes();
    let mut json = serde_json::to_value(&m).unwrap();
    json["taps"] = m.entries.len().into();
    json["bytes"] = m.bytes_of_entries().into();
    json["manifest_blake3"] = capture::manifest::UNSEALED.into();
    let mut bytes = serde_json::to_vec(&json).unwrap();
    capture::manifest::seal(&mut bytes);
    std::fs::write(narrow.join("manifest.json"), bytes).unwrap();
    capture::index::rewrite(&narrow).unwrap();
    let o = taptree(&[&"diff", &a, &narrow, &"--color", &"never"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("incomplete: the trees do not hold the same taps"),
        "{out}"
    );
    let o = taptree(&[&"diff", &a, &narrow, &"--common-only"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("bitwise equal by content"), "{out}");
}

/// `args` as each of the two binaries runs them (the front answers the
/// tree commands itself, `taptree-full` has them too), `A` and `B` standing
/// for the trees `a` and `b`.
fn in_both_binaries(args: &[&str], a: &Path, b: &Path) -> [Command; 2] {
    [
        env!("CARGO_BIN_EXE_taptree"),
        env!("CARGO_BIN_EXE_taptree-full"),
    ]
    .map(|bin| {
        let mut c = Command::new(bin);
        c.args(args.iter().map(|x| match *x {
            "A" => a.as_os_str(),
            "B" => b.as_os_str(),
            x => x.as_ref(),
        }));
        c
    })
}

/// stdout is a pipe whose reader went away (`taptree diff A B | head`):
/// the command ends quietly, and a verdict keeps its exit code, so that
/// `set -o pipefail` still sees a divergence.
#[test]
fn a_closed_pipe_ends_every_stdout_command_quietly_with_its_verdict() {
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |_, layer, _, v| {
            if layer == Some(1) {
                v[0] += 1.0;
            }
        },
    );
    let runs: [(&[&str], u8); 7] = [
        (&["ls", "A", "--json"], 0),
        (&["ls", "A"], 0),
        (&["diff", "A", "B", "--color", "never"], 1),
        (&["diff", "A", "B", "--json"], 1),
        (&["verify", "A", "B"], 1),
        (&["verify", "A", "B", "--json"], 1),
        (&["stat", "A"], 0),
    ];
    for (args, code) in runs {
        for mut c in in_both_binaries(args, &a, &b) {
            // The reading end is closed before the command starts: its
            // first write fails with a broken pipe, every time.
            let (reader, writer) = std::io::pipe().unwrap();
            drop(reader);
            let o = c.stdout(writer).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(i32::from(code)), "{c:?}: {err}");
            assert!(err.is_empty(), "{c:?}: {err}");
        }
    }
}

/// A full disk behind stdout is `taptree: writing ...`, exit 2, for every
/// tree command: never a verdict, never a panic's 101.
#[test]
fn a_full_stdout_is_exit_2_with_a_message_never_a_panic() {
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: no /dev/full on this system");
        return;
    }
    let (_d, a, b) = dirs();
    plain(&a);
    plain(&b);
    let runs: [&[&str]; 7] = [
        &["ls", "A"],
        &["ls", "A", "--json"],
        &["stat", "A"],
        &["stat", "A", "--json"],
        &["verify", "A"],
        &["verify", "A", "--json"],
        &["diff", "A", "B"],
    ];
    for args in runs {
        for mut c in in_both_binaries(args, &a, &b) {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            let o = c.stdout(full).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{c:?}: {err}");
            assert!(
                err.starts_with("taptree: writing") && !err.contains("panicked"),
                "{c:?}: {err}"
            );
        }
    }
}

#[test]
fn a_truncated_tap_file_is_an_unreadable_row_in_the_report_and_exit_2() {
    let (_d, a, b) = dirs();
    plain(&a);
    // B differs from A in two taps, so both are read; one of them is damaged
    // after the capture, its manifest intact.
    tree(
        &b,
        |x| x,
        |stage, layer, pos, v| {
            if pos == 0 && ((layer == Some(0) && stage == "q_proj") || stage == "logits") {
                v[0] = 9.0;
            }
        },
    );
    let f = b.join("L000/q_proj.p0-1.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len - 100).unwrap();
    let o = taptree(&[&"diff", &a, &b, &"--color", &"never"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    // The damaged tap is a row of the report, named with its file ...
    let row = out
        .lines()
        .find(|l| l.starts_with("L0/q_proj "))
        .unwrap_or_else(|| panic!("no L0/q_proj row:\n{out}"));
    assert!(row.contains("UNREADABLE"), "{row}");
    assert!(
        row.contains("could not read: ") && row.contains("q_proj.p0-1.safetensors"),
        "{row}"
    );
    // ... the other changed tap was still compared ...
    assert!(out.contains("logits"), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(last.starts_with("could not read 1 of"), "{last}");
    // ... and stderr names the file too.
    assert!(err.contains("q_proj.p0-1.safetensors"), "{err}");
    let o = taptree(&[&"diff", &a, &b, &"--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"], "unreadable");
    assert_eq!(v["counts"]["rows_unreadable"], 1);
}

#[test]
fn timing_names_the_phases_only_when_asked() {
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, pos, v| {
            if layer == Some(0) && pos == 1 && stage == "ffn_down" {
                v[3] += 1.0;
            }
        },
    );
    let timed = |var: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_taptree"));
        c.args([std::ffi::OsStr::new("diff"), a.as_ref(), b.as_ref()]);
        c.arg("--json").env_remove("TAPTREE_TIMING");
        if let Some(v) = var {
            c.env("TAPTREE_TIMING", v);
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", text(&o).1);
        text(&o).1
    };
    let err = timed(Some("1"));
    let line = err
        .lines()
        .find(|l| l.starts_with("diff timing (ms): "))
        .unwrap_or_else(|| panic!("{err}"));
    let phases: Vec<&str> = line
        .trim_start_matches("diff timing (ms): ")
        .split("; ")
        .map(|p| p.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "opened", "checked", "picked", "indexed", "merged", "read", "by_row", "rows",
            "ordered", "walked", "report", "written", "total"
        ],
        "{line}"
    );
    for v in [None, Some("0")] {
        let err = timed(v);
        assert!(!err.contains("diff timing"), "{v:?}: {err}");
    }
}

/// A tree whose index's records are sound but not the tree's (a tap's
/// tensor hash edited, the index sealed again): the diff runs while the
/// trees' directory hashes are checked, yet the tree is still refused with
/// the error opening it gives and nothing on stdout, also where the rest
/// of the diff ends first (against a tree of the same root: "identical" at
/// once), on one thread or several.
#[test]
fn a_tree_whose_records_are_not_its_own_is_refused_before_any_report() {
    use capture::index::{self, HEAD_LEN, INDEX_FILE, RECORD_LEN};
    let (_d, a, b) = dirs();
    plain(&a);
    plain(&b);
    let idx_path = b.join(INDEX_FILE);
    let mut idx = std::fs::read(&idx_path).unwrap();
    idx[HEAD_LEN + 5 * RECORD_LEN + 40] ^= 1;
    index::reseal(&mut idx);
    std::fs::write(&idx_path, &idx).unwrap();
    let unsealed = capture::TreeReader::open_unsealed(&b).unwrap();
    assert!(!unsealed.check(), "the records must be sound, the root not");
    let want = capture::TreeReader::open(&b).unwrap_err().to_string();
    for threads in ["1", "2", "16"] {
        for (x, y) in [(&a, &b), (&b, &a)] {
            for json in [false, true] {
                let mut c = Command::new(env!("CARGO_BIN_EXE_taptree"));
                c.args([std::ffi::OsStr::new("diff"), x.as_ref(), y.as_ref()]);
                c.env("RAYON_NUM_THREADS", threads);
                if json {
                    c.arg("--json");
                }
                let o = c.output().unwrap();
                let (out, err) = text(&o);
                let what = format!("{threads} threads, {} {json}", x.display());
                assert_eq!(o.status.code(), Some(2), "{what}: {out}{err}");
                assert_eq!(out, "", "{what}");
                assert!(err.contains(&want), "{what}: {err} (want {want})");
            }
        }
    }
}
