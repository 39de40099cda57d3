//! `taptree bisect commits` and `taptree bisect switches`, end to end: the
//! commits here, the switches in `bisect_switches_cli` (which shares this
//! module's helper capture).
//!
//! Bisect over commits runs the real thing: a throwaway repository whose
//! `model.cfg` holds the precision switches of a capture of the `tiny-q`
//! fixture model (`taptree capture`); from commit 19 on, the FFN down
//! projection runs on q8 activations, and commit 24 does not "build".
//!
//! Bisect over switches needs a divergence that only a pair of switches
//! causes, which no real switch does on demand: its capture command runs this
//! test binary itself in a helper mode (`capture_helper`, a no-op unless
//! TAPTREE_TEST_HELPER is set) that writes a small llama-vocabulary tree with
//! the capture API and perturbs taps according to `SW_*` variables.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TAPTREE: &str = env!("CARGO_BIN_EXE_taptree");

const LAYERS: u32 = 2;
const POSITIONS: u32 = 3;
const WIDTH: usize = 16;
const VOCAB: usize = 32;

fn value(stage: usize, layer: u32, pos: u32, i: usize) -> f32 {
    ((i as f32) * 0.37 + (pos as f32) * 1.3 + (layer as f32) * 0.71 + (stage as f32) * 0.13).sin()
}

/// Writes the helper's tree to $TAPTREE_OUT. Perturbations:
/// - SW_A=1 and SW_B=1 together: L1/ffn_up and the logits are far off;
/// - SW_C=1: L0/attn moves by 3e-7 relative (within any tolerance);
/// - SW_E=1: L0/q_proj and the logits are far off.
#[test]
fn capture_helper() {
    if std::env::var_os("TAPTREE_TEST_HELPER").is_none() {
        return;
    }
    let on = |name: &str| std::env::var(name).as_deref() == Ok("1");
    let pair = on("SW_A") && on("SW_B");
    let nudge = on("SW_C");
    let single = on("SW_E");

    let stages = kernels::stages::llama();
    let out = PathBuf::from(std::env::var_os("TAPTREE_OUT").expect("TAPTREE_OUT"));
    let capture = capture::Capture::start(capture::CaptureOptions {
        out,
        selection: capture::Selection::all(),
        force: false,
        stages: stages.clone(),
        run: capture::RunInfo::default(),
    })
    .expect("start capture");
    let far = |v: f32, i: usize| v + 0.6 * ((i as f32) * 2.9).cos();
    for pos in 0..POSITIONS {
        // Forward order within a position: embedding, the layers, then
        // final_norm and logits.
        let mut order: Vec<(usize, Option<u32>)> = vec![(0, None)];
        for layer in 0..LAYERS {
            for (si, spec) in stages.iter().enumerate() {
                if spec.scope == capture::Scope::Layer {
                    order.push((si, Some(layer)));
                }
            }
        }
        for (si, spec) in stages.iter().enumerate().skip(1) {
            if spec.scope == capture::Scope::Global {
                order.push((si, None));
            }
        }
        for (si, layer) in order {
            let stage = stages[si].name.as_str();
            let width = if stage == "logits" { VOCAB } else { WIDTH };
            let data: Vec<f32> = (0..width)
                .map(|i| {
                    let mut v = value(si, layer.unwrap_or(0), pos, i);
                    if pair && (stage == "logits" || (stage == "ffn_up" && layer == Some(1))) {
                        v = far(v, i);
                    }
                    if single && (stage == "logits" || (stage == "q_proj" && layer == Some(0))) {
                        v = far(v, i);
                    }
                    if nudge && stage == "attn" && layer == Some(0) {
                        v *= 1.0 + 3e-7;
                    }
                    v
                })
                .collect();
            capture::tap(stage, layer, pos..pos + 1, None, &[1, width], &data);
        }
    }
    capture.finish().expect("finish capture");
}

/// The command line that runs `capture_helper` in the current directory,
/// appending one line to `log` per run.
pub(crate) fn helper_command(log: &Path) -> String {
    let exe = std::env::current_exe().unwrap();
    format!(
        "echo run >> '{}'; \
         TAPTREE_TEST_HELPER=1 '{}' bisect_cli::capture_helper --exact --quiet --test-threads=1 >/dev/null",
        log.display(),
        exe.display()
    )
}

/// The prompt of every fixture capture: BOS then "Hello w".
const TOKENS: &str = "0,75,104,111,111,114,35,122";

/// The command line that captures the `tiny-q` fixture at `model` under the
/// switches in ./model.cfg, appending one line to `log` per run; exit 125
/// ("does not build") when model.cfg says `broken`.
fn fixture_command(model: &Path, log: &Path) -> String {
    format!(
        "grep -qx broken model.cfg && exit 125; \
         echo run >> '{}'; \
         env $(cat model.cfg) '{TAPTREE}' capture --model '{}' --tokens {TOKENS} --gen 4 >/dev/null",
        log.display(),
        model.display()
    )
}

