//! The `tree` target: hostile trees through the whole command line.
//!
//! Each iteration copies a seed tree, applies one to three edits to the
//! meaning of its manifest ([`crate::hostile`]), redoes every hash as a
//! hostile writer would, and runs the `taptree` binary on it: `diff` both
//! ways, trusted `verify A B`, `stat`, and two more commands drawn from
//! `verify TREE`, `verify --rehash`, `ls`, `diff` with `--truth`,
//! `--align`, `--slot-a/--slot-b`, `--html`, `--controls`,
//! `--all-positions --common-only`, `--bitwise`, a partner tree of another
//! precision, `stat --at`, and `replay` against the seed's model. Every
//! command runs with a 20 s timeout under a 4 GiB address-space limit. A
//! failure is a panic (exit 101 or `panicked` on stderr), a death by a
//! signal (an allocation the limit refused aborts), a timeout, an exit
//! code other than 0, 1 or 2, or exit 0 calling two trees of different
//! roots identical (unless one is of format 1, whose root covers less, and
//! what else a format 2 root covers is the same). Each failing tree is
//! kept in DIR with its command line, edits and output.
//!
//! Run from a debug build (`cargo run --example fuzz -- tree`), the
//! binaries it runs are the debug ones beside it: an integer that
//! overflows panics there, where a release build wraps it silently.

use crate::hostile::Editor;
use crate::reseal::reseal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long one command may run.
const TIMEOUT: Duration = Duration::from_secs(20);
/// The address space one command may take, in KiB (as `ulimit -v` counts).
const MEMORY_KIB: u64 = 4 << 20;

/// A tree edits start from, and the trees it is compared with.
struct Seed {
    tree: PathBuf,
    /// The model it ran (for `replay`).
    model: PathBuf,
    /// A tree of the same prompt in another precision or layout.
    partner: Option<PathBuf>,
    /// A truth for the seed and its partner.
    truth: Option<PathBuf>,
    /// Two trees that the seed (an f64 tree) may be the truth of.
    truth_of: Option<(PathBuf, PathBuf)>,
}

/// What the run saw, command by command.
#[derive(Default)]
struct Counts {
    iterations: u64,
    /// Trees that were opened and compared with their seed.
    compared: u64,
    commands: u64,
    exits: [u64; 3],
    failures: u64,
    unwritable: u64,
}

pub fn run(seconds: u64, seed: u64, dir: &Path, root: &Path) -> Result<u64, String> {
    let bin = taptree_binary()?;
    let seeds = seeds(&bin, root, dir)?;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut counts = Counts::default();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let edited = dir.join("edited");
    while Instant::now() < deadline {
        let s = &seeds[rng.usize(..seeds.len())];
        let _ = std::fs::remove_dir_all(&edited);
        crate::copy_tree(&s.tree, &edited)?;
        let mut m = capture::TreeReader::open(&s.tree)
            .map_err(|e| format!("seed: {e}"))?
            .manifest()
            .clone();
        // An unranked tree of format 2.0 is written as 2.3 (with an index)
        // half the time, so that both ways of opening see the edits.
        if m.format_version == "2.0" && rng.bool() {
            m.format_version = capture::FORMAT_VERSION.to_string();
        }
        let mut edits = Vec::new();
        for _ in 0..rng.usize(1..=3) {
            let mut editor = Editor {
                rng: &mut rng,
                m: &mut m,
                tree: &edited,
            };
            edits.push(editor.edit());
        }
        counts.iterations += 1;
        match reseal(&edited, &mut m) {
            Ok(written) => edits.push(written),
            Err(_) => {
                counts.unwritable += 1;
                continue;
            }
        }
        let commands = commands(&mut rng, s, &edited, dir);
        for (k, (args, pair)) in commands.into_iter().enumerate() {
            counts.commands += 1;
            let outcome = run_one(&bin, &args, dir)?;
            // The first command diffs the tree with its seed: 0 or 1 says
            // the edited tree was opened and compared, not refused.
            if k == 0 && matches!(outcome.code, Some(0 | 1)) {
                counts.compared += 1;
            }
            if let Some(code) = outcome.code {
                if code <= 2 {
                    counts.exits[code as usize] += 1;
                }
            }
            if let Some(why) =
                outcome.failure(pair.as_ref().map(|(a, b)| (a.as_path(), b.as_path())))
            {
                counts.failures += 1;
                keep_failure(dir, counts.failures, &edited, &args, &edits, &why, &outcome)?;
            }
        }
    }
    println!(
        "fuzz tree: {} trees in {seconds} s (seed {seed}), {} opened and compared: {} commands: exit 0 {}, exit 1 {}, exit 2 {}; {} failures ({} edits no index could hold)",
        counts.iterations,
        counts.compared,
        counts.commands,
        counts.exits[0],
        counts.exits[1],
        counts.exits[2],
        counts.failures,
        counts.unwritable,
    );
    Ok(counts.failures)
}

