//! `taptree diff A B`: the first diverging op, metrics, truth, controls.

use crate::exit;
use capture::TreeReader;
use diff::controls::{self, At};
use diff::render::table::{Sort, TableOptions};
use diff::report::Note;
use diff::{Options, Progress, Tolerance};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Compare two trees: first diverging op, metrics, truth.
///
/// Prints one row per (layer, stage) in forward order (runs of bitwise-equal
/// rows folded), names the first op whose worst position leaves tolerance,
/// says for each red row whether it originated the divergence or inherited
/// it, ranks ops by error growth and, with --truth, says which side is wrong.
/// Exit 0 identical or within tolerance, 1 diverged, 2 could not compare
/// (missing or incomplete tree, corrupt file, failed control, degenerate
/// agreement).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The reference tree.
    pub a: PathBuf,
    /// The tree compared with it.
    pub b: PathBuf,
    /// When two tensors agree: `cos>=0.999`, `ulp<=4`, `abs<=1e-3|rel<=1e-2`,
    /// combined with & (binds tighter) and |, parentheses to group. Metrics:
    /// cos abs rel rmse nmse sqnr ulp eq argmax; `bitwise` means exact.
    #[arg(
        short,
        long,
        visible_alias = "tol",
        value_name = "EXPR",
        default_value = diff::tolerance::DEFAULT
    )]
    pub tolerance: String,
    /// Exact agreement only: every element bitwise equal.
    #[arg(long, conflicts_with = "tolerance")]
    pub bitwise: bool,
    /// A tree of the same forward with every op in f64: for every row, the
    /// error of A and of B against it and which side is closer. A tree whose
    /// manifest does not show every op in f64 is refused (exit 2).
    #[arg(long, value_name = "TREE")]
    pub truth: Option<PathBuf>,
    /// Use --truth even though its manifest does not show every op in f64.
    #[arg(long, requires = "truth")]
    pub force_truth: bool,
    /// Compare position p of A with position p+N of B: N=1 when B has one
    /// extra leading token (a second BOS), -1 when A has.
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        default_value_t = 0
    )]
    pub align: i64,
    /// Also run the SELF, PERTURBED and FIXTURE VALIDITY controls; a failed
    /// control exits 2.
    #[arg(long)]
    pub controls: bool,
    /// Where PERTURBED plants its change (`L3/ffn_down@2`); default the
    /// middle of the forward.
    #[arg(long, value_name = "KEY", requires = "controls")]
    pub perturb_at: Option<String>,
    /// Compare only slot N of A (`none`: the taps without a slot) ...
    #[arg(long, value_name = "N|none")]
    pub slot_a: Option<String>,
    /// ... against slot M of B.
    #[arg(long, value_name = "M|none")]
    pub slot_b: Option<String>,
    /// Compare every position, also those past where the runs' input tokens
    /// part (greedy generation chose differently, or other prompts): by
    /// default they are left out. The probe "a slot fed another prompt must
    /// diverge" needs it.
    #[arg(long)]
    pub all_positions: bool,
    /// Compare only the taps both trees hold: taps in one tree only (a
    /// narrower selection, a shorter run) do not make the exit 1. By
    /// default they do, and when nothing is left to compare the exit is 2.
    #[arg(long)]
    pub common_only: bool,
    /// The report as JSON on stdout (schema in docs/GUIDE.md).
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report: a chart of error against
    /// depth, a layer × stage heatmap whose cells open each op's positions,
    /// inputs and statistics, and the red rows.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Every metric column: max rel, RMSE, NMSE, SQNR, max ULP, equal, argmax.
    #[arg(short = 'm', long)]
    pub all_metrics: bool,
    /// Row order: forward, or growth (largest error jump first).
    #[arg(long, value_enum, default_value = "forward")]
    pub sort: Sort,
    /// Only the red rows.
    #[arg(long)]
    pub only_red: bool,
    /// How many error-growth jumps to name.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub growth_top: usize,
    /// Color: auto (only on a terminal), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorArg,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ColorArg {
    Auto,
    Always,
    Never,
}