pub(crate) fn runs_logged(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |s| s.lines().count())
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        // The host's git configuration (signing, hooks) is not the test's.
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository of 32 commits, `commit 1` .. `commit 32`: from commit 19 on,
/// model.cfg runs the FFN down projection at q8; commit `broken` does not
/// build. Returns the ids.
fn make_repo(dir: &Path, broken: usize) -> Vec<String> {
    git(dir, &["init", "-q", "-b", "main"]);
    let mut ids = Vec::new();
    for k in 1..=32 {
        let mut cfg = String::from("TAPTREE_ACT_ATTN=f32\n");
        cfg += if k >= 19 {
            "TAPTREE_ACT_FFN_DOWN=q8\n"
        } else {
            "TAPTREE_ACT_FFN_DOWN=f32\n"
        };
        if k == broken {
            cfg += "broken\n";
        }
        std::fs::write(dir.join("model.cfg"), cfg).unwrap();
        std::fs::write(dir.join("history.txt"), format!("{k}\n")).unwrap();
        git(dir, &["add", "model.cfg", "history.txt"]);
        git(dir, &["commit", "-q", "-m", &format!("commit {k}")]);
        ids.push(git(dir, &["rev-parse", "HEAD"]));
    }
    ids
}

/// Runs `cmd` in a scratch directory holding `cfg` as model.cfg, with `env`,
/// writing the reference tree.
fn reference_with(dir: &Path, cmd: &str, cfg: &str, env: &[(&str, &str)]) -> PathBuf {
    let work = dir.join("refwork");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("model.cfg"), cfg).unwrap();
    let tree = dir.join("reference");
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(&work)
        .env("TAPTREE_OUT", &tree)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tree
}

/// A repository, the fixture model, and a reference captured under `cfg`.
struct Setup {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    ids: Vec<String>,
    reference: PathBuf,
    log: PathBuf,
    cmd: String,
}

fn setup(reference_cfg: &str) -> Setup {
    setup_broken(reference_cfg, 24)
}

fn setup_broken(reference_cfg: &str, broken: usize) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let ids = make_repo(&repo, broken);
    let model = fixtures::write("tiny-q", tmp.path()).unwrap();
    let reference = reference_with(
        tmp.path(),
        &fixture_command(&model, &tmp.path().join("reflog")),
        reference_cfg,
        &[],
    );
    let log = tmp.path().join("captures.log");
    let cmd = fixture_command(&model, &log);
    Setup {
        tmp,
        repo,
        ids,
        reference,
        log,
        cmd,
    }
}

const F32_CFG: &str = "TAPTREE_ACT_ATTN=f32\nTAPTREE_ACT_FFN_DOWN=f32\n";

/// A helper reference for the switch tests.
pub(crate) fn reference(dir: &Path) -> PathBuf {
    reference_with(dir, &helper_command(&dir.join("reflog")), "", &[])
}

pub(crate) fn taptree(dir: &Path, args: &[&str]) -> Output {
    Command::new(TAPTREE)
        .current_dir(dir)
        .args(args)
        .env_remove("TAPTREE_OUT")
        .output()
        .expect("run taptree")
}

