//! `taptree bisect commits|switches`: find the commit, or the set of runtime
//! switches, that makes a capture leave tolerance of a reference tree.
//!
//! Exit codes: 1 when a culprit is named (the answer is red), 0 when no
//! switch arm diverges, 2 when the bisect could not decide (a bad endpoint, a
//! failed capture, a tree that cannot be compared).

use crate::bisect::judge::Judge;
use crate::bisect::{commits, git::Repo, render, switches};
use crate::exit;
use anyhow::Context;
use std::io::IsTerminal;
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
    /// Tolerance expression of `taptree diff` (default: diff's default);
    /// spelt as in `taptree diff`: `-t`, `--tolerance` or `--tol`.
    #[arg(
        short,
        long,
        visible_alias = "tol",
        value_name = "EXPR",
        conflicts_with = "bitwise"
    )]
    pub tolerance: Option<String>,
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
    // The text is clap's help, where the brackets read as a placeholder.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Capture --good and --bad before searching. By default an endpoint is
    /// captured only when the answer rests on it (a good endpoint that is red
    /// or a bad one that is green is still reported then); checking first
    /// also catches a red --good whose later commits turn green again.
    #[arg(long)]
    pub check_endpoints: bool,
    /// Build every step in a fresh directory. By default all steps of a run
    /// share one (CARGO_TARGET_DIR, unless already set, and
    /// TAPTREE_BUILD_DIR, under the run's temporary directory), so a step
    /// after the first costs an incremental build.
    #[arg(long)]
    pub no_shared_build: bool,
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
    } else if let Some(expr) = &j.tolerance {
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
        shared_build: !args.no_shared_build,
    };
    let mut n = 0;
    let report = commits::bisect(&req, |step| {
        n += 1;
        eprintln!("{}", render::step_line(n, step));
    })?;
    let code = match report.answer {
        commits::Answer::FirstBad { .. } | commits::Answer::Ambiguous { .. } => exit::DIVERGED,
        _ => exit::COULD_NOT_COMPARE,
    };
    exit::report(code, |out| {
        if args.judging.json {
            exit::json(out, &report)
        } else {
            out.write_all(render::commits_text(&report).as_bytes())
        }
    })
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
    let code = match report.answer {
        switches::Answer::NoDivergence => exit::OK,
        switches::Answer::Single { .. } | switches::Answer::Set { .. } => exit::DIVERGED,
        switches::Answer::BaselineRed { .. } | switches::Answer::Undecided => {
            exit::COULD_NOT_COMPARE
        }
    };
    exit::report(code, |out| {
        if args.judging.json {
            exit::json(out, &report)
        } else {
            out.write_all(render::switches_text(&report).as_bytes())
        }
    })
}