fn slot(flag: &str, v: &Option<String>) -> anyhow::Result<Option<Option<u32>>> {
    match v.as_deref() {
        None => Ok(None),
        Some("none") => Ok(Some(None)),
        Some(n) => n
            .parse()
            .map(|n| Some(Some(n)))
            .map_err(|_| anyhow::anyhow!("{flag} {n:?}: expected a slot number or `none`")),
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal, and
/// only once [`Bar::show`] is called.
struct Bar(indicatif::ProgressBar);

impl Bar {
    /// Lets the bar be drawn: until the trees have passed their checks,
    /// nothing of the diff is shown.
    fn show(&self) {
        self.0
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }
}

impl Progress for Bar {
    fn start(&self, total: u64) {
        self.0.set_length(total);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// What the flags ask, parsed before any tree is opened.
struct Settings {
    tolerance: Tolerance,
    perturb_at: Option<At>,
    slot_a: Option<Option<u32>>,
    slot_b: Option<Option<u32>>,
}

impl Settings {
    fn parse(args: &Args) -> anyhow::Result<Settings> {
        let tolerance = if args.bitwise {
            Tolerance::bitwise()
        } else {
            Tolerance::parse(&args.tolerance)?
        };
        let perturb_at = match &args.perturb_at {
            Some(s) => Some(s.parse::<At>().map_err(|_| {
                anyhow::anyhow!("--perturb-at {s:?}: expected a key like L3/ffn_down@2 or logits@0")
            })?),
            None => None,
        };
        Ok(Settings {
            tolerance,
            perturb_at,
            slot_a: slot("--slot-a", &args.slot_a)?,
            slot_b: slot("--slot-b", &args.slot_b)?,
        })
    }
}

/// A report and the HTML page asked for, computed and not yet written.
struct Computed {
    report: diff::DiffReport,
    html: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    // Its steps shared by every core are started from a thread of the pool
    // (diff::pool says why).
    diff::pool::run_on(|| run_on_the_pool(args))
}

fn run_on_the_pool(args: Args) -> anyhow::Result<u8> {
    let start = std::time::Instant::now();
    let settings = Settings::parse(&args)?;
    let mut paths = vec![args.a.as_path(), args.b.as_path()];
    paths.extend(args.truth.as_deref());
    let computed = match compare_while_checking(&args, &settings, &paths) {
        Some(computed) => computed,
        // A tree that could not be opened, or failed its last check: what
        // was computed is thrown away, and the trees are opened again, every
        // check made before anything else, so that the error (or, for a tree
        // its owned entries prove sound, the report) is the one it always was.
        None => compare_checked(&args, &settings, &paths),
    }?;
    let code = write(&args, &computed)?;
    diff::timing::mark("written");
    if diff::timing::on() {
        eprintln!("{}", diff::timing::line(start));
    }
    // The process ends here: freeing the report's many small allocations
    // one by one would only delay the exit.
    std::mem::forget(computed);
    Ok(code)
}

/// The diff computed while the trees' last checks run beside it on the
/// pool (capture::Unsealed): most of opening a tree is recomputing its
/// directory hashes from its records, and no step of the diff waits on
/// that but its outcome. `None` where a tree could not be opened or
/// failed its check: nothing computed here leaves this function then.
fn compare_while_checking(
    args: &Args,
    settings: &Settings,
    paths: &[&std::path::Path],
) -> Option<anyhow::Result<Computed>> {
    let opened = TreeReader::open_all_unsealed(paths)
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    diff::timing::mark("opened");
    let bar = progress_bar();
    let (checked, computed) = diff::pool::side_by_side(
        || {
            let checked = capture::Unsealed::check_all(&opened);
            if let (true, Some(bar)) = (checked, &bar) {
                bar.show();
            }
            checked
        },
        || {
            let truth = opened.get(2).map(capture::Unsealed::tree);
            compare(
                args,
                settings,
                (opened[0].tree(), opened[1].tree(), truth),
                &bar,
            )
        },
    );
    // The process ends soon: the trees' many small allocations are not
    // freed one by one.
    std::mem::forget(opened);
    checked.then_some(computed)
}

/// The diff of trees opened with every check made first.
fn compare_checked(
    args: &Args,
    settings: &Settings,
    paths: &[&std::path::Path],
) -> anyhow::Result<Computed> {
    let mut opened = TreeReader::open_all(paths).into_iter();
    let (a, b) = (opened.next().expect("A"), opened.next().expect("B"));
    // Errors are reported A first, then B, then the truth.
    let (a, b, truth) = (a?, b?, opened.next().transpose()?);
    diff::timing::mark("opened");
    let bar = progress_bar();
    if let Some(bar) = &bar {
        bar.show();
    }
    let computed = compare(args, settings, (&a, &b, truth.as_ref()), &bar);
    std::mem::forget((a, b, truth));
    computed
}

/// The report of `a` against `b` (and the truth), and its HTML page where
/// asked: nothing written.
fn compare(
    args: &Args,
    settings: &Settings,
    (a, b, truth): (&TreeReader, &TreeReader, Option<&TreeReader>),
    bar: &Option<Bar>,
) -> anyhow::Result<Computed> {
    if let (Some(t), false) = (truth, args.force_truth) {
        if let Some(why) = diff::truth::not_all_f64(t.manifest()) {
            anyhow::bail!(
                "{}: not a truth: {why}; a truth must compute every op in f64 \
                 (--force-truth uses it anyway)",
                t.path().display()
            );
        }
    }
    let (slot_a, slot_b) = (settings.slot_a, settings.slot_b);
    let mut notes = Vec::new();
    // Tensor-parallel trees are compared unsharded (diff::unshard).
    let tp = super::diff_tp::Views::new((a, b), truth, &mut notes)?;
    let (a_tp, b_tp, t_tp) = tp.trees((a, b), truth);
    // --align: the side with the extra leading tokens is shifted (a truth
    // goes with A).
    let shift = u32::try_from(args.align.unsigned_abs())
        .map_err(|_| anyhow::anyhow!("--align {}: too large", args.align))?;
    let shifted_a = (args.align < 0).then(|| diff::align::Shifted::new(a_tp, shift));
    let shifted_t = match (t_tp, args.align < 0) {
        (Some(t), true) => Some(diff::align::Shifted::new(t, shift)),
        _ => None,
    };
    let shifted_b = (args.align > 0).then(|| diff::align::Shifted::new(b_tp, shift));
    if args.align != 0 {
        notes.push(Note::Aligned { shift: args.align });
    }
    let a_ref: &dyn diff::Tree = shifted_a.as_ref().map_or(a_tp, |s| s as _);
    let b_ref: &dyn diff::Tree = shifted_b.as_ref().map_or(b_tp, |s| s as _);
    let t_ref: Option<&dyn diff::Tree> = match (&shifted_t, t_tp) {
        (Some(s), _) => Some(s as _),
        (None, Some(t)) => Some(t),
        _ => None,
    };
    if !args.all_positions {
        check_prompts(a_ref, b_ref, "B", slot_a, slot_b, args.align)?;
        if let Some(t) = t_ref {
            check_prompts(a_ref, t, "T", slot_a, None, 0)?;
        }
    }
    let mut trees = vec![a_ref, b_ref];
    trees.extend(t_ref);
    let reconciled = diff::layout::reconcile(&trees)?;
    let stages = diff::layout::reconciled_stages(&reconciled);
    if !stages.is_empty() {
        notes.push(Note::LayoutsReconciled { stages });
    }
    let pick =
        |i: usize| -> &dyn diff::Tree { reconciled[i].as_ref().map_or(trees[i], |r| r as _) };
    let (a_ref, b_ref) = (pick(0), pick(1));
    let t_ref = t_ref.map(|_| pick(2));

    let opts = Options {
        tolerance: settings.tolerance.clone(),
        slot_a,
        slot_b,
        all_positions: args.all_positions,
        progress: bar.as_ref().map(|b| b as &(dyn Progress + Sync)),
        common_only: args.common_only,
    };
    diff::timing::mark("checked");
    let mut report = diff::diff(a_ref, b_ref, t_ref, &opts)?;
    tp.explain(&report, (a, b), &mut notes)?;
    report.notes = notes;
    if args.controls {
        let c = controls::run(a_ref, b_ref, &opts, settings.perturb_at.as_ref())?;
        controls::attach(&mut report, c);
    }
    let html = match &args.html {
        Some(_) => {
            let ctx = diff::render::html::DiffContext::read(&report, a_ref, b_ref)?;
            Some(diff::render::html::render_diff(&report, &ctx))
        }
        None => None,
    };
    // Freeing these would only delay the exit.
    std::mem::forget(reconciled);
    std::mem::forget((shifted_a, shifted_b, shifted_t));
    std::mem::forget(tp);
    Ok(Computed { report, html })
}

/// A progress bar on stderr when it is a terminal, hidden until shown.
fn progress_bar() -> Option<Bar> {
    std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::hidden(),
        );
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .expect("a valid template"),
        );
        Bar(pb)
    })
}