pub(crate) fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn bisect_commits_names_commit_19_and_its_op_in_at_most_6_captures() {
    let t = setup(F32_CFG);
    let args = [
        commit_args(&t.ids[0], "main", t.reference.to_str().unwrap(), &t.cmd),
        vec!["--json"],
    ]
    .concat();

    let out = taptree(&t.repo, &args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["answer"]["kind"], "first_bad", "{report:#}");
    assert_eq!(report["answer"]["commit"], t.ids[18].as_str());
    assert_eq!(report["answer"]["subject"], "commit 19");
    // q8 activations into the FFN down projection: the first op out of
    // tolerance is layer 0's ffn_down itself, an origin.
    assert_eq!(
        report["answer"]["first_op"]["op"], "L0/ffn_down",
        "{report:#}"
    );
    assert_eq!(report["answer"]["first_op"]["cause"], "origin");
    assert_eq!(report["answer"]["first_change"], "L0/ffn_down");

    // At most 6 captures (commit 24's attempt included).
    let runs = runs_logged(&t.log);
    assert!(runs <= 5, "{runs} trees captured:\n{stderr}");
    assert_eq!(
        report["captures_run"].as_u64(),
        Some(runs as u64 + 1),
        "{report:#}"
    );
    assert!(report["captures_run"].as_u64().unwrap() <= 6);
    // Commit 24 does not build: it was probed, skipped, and logged as such.
    let steps = report["steps"].as_array().unwrap();
    assert!(
        steps
            .iter()
            .any(|s| s["subject"] == "commit 24" && s["verdict"] == "skip"),
        "{report:#}"
    );
    assert!(stderr.contains("commit 24: skip"), "{stderr}");
    assert!(
        stderr.contains("commit 19: red at L0/ffn_down@"),
        "{stderr}"
    );
    assert!(stderr.contains("commit 18: green"), "{stderr}");

    // The user's checkout, index and branch are as they were; no worktree left.
    assert_eq!(git(&t.repo, &["status", "--porcelain"]), "");
    assert_eq!(git(&t.repo, &["rev-parse", "--abbrev-ref", "HEAD"]), "main");
    assert_eq!(git(&t.repo, &["rev-parse", "HEAD"]), t.ids[31]);
    assert_eq!(worktrees(&t.repo), 1);

    // A second run recaptures nothing and gives the same answer.
    let again = taptree(&t.repo, &args);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again.stderr));
    assert_eq!(runs_logged(&t.log), runs, "the second run captured again");
    let report2: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(report2["captures_run"], 0);
    assert_eq!(report2["answer"], report["answer"]);
    assert!(text(&again.stderr).contains("[cached]"));

    // Widened (a later bad, commit 32 stays bad) and for people: it reuses
    // what it has seen and captures only what it has not.
    let human = taptree(&t.repo, &args[..args.len() - 1]);
    assert_eq!(human.status.code(), Some(1));
    let stdout = text(&human.stdout);
    assert!(
        stdout.contains(&format!("first bad commit: {} commit 19", t.ids[18])),
        "{stdout}"
    );
    assert!(
        stdout.contains("first diverging op: L0/ffn_down@"),
        "{stdout}"
    );
    assert!(stdout.contains("0 captures run, 6 from cache"), "{stdout}");
    assert_eq!(runs_logged(&t.log), runs);
}

fn worktrees(repo: &Path) -> usize {
    git(repo, &["worktree", "list", "--porcelain"])
        .lines()
        .filter(|l| l.starts_with("worktree "))
        .count()
}

#[test]
fn bisect_commits_lists_the_candidates_when_a_skip_hides_the_boundary() {
    // Commit 18, the last good one, does not build: 18 or 19 is first bad.
    let t = setup_broken(F32_CFG, 18);
    let mut args = commit_args(&t.ids[0], &t.ids[31], t.reference.to_str().unwrap(), &t.cmd);
    let out = taptree(&t.repo, &args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("skipped commits hide the boundary; the first bad commit is one of:"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("  {} commit 18\n", t.ids[17])),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("  {} commit 19\n", t.ids[18])),
        "{stdout}"
    );
    args.push("--json");
    let out = taptree(&t.repo, &args);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["answer"]["kind"], "ambiguous");
    assert_eq!(report["captures_run"], 0);
}

#[test]
fn bisect_commits_refuses_a_good_commit_that_is_already_red() {
    // A reference captured at q8: the good commit (f32) diverges from it.
    let t = setup("TAPTREE_ACT_ATTN=f32\nTAPTREE_ACT_FFN_DOWN=q8\n");
    let mut args = commit_args(&t.ids[0], &t.ids[10], t.reference.to_str().unwrap(), &t.cmd);
    // Checking the endpoints first: one capture, and the answer.
    let mut checked = args.clone();
    checked.extend(["--check-endpoints", "--json"]);
    let out = taptree(&t.repo, &checked);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["answer"]["kind"], "good_is_red", "{report:#}");
    assert_eq!(report["captures_run"], 1);
    // Lazily: the search runs down to the good endpoint, then says the same.
    args.extend(["--cache", "../other-cache"]);
    let out = taptree(&t.repo, &args);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("is already red against the reference"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("--good {} commit 1 ", t.ids[0])),
        "{stdout}"
    );
}

