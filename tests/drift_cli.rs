//! `taptree drift`, end to end on the fixture models.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

const TAPTREE: &str = env!("CARGO_BIN_EXE_taptree");

const PROMPTS: &str = "\
# two chat turns and one plain text
chat: Hello there
chat: What is two plus two?
text: The quick brown fox
";

fn drift(dir: &Path, model: &Path, a: &str, b: &str, extra: &[&str]) -> Output {
    drift_gen(dir, model, a, b, "8", extra)
}

fn drift_gen(dir: &Path, model: &Path, a: &str, b: &str, gen: &str, extra: &[&str]) -> Output {
    let prompts = dir.join("prompts.txt");
    if !prompts.exists() {
        std::fs::write(&prompts, PROMPTS).unwrap();
    }
    let mut cmd = Command::new(TAPTREE);
    cmd.current_dir(dir).args([
        "drift",
        "--model",
        model.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--gen",
        gen,
        "--a",
        a,
        "--b",
        b,
    ]);
    cmd.args(extra).output().expect("run taptree")
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn drift_of_an_arm_against_itself_is_identical_for_every_token() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures::write("tiny-q", tmp.path()).unwrap();
    let out = drift(tmp.path(), &model, "precision=f32", "precision=f32", &[]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_eq!(
        stdout.matches("greedy answers identical for ").count(),
        3,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("logits bitwise identical at all ").count(),
        3,
        "{stdout}"
    );
    assert!(stdout.contains("prompt 1 (chat, "), "{stdout}");
    assert!(stdout.contains("prompt 3 (text, "), "{stdout}");
    assert!(
        stdout.contains("0 of 3 prompts part within 8 tokens"),
        "{stdout}"
    );
}

#[test]
fn drift_q8_against_f32_on_the_planted_outlier_parts_and_says_where() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures::write("tiny-outlier", tmp.path()).unwrap();
    // The token prompt is one whose greedy answers part early under q8 (found
    // by running drift over random prompts of this deterministic fixture).
    std::fs::write(
        tmp.path().join("prompts.txt"),
        "chat: Hello there\ntext: The quick brown fox\ntokens: 0 35 133 63 256\n",
    )
    .unwrap();
    let out = drift_gen(
        tmp.path(),
        &model,
        "precision=f32",
        "precision=q8",
        "16",
        &["--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let prompts = report["prompts"].as_array().unwrap();
    let kinds: Vec<&str> = prompts
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["chat", "text", "tokens"]);
    for p in prompts {
        // The crushed block reaches the logits of every prompt: they all
        // start with the BOS that carries the outlier.
        assert_eq!(p["bitwise"], false, "{p:#}");
        let min_cos = p["min_cos"].as_f64().unwrap();
        assert!(min_cos < 0.99999 && min_cos > 0.99, "{p:#}");
        let n = p["prompt_tokens"].as_u64().unwrap();
        let pos = p["min_cos_pos"].as_u64().unwrap();
        assert!(pos + 1 >= n && pos < n + 16, "{p:#}");
    }
    // Wherever the answers part, they agree up to the parting, each takes its
    // own token there, and B's answer continues on its own greedy path.
    for p in prompts {
        let (a, b) = (
            p["a_tokens"].as_array().unwrap(),
            p["b_tokens"].as_array().unwrap(),
        );
        match p.get("parting") {
            None => {
                assert_eq!(p["argmax_mismatches"], 0, "{p:#}");
                assert_eq!(a, b);
            }
            Some(part) => {
                let step = part["step"].as_u64().unwrap() as usize;
                let n = p["prompt_tokens"].as_u64().unwrap() as usize;
                assert_eq!(part["pos"].as_u64().unwrap() as usize, n - 1 + step);
                assert!(p["argmax_mismatches"].as_u64().unwrap() >= 1);
                assert_ne!(part["a_token"], part["b_token"]);
                assert_eq!(a[..step], b[..step]);
                assert_eq!(a[step], part["a_token"]);
                assert_eq!(b[step], part["b_token"]);
            }
        }
    }
    // The plain text does not part; the chat turn and the token prompt do.
    assert!(prompts[1].get("parting").is_none(), "{:#}", prompts[1]);
    assert_eq!(prompts[0]["parting"]["step"], 11, "{:#}", prompts[0]);
    assert_eq!(prompts[2]["parting"]["step"], 5, "{:#}", prompts[2]);
    assert_eq!(prompts[2]["parting"]["pos"], 9);
    // B's own answer goes on past the parting (here to a stop token).
    let b_len = prompts[2]["b_tokens"].as_array().unwrap().len();
    assert!((7..=16).contains(&b_len), "{:#}", prompts[2]);

    // For people: the per-prompt lines.
    let out = drift_gen(
        tmp.path(),
        &model,
        "precision=f32",
        "precision=q8",
        "16",
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("greedy answers part at generated token 5 (pos 9): A "),
        "{stdout}"
    );
    assert!(
        stdout.contains("greedy answers identical for 16 tokens"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 of 3 prompts part within 16 tokens"),
        "{stdout}"
    );
}

#[test]
fn drift_names_the_bad_line_of_a_prompts_file_and_a_bad_arm() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures::write("tiny-q", tmp.path()).unwrap();
    std::fs::write(tmp.path().join("prompts.txt"), "chat: hi\nhello\n").unwrap();
    let out = drift(tmp.path(), &model, "precision=f32", "precision=q8", &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr
            .contains("prompts.txt:2: \"hello\": expected a `chat:`, `text:` or `tokens:` prefix"),
        "{stderr}"
    );

    std::fs::write(tmp.path().join("prompts.txt"), "tokens: 0 75 104\n").unwrap();
    let out = drift(
        tmp.path(),
        &model,
        "precision=f32",
        "TAPTREE_ACT_FFN_DOWN=int4",
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("TAPTREE_ACT_FFN_DOWN: bad value \"int4\""),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn drift_switches_an_op_family_through_the_arm() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures::write("tiny-q", tmp.path()).unwrap();
    std::fs::write(
        tmp.path().join("prompts.txt"),
        "tokens: 0 75 104 111 111 114\n",
    )
    .unwrap();
    // q8 activations into the FFN down projection change the logits...
    let out = drift(
        tmp.path(),
        &model,
        "precision=f32",
        "TAPTREE_ACT_FFN_DOWN=q8",
        &["--json"],
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["b"]["switches"]["TAPTREE_ACT_FFN_DOWN"], "q8");
    assert_eq!(report["prompts"][0]["bitwise"], false, "{report:#}");
    assert!(
        report["prompts"][0]["min_cos"].as_f64().unwrap() < 0.99999,
        "{report:#}"
    );
    // ...and f32 set explicitly is the default.
    let out = drift(
        tmp.path(),
        &model,
        "precision=f32",
        "TAPTREE_ACT_FFN_DOWN=f32",
        &["--json"],
    );
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["prompts"][0]["bitwise"], true, "{report:#}");
}