/// Writes the report where the flags ask: `--html`, then `--json` or the
/// table on stdout; every unreadable tap is named on stderr as well.
/// Returns the exit code of the report's outcome.
fn write(args: &Args, computed: &Computed) -> anyhow::Result<u8> {
    let report = &computed.report;
    if let (Some(path), Some(html)) = (&args.html, &computed.html) {
        std::fs::write(path, html).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    let code = exit::report(exit::of_outcome(report.outcome), |out| {
        if args.json {
            return diff::render::json::write(report, out);
        }
        let color = match args.color {
            ColorArg::Always => true,
            ColorArg::Never => false,
            ColorArg::Auto => std::io::stdout().is_terminal(),
        };
        let table = TableOptions {
            color,
            all_metrics: args.all_metrics,
            sort: args.sort,
            only_red: args.only_red,
            growth_top: args.growth_top,
        };
        out.write_all(diff::render::table::render(report, &table).as_bytes())
    })?;
    // A damaged tree is named on stderr too, as every file that cannot be
    // read is; the table or JSON above still holds its row.
    for row in &report.rows {
        if let Some(why) = &row.unreadable {
            eprintln!("taptree: {}: could not read: {why}", row.name());
        }
    }
    Ok(code)
}

/// Exit 2 when the two runs were fed different prompts: their positions
/// compute different things, and no comparison of them means anything.
fn check_prompts(
    a: &dyn diff::Tree,
    other: &dyn diff::Tree,
    name: &str,
    slot_a: Option<Option<u32>>,
    slot_b: Option<Option<u32>>,
    align: i64,
) -> anyhow::Result<()> {
    let (ra, rb) = (&a.head().run, &other.head().run);
    let pairs: Vec<(Option<u32>, Option<u32>)> = match (slot_a, slot_b) {
        (None, None) => {
            let n = |r: &capture::RunInfo| {
                r.extra
                    .get("slots")
                    .and_then(|s| s.as_array())
                    .map_or(0, |s| s.len())
            };
            let slots = n(ra).min(n(rb)) as u32;
            std::iter::once((None, None))
                .chain((1..slots).map(|s| (Some(s), Some(s))))
                .collect()
        }
        (x, y) => vec![(x.flatten(), y.flatten())],
    };
    for (sa, sb) in pairs {
        let Some(d) = diff::inputs::prompts_differ(ra, rb, sa, sb) else {
            continue;
        };
        let slot = sa.map_or(String::new(), |s| format!(" (slot {s})"));
        let hint = match d.align_hint {
            Some(h) if name == "B" => format!("; the prompts agree under --align {}", h + align),
            _ => String::new(),
        };
        anyhow::bail!(
            "{} and {}: the runs were fed different prompts{slot}: first differing token at position {}: \
             A has {}, {name} has {} (prompts of {} and {} tokens){hint}; nothing was compared",
            a.path().display(),
            other.path().display(),
            d.pos,
            d.token_a,
            d.token_b,
            d.len_a,
            d.len_b
        );
    }
    Ok(())
}