/// `taptree` (the front, which hands every command but a trusted `verify A
/// B` of identical trees to `taptree-full` beside it), built by cargo
/// beside this example.
fn taptree_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this example's path: {e}"))?;
    // target/<profile>/examples/fuzz -> target/<profile>/taptree
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("this example is not in a cargo target directory")?;
    let bin = profile.join("taptree");
    for b in [&bin, &profile.join("taptree-full")] {
        if !b.is_file() {
            return Err(format!(
                "{}: not built (cargo build --release --bin taptree --bin taptree-full)",
                b.display()
            ));
        }
    }
    Ok(bin)
}

/// The golden trees, and trees captured here from the fixture models: a
/// tensor-parallel one (tp 2) and a batched one (two slots).
fn seeds(bin: &Path, root: &Path, dir: &Path) -> Result<Vec<Seed>, String> {
    let golden = |name: &str| root.join("fixtures/golden").join(name);
    let captured = dir.join("seeds");
    let capture = |name: &str, args: &[&str]| -> Result<PathBuf, String> {
        let out = captured.join(name);
        let o = taptree(bin)
            .arg("capture")
            .args(args)
            .arg("--out")
            .arg(&out)
            .output()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        if !o.status.success() {
            return Err(format!(
                "capturing the seed {name}: {} (write the fixture models: cargo run --release -p fixtures --bin generate -- models target/fixtures)",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(out)
    };
    let model = |name: &str| root.join("target/fixtures").join(name);
    let tiny_f32 = model("tiny-f32.gguf");
    let tiny_q = model("tiny-q.gguf");
    let tp2 = capture(
        "tp2",
        &[
            "--model",
            &tiny_f32.to_string_lossy(),
            "--tokens",
            "0,72,105,33",
            "--gen",
            "2",
            "--tp",
            "2",
        ],
    )?;
    let batch = capture(
        "batch",
        &[
            "--model",
            &tiny_q.to_string_lossy(),
            "--tokens",
            "0,75,108,35,104",
            "--tokens",
            "0,75,35",
            "--gen",
            "3",
        ],
    )?;
    let seed =
        |tree: PathBuf, model: &Path, partner: Option<PathBuf>, truth: Option<PathBuf>| Seed {
            tree,
            model: model.to_path_buf(),
            partner,
            truth,
            truth_of: None,
        };
    let q = |p: &str| golden(&format!("tiny-q-{p}"));
    let outlier = |p: &str| golden(&format!("tiny-outlier-{p}"));
    let tiny_outlier = model("tiny-outlier.gguf");
    Ok(vec![
        seed(q("f32"), &tiny_q, Some(q("q8")), Some(q("f64"))),
        seed(q("q8"), &tiny_q, Some(q("f32")), Some(q("f64"))),
        Seed {
            truth_of: Some((q("f32"), q("q8"))),
            ..seed(q("f64"), &tiny_q, Some(q("f32")), None)
        },
        seed(outlier("f32"), &tiny_outlier, Some(outlier("q8")), None),
        seed(outlier("q8"), &tiny_outlier, Some(outlier("f32")), None),
        seed(golden("tiny-f32-f32"), &tiny_f32, Some(tp2.clone()), None),
        seed(tp2, &tiny_f32, Some(golden("tiny-f32-f32")), None),
        seed(batch, &tiny_q, Some(q("f32")), None),
    ])
}

/// The command lines run on an edited tree, each with the two trees whose
/// roots must be equal for it to say "identical" (none where it compares
/// other trees).
type Run = (Vec<String>, Option<(PathBuf, PathBuf)>);

fn commands(rng: &mut fastrand::Rng, s: &Seed, edited: &Path, dir: &Path) -> Vec<Run> {
    let p = |p: &Path| p.to_string_lossy().into_owned();
    let (e, o) = (p(edited), p(&s.tree));
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let eo = Some((edited.to_path_buf(), s.tree.clone()));
    let mut out: Vec<Run> = vec![
        (args(&["diff", &e, &o, "--json"]), eo.clone()),
        (args(&["diff", &o, &e]), eo.clone()),
        (args(&["verify", &e, &o]), eo.clone()),
        (args(&["stat", &e, "--json"]), None),
    ];
    let html = p(&dir.join("report.html"));
    for _ in 0..2 {
        let extra: Run = match rng.u8(..15) {
            13 => {
                let precision = ["f64", "f32", "q8"][rng.usize(..3)];
                (
                    args(&[
                        "replay",
                        &e,
                        "--model",
                        &p(&s.model),
                        "--precision",
                        precision,
                    ]),
                    None,
                )
            }
            14 => (
                args(&["replay", &e, "--model", &p(&s.model), "--html", &html]),
                None,
            ),
            0 => (args(&["verify", &e]), None),
            1 => (args(&["verify", "--rehash", &e, &o]), eo.clone()),
            2 => (args(&["ls", &e]), None),
            3 => (
                args(&[
                    "diff",
                    &e,
                    &o,
                    "--align",
                    ["1", "-1", "3", "16777215", "-4294967295"][rng.usize(..5)],
                ]),
                None,
            ),
            4 => {
                let slot =
                    |rng: &mut fastrand::Rng| ["0", "1", "none", "4294967295"][rng.usize(..4)];
                let (a, b) = (slot(rng), slot(rng));
                (args(&["diff", &e, &o, "--slot-a", a, "--slot-b", b]), None)
            }
            5 => (args(&["diff", &e, &o, "--html", &html]), eo.clone()),
            6 => (args(&["diff", &e, &o, "--controls"]), eo.clone()),
            7 => (
                args(&["diff", &e, &o, "--all-positions", "--common-only"]),
                eo.clone(),
            ),
            8 => match &s.partner {
                Some(partner) => (args(&["diff", &p(partner), &e, "--bitwise"]), None),
                None => (args(&["diff", &e, &o, "--bitwise"]), eo.clone()),
            },
            9 => match (&s.partner, &s.truth) {
                (Some(partner), Some(truth)) => (
                    args(&["diff", &e, &p(partner), "--truth", &p(truth), "--json"]),
                    None,
                ),
                _ => (
                    args(&["diff", &e, &o, "--truth", &o, "--force-truth"]),
                    None,
                ),
            },
            10 => match &s.truth_of {
                Some((a, b)) => (args(&["diff", &p(a), &p(b), "--truth", &e]), None),
                None => (
                    args(&["diff", &o, &e, "--truth", &e, "--force-truth"]),
                    None,
                ),
            },
            11 => {
                let at = ["L0/attn_norm", "logits@2", "L1/ffn_down@0", "embedding"][rng.usize(..4)];
                (args(&["stat", &e, "--at", at]), None)
            }
            _ => (
                args(&["diff", &e, &o, "-m", "--sort", "growth", "--html", &html]),
                eo.clone(),
            ),
        };
        out.push(extra);
    }
    out
}

/// How one command ended.
struct Outcome {
    code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
}

impl Outcome {
    /// Why this outcome is a failure, if it is one. `pair`: the trees whose
    /// roots must be equal for "identical".
    fn failure(&self, pair: Option<(&Path, &Path)>) -> Option<String> {
        if self.timed_out {
            return Some(format!("no answer within {} s", TIMEOUT.as_secs()));
        }
        if let Some(sig) = self.signal {
            return Some(format!("killed by signal {sig}"));
        }
        if self.code == Some(101) || self.stderr.contains("panicked") {
            return Some(format!("panic (exit {:?})", self.code));
        }
        match self.code {
            Some(0..=2) => {}
            other => return Some(format!("exit {other:?}")),
        }
        let says_identical = self.stdout.contains("\"outcome\": \"identical\"")
            || self
                .stdout
                .lines()
                .any(|l| l.starts_with("bitwise identical"));
        if self.code == Some(0) && says_identical {
            if let Some((a, b)) = pair {
                let (ma, mb) = (manifest_of(a), manifest_of(b));
                if ma["root"] != mb["root"] && !same_under_format_1(&ma, &mb) {
                    return Some(format!(
                        "identical, but the roots are {} and {}",
                        ma["root"], mb["root"]
                    ));
                }
            }
        }
        None
    }
}

/// A tree's manifest as JSON (without opening it as a tree).
fn manifest_of(tree: &Path) -> serde_json::Value {
    std::fs::read(tree.join(capture::manifest::MANIFEST_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Whether two manifests whose roots differ may still be identical: one of
/// them of format 1 (whose root hashes capture order and nothing but the
/// entries), and what a format 2 root covers besides the entries the same
/// (docs/FORMAT.md).
fn same_under_format_1(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    let format_1 = |m: &serde_json::Value| {
        m["format_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("1."))
    };
    let stages = |m: &serde_json::Value| -> Vec<serde_json::Value> {
        let stages = m["stages"].as_array().cloned().unwrap_or_default();
        let fields = ["name", "scope", "inputs", "first_layer_inputs"];
        stages
            .iter()
            .map(|s| fields.iter().map(|f| s[*f].clone()).collect())
            .collect()
    };
    let inputs = |m: &serde_json::Value| {
        let run = &m["run"];
        (
            m["selection"].clone(),
            run["precision"].clone(),
            run["prompt_tokens"].clone(),
            run["switches"].clone(),
            stages(m),
        )
    };
    (format_1(a) || format_1(b)) && inputs(a) == inputs(b)
}

/// `taptree` with no `TAPTREE_` variable of this environment.
fn taptree(bin: &Path) -> Command {
    let mut c = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("TAPTREE_") {
            c.env_remove(k);
        }
    }
    c
}

/// Runs `taptree ARGS` under the limits, its output into files of `dir`
/// (a pipe left unread could block it).
fn run_one(bin: &Path, args: &[String], dir: &Path) -> Result<Outcome, String> {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut c = taptree(Path::new("sh"));
    c.arg("-c")
        .arg(format!("ulimit -v {MEMORY_KIB} && exec \"$0\" \"$@\""))
        .arg(bin)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file(&out)?)
        .stderr(file(&err)?);
    let mut child = c.spawn().map_err(|e| format!("sh: {e}"))?;
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if start.elapsed() > TIMEOUT {
            timed_out = true;
            let _ = child.kill();
            break child.wait().map_err(|e| e.to_string())?;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    use std::os::unix::process::ExitStatusExt;
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Ok(Outcome {
        code: status.code(),
        signal: status.signal(),
        timed_out,
        stdout: read(&out),
        stderr: read(&err),
    })
}

/// Keeps the failing tree in `DIR/failure-N/tree` with what was run and seen.
fn keep_failure(
    dir: &Path,
    n: u64,
    edited: &Path,
    args: &[String],
    edits: &[String],
    why: &str,
    outcome: &Outcome,
) -> Result<(), String> {
    let kept = dir.join(format!("failure-{n}"));
    crate::copy_tree(edited, &kept.join("tree"))?;
    let line: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace(
                &*edited.to_string_lossy(),
                &kept.join("tree").to_string_lossy(),
            )
        })
        .collect();
    let report = format!(
        "{why}\ncommand: taptree {}\nedits:\n  {}\nexit: {:?}\nstderr:\n{}\nstdout (first 2000 bytes):\n{}\n",
        line.join(" "),
        edits.join("\n  "),
        outcome.code,
        outcome.stderr,
        outcome.stdout.chars().take(2000).collect::<String>(),
    );
    std::fs::write(kept.join("failure.txt"), &report)
        .map_err(|e| format!("{}: {e}", kept.display()))?;
    eprintln!(
        "fuzz: {why}: taptree {} ({}); kept in {}",
        line.join(" "),
        edits.join("; "),
        kept.display()
    );
    Ok(())
}
