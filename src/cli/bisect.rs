//! `taptree bisect commits|switches`: find the commit, or the set of runtime
//! switches, that makes a capture leave tolerance of a reference tree.
//!
//! Exit codes: 1 when a culprit is named (the answer is red), 0 when no
//! switch arm diverges, 2 when the bisect could not decide (a bad endpoint, a
//! failed capture, a tree that cannot be compared).

use crate::bisect::judge::{FirstOp, Judge};
use crate::bisect::{commits, git::Repo, switches};
use crate::exit;
use anyhow::Context;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// Arguments of `taptree bisect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Debug, clap::Subcommand)]
pub enum Mode {
    /// Find the first commit whose capture leaves tolerance of the reference.
    ///
    /// Binary search over the first-parent history between a good and a bad
    /// commit. Each candidate is checked out in its own git worktree (your
    /// checkout, index and branches are never touched), CMD runs there with
    /// TAPTREE_OUT set, and the tree is diffed against the reference. CMD
    /// exiting 125 skips the commit (as with `git bisect run`); any other
    /// failure stops the bisect. Trees are cached by commit.
    Commits(CommitsArgs),
    /// Find the runtime switches that make a capture leave tolerance.
    ///
    /// Runs arms of environment switches (all off, each alone, all on) and,
    /// when no single switch explains a divergence, finds a minimal culprit
    /// set by delta debugging.
    Switches(SwitchesArgs),
}

/// How a tree is judged against the reference.
#[derive(Debug, clap::Args)]
pub struct Judging {
    /// The tree every candidate is compared with.
    #[arg(long, value_name = "TREE")]
    pub reference: PathBuf,
    /// Shell command that writes a tree to $TAPTREE_OUT (run with `sh -c`).
    #[arg(long, value_name = "CMD")]
    pub capture: String,
    /// Tolerance expression of `taptree diff` (default: diff's default).
    #[arg(long, value_name = "EXPR", conflicts_with = "bitwise")]
    pub tol: Option<String>,
    /// Green only when bitwise identical to the reference.
    #[arg(long)]
    pub bitwise: bool,
    /// Print the report as JSON on stdout (the step log stays on stderr).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CommitsArgs {
    /// A commit whose capture is within tolerance of the reference.
    #[arg(long, value_name = "REV")]
    pub good: String,
    /// A later commit whose capture diverges.
    #[arg(long, value_name = "REV")]
    pub bad: String,
    #[command(flatten)]
    pub judging: Judging,
    /// Where trees are cached [default: <git common dir>/taptree/trees].
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Capture --good and --bad before searching. By default an endpoint is
    /// captured only when the answer rests on it (a good endpoint that is red
    /// or a bad one that is green is still reported then); checking first
    /// also catches a red --good whose later commits turn green again.
    #[arg(long)]
    pub check_endpoints: bool,
}

#[derive(Debug, clap::Args)]
pub struct SwitchesArgs {
    /// A switch: an environment variable, its off value and its on value
    /// (`TAPTREE_ACT_FFN_DOWN=f32,q8`). Repeat for each switch.
    #[arg(long = "switch", value_name = "NAME=OFF,ON", required = true)]
    pub switches: Vec<String>,
    #[command(flatten)]
    pub judging: Judging,
    /// Where arm trees are cached across runs [default: this run only].
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    match args.mode {
        Mode::Commits(a) => run_commits(a),
        Mode::Switches(a) => run_switches(a),
    }
}

fn judge(j: &Judging) -> anyhow::Result<Judge> {
    let tolerance = if j.bitwise {
        diff::Tolerance::bitwise()
    } else if let Some(expr) = &j.tol {
        diff::Tolerance::parse(expr).map_err(|e| anyhow::anyhow!("--tol {expr:?}: {e}"))?
    } else {
        diff::Tolerance::default()
    };
    // Resolved now: the capture command runs elsewhere (a worktree).
    let reference = std::path::absolute(&j.reference)
        .with_context(|| format!("{}: bad reference path", j.reference.display()))?;
    // Flattened: the capture error already quotes its source.
    capture::TreeReader::open(&reference).map_err(|e| anyhow::anyhow!("--reference: {e}"))?;
    Ok(Judge {
        reference,
        tolerance,
    })
}