#[test]
fn bisect_commits_refuses_a_bad_commit_that_is_green() {
    let t = setup(F32_CFG);
    let out = taptree(
        &t.repo,
        &[
            commit_args(&t.ids[0], &t.ids[9], t.reference.to_str().unwrap(), &t.cmd),
            vec!["--json"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["answer"]["kind"], "bad_is_green");
    assert_eq!(report["answer"]["subject"], "commit 10");
}

#[test]
fn bisect_commits_stops_on_a_failing_capture_naming_commit_status_and_stderr() {
    let t = setup(F32_CFG);
    let out = taptree(
        &t.repo,
        &commit_args(
            &t.ids[0],
            &t.ids[31],
            t.reference.to_str().unwrap(),
            "echo linker exploded >&2; exit 3",
        ),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("capture command failed (exit status 3)"),
        "{stderr}"
    );
    assert!(stderr.contains("linker exploded"), "{stderr}");
    assert!(stderr.contains("commit 16"), "{stderr}");
    assert_eq!(worktrees(&t.repo), 1);
    // Nothing was cached for it: a fixed command captures it.
    let out = taptree(
        &t.repo,
        &commit_args(&t.ids[0], &t.ids[31], t.reference.to_str().unwrap(), &t.cmd),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

#[test]
fn bisect_commits_rejects_a_command_that_writes_no_tree() {
    let t = setup(F32_CFG);
    let out = taptree(
        &t.repo,
        &commit_args(
            &t.ids[0],
            &t.ids[31],
            t.reference.to_str().unwrap(),
            "mkdir -p \"$TAPTREE_OUT\"; touch \"$TAPTREE_OUT/x\"",
        ),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("exited 0 but wrote no complete tree"),
        "{stderr}"
    );
    assert!(stderr.contains("incomplete capture"), "{stderr}");
}

#[test]
fn bisect_commits_rejects_reversed_endpoints_and_bad_revisions() {
    let t = setup(F32_CFG);
    let reference = t.reference.to_str().unwrap();
    let run = |good: &str, bad: &str| {
        let out = taptree(&t.repo, &commit_args(good, bad, reference, &t.cmd));
        assert_eq!(out.status.code(), Some(2));
        text(&out.stderr)
    };
    assert!(run(&t.ids[20], &t.ids[3]).contains("not an ancestor of"));
    assert!(run("no-such-rev", "main").contains("no-such-rev: not a commit"));
    assert!(run("main", "main").contains("no commits between"));
    assert_eq!(runs_logged(&t.log), 0);
    let _ = &t.tmp;
}

/// The bisect of commits 1..=32 with every step's capture command first
/// logging its build directories and what it finds in the shared one, then
/// leaving a file of its own there; `extra` is added to the arguments.
fn build_dirs_of_steps(extra: &[&str]) -> (Vec<String>, Vec<String>) {
    let t = setup(F32_CFG);
    let dirs = t.tmp.path().join("dirs.log");
    let seen = t.tmp.path().join("seen.log");
    let cmd = format!(
        "echo \"$CARGO_TARGET_DIR|$TAPTREE_BUILD_DIR\" >> '{}'; \
         ls \"$CARGO_TARGET_DIR\" 2>/dev/null | tr '\\n' ' ' >> '{}'; echo >> '{}'; \
         if [ -n \"$CARGO_TARGET_DIR\" ]; then mkdir -p \"$CARGO_TARGET_DIR\" && \
         touch \"$CARGO_TARGET_DIR/built-$(git rev-parse --short HEAD)\"; fi; {}",
        dirs.display(),
        seen.display(),
        seen.display(),
        t.cmd
    );
    let args = [
        commit_args(&t.ids[0], &t.ids[31], t.reference.to_str().unwrap(), &cmd),
        extra.to_vec(),
    ]
    .concat();
    let out = Command::new(TAPTREE)
        .current_dir(&t.repo)
        .args(&args)
        .env_remove("TAPTREE_OUT")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run taptree");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let lines = |p: &Path| -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    };
    (lines(&dirs), lines(&seen))
}

#[test]
fn bisect_commits_steps_share_one_build_directory_unless_told_not_to() {
    let (dirs, seen) = build_dirs_of_steps(&[]);
    assert!(dirs.len() >= 3, "{dirs:?}");
    // One directory, named by both variables, for every step of the run.
    let first = &dirs[0];
    let (cargo, build) = first.split_once('|').unwrap();
    assert!(!cargo.is_empty() && cargo == build, "{dirs:?}");
    assert!(dirs.iter().all(|d| d == first), "{dirs:?}");
    // Each step after the first finds what the earlier ones built there.
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.matches("built-").count(), i, "step {i}: {seen:?}");
    }
    // Removed with the run's worktrees.
    assert!(!Path::new(cargo).exists(), "{cargo} left behind");

    let (dirs, seen) = build_dirs_of_steps(&["--no-shared-build"]);
    assert!(dirs.len() >= 3, "{dirs:?}");
    assert!(dirs.iter().all(|d| d == "|"), "{dirs:?}");
    assert!(seen.iter().all(|s| s.trim().is_empty()), "{seen:?}");
}

/// `bisect commits` from `good` to `bad` against `reference`, each commit
/// captured by `capture`.
fn commit_args<'a>(
    good: &'a str,
    bad: &'a str,
    reference: &'a str,
    capture: &'a str,
) -> Vec<&'a str> {
    vec![
        "bisect",
        "commits",
        "--good",
        good,
        "--bad",
        bad,
        "--reference",
        reference,
        "--capture",
        capture,
    ]
}