fn run_commits(args: CommitsArgs) -> anyhow::Result<u8> {
    let judge = judge(&args.judging)?;
    let cwd = std::env::current_dir().context("current directory")?;
    let repo = Repo::discover(&cwd)?;
    let req = commits::Request {
        repo,
        good: args.good,
        bad: args.bad,
        judge,
        command: args.judging.capture.clone(),
        cache: args.cache.map(|c| cwd.join(c)),
        check_endpoints: args.check_endpoints,
    };
    let mut n = 0;
    let report = commits::bisect(&req, |step| {
        n += 1;
        eprintln!("{}", step_line(n, step));
    })?;
    if args.judging.json {
        print_json(&report)?;
    } else {
        print!("{}", render_commits(&report));
    }
    Ok(match report.answer {
        commits::Answer::FirstBad { .. } | commits::Answer::Ambiguous { .. } => exit::DIVERGED,
        _ => exit::COULD_NOT_COMPARE,
    })
}

fn short(id: &str) -> &str {
    &id[..id.len().min(10)]
}

fn op_or_dash(op: &Option<FirstOp>) -> String {
    op.as_ref().map_or("-".into(), |o| o.to_string())
}

/// `step 3: 1a2b3c4d5e commit 23: red at L0/ffn_down@1 (origin, cos 0.873211)`.
fn step_line(n: usize, s: &commits::Step) -> String {
    let verdict = match s.verdict {
        commits::StepVerdict::Green => "green".to_string(),
        commits::StepVerdict::Red => format!(
            "red at {}; logits min cos {}",
            op_or_dash(&s.first_op),
            cos_or_dash(s.logits_min_cos)
        ),
        commits::StepVerdict::Skip => "skip (capture command exited 125)".to_string(),
    };
    let cached = if s.cached { " [cached]" } else { "" };
    format!(
        "step {n}: {} {}: {verdict}{cached}",
        short(&s.commit),
        s.subject
    )
}

fn render_commits(r: &commits::Report) -> String {
    use commits::Answer;
    let mut out = String::new();
    let named = |c: &commits::Named| format!("{} {}", c.commit, c.subject);
    match &r.answer {
        Answer::FirstBad {
            commit,
            first_op,
            first_change,
        } => {
            out += &format!("first bad commit: {}\n", named(commit));
            out += &format!("first diverging op: {}\n", op_or_dash(first_op));
            if let Some(op) = first_op {
                for reason in &op.reasons {
                    out += &format!("  {reason}\n");
                }
            }
            if let Some(change) = first_change {
                out += &format!("first op not bitwise equal to the reference: {change}\n");
            }
        }
        Answer::Ambiguous { candidates } => {
            out += "skipped commits hide the boundary; the first bad commit is one of:\n";
            for c in candidates {
                out += &format!("  {}\n", named(c));
            }
        }
        Answer::GoodIsRed { commit, first_op } => {
            out += &format!(
                "--good {} is already red against the reference (first diverging op: {}); \
                 nothing to bisect: check --reference and --good\n",
                named(commit),
                op_or_dash(first_op)
            );
        }
        Answer::BadIsGreen { commit } => {
            out += &format!(
                "--bad {} is within tolerance of the reference; nothing to bisect: \
                 check --reference, --bad and the tolerance\n",
                named(commit)
            );
        }
        Answer::EndpointSkipped { commit } => {
            out += &format!(
                "{}: the answer rests on this endpoint and its capture command exits 125; \
                 choose another --good/--bad\n",
                named(commit)
            );
        }
    }
    out += &format!(
        "{} commits in range, {} steps: {} captures run, {} from cache ({})\n",
        r.range,
        r.steps.len(),
        r.captures_run,
        r.cache_hits,
        r.cache.display()
    );
    out
}

fn run_switches(args: SwitchesArgs) -> anyhow::Result<u8> {
    let switches = switches::Switch::parse_all(&args.switches)?;
    let judge = judge(&args.judging)?;
    let cwd = std::env::current_dir().context("current directory")?;
    let req = switches::Request {
        switches,
        judge,
        command: args.judging.capture.clone(),
        cwd: cwd.clone(),
        cache: args.cache.map(|c| cwd.join(c)),
    };
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} arms  {msg}")
                .expect("valid template"),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let report = switches::bisect(&req, |arm, planned| {
        bar.set_length(planned as u64);
        bar.inc(1);
        bar.set_message(arm.label());
    });
    bar.finish_and_clear();
    let report = report?;
    if args.judging.json {
        print_json(&report)?;
    } else {
        print!("{}", render_switches(&report));
    }
    Ok(match report.answer {
        switches::Answer::NoDivergence => exit::OK,
        switches::Answer::Single { .. } | switches::Answer::Set { .. } => exit::DIVERGED,
        switches::Answer::BaselineRed { .. } | switches::Answer::Undecided => {
            exit::COULD_NOT_COMPARE
        }
    })
}

fn cos_or_dash(c: Option<f64>) -> String {
    c.map_or("-".into(), |c| format!("{c:.6}"))
}

fn render_switches(r: &switches::Report) -> String {
    use switches::{Answer, ArmVerdict};
    let labels: Vec<String> = r.arms.iter().map(|a| a.label()).collect();
    let width = labels.iter().map(String::len).max().unwrap_or(3).max(3);
    let changes: Vec<String> = r
        .arms
        .iter()
        .map(|a| a.first_change.clone().unwrap_or_else(|| "-".into()))
        .collect();
    let cwidth = changes.iter().map(String::len).max().unwrap_or(0).max(12);
    let mut out = format!(
        "{:width$}  {:7}  {:14}  {:cwidth$}  {}\n",
        "arm", "verdict", "logits min cos", "first change", "first diverging op"
    );
    for ((arm, label), change) in r.arms.iter().zip(&labels).zip(&changes) {
        let verdict = match arm.verdict {
            ArmVerdict::Green => "green",
            ArmVerdict::Red => "red",
            ArmVerdict::Skip => "skip",
        };
        out += &format!(
            "{label:width$}  {verdict:7}  {:14}  {change:cwidth$}  {}\n",
            cos_or_dash(arm.logits_min_cos),
            op_or_dash(&arm.first_op)
        );
    }
    out += "\n";
    match &r.answer {
        Answer::NoDivergence => out += "no arm diverges from the reference\n",
        Answer::BaselineRed { first_op } => {
            out += &format!(
                "all off already diverges from the reference (first diverging op: {}); \
                 the switches cannot explain it\n",
                op_or_dash(first_op)
            )
        }
        Answer::Single { culprits } => {
            if culprits.len() > 1 {
                out += "switches red alone, earliest first divergence first:\n";
                for c in culprits {
                    out += &format!(
                        "  {}: {} (first change {})\n",
                        c.switches.join(" "),
                        op_or_dash(&c.first_op),
                        c.first_change.as_deref().unwrap_or("-")
                    );
                }
            }
            let first = &culprits[0];
            let what = if culprits.len() > 1 {
                "culprit of the first divergence"
            } else {
                "culprit"
            };
            out += &format!(
                "{what}: {} alone (first diverging op: {})\n",
                first.switches.join(" "),
                op_or_dash(&first.first_op)
            );
        }
        Answer::Set { culprit } => {
            out += "no single switch diverges alone\n";
            out += &format!(
                "minimal culprit set (delta debugging): {} (first diverging op: {})\n",
                culprit.switches.join(" "),
                op_or_dash(&culprit.first_op)
            );
        }
        Answer::Undecided => {
            out += "no single switch diverges alone and all on could not be captured \
                    (exit 125): undecided\n"
        }
    }
    out += &format!(
        "{} arms: {} captures run, {} from cache\n",
        r.arms.len(),
        r.captures_run,
        r.cache_hits
    );
    out
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)?;
    writeln!(stdout)?;
    Ok(())
}
