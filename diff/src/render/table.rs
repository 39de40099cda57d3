//! The table for people: one row per (layer, stage) in forward order, runs of
//! bitwise-equal rows folded into one line, then the first diverging op, the
//! largest error growth, the truth verdict, the controls and the summary.

use crate::report::{Cause, Closer, DiffOutcome, DiffReport, Row, Status};
use crate::stat::StatReport;
use crate::tolerance::short;
use std::fmt::Write as _;

/// Row order of the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Sort {
    /// Forward order (the order of the forward pass).
    #[default]
    Forward,
    /// Largest error growth first.
    Growth,
}

/// What the table shows.
#[derive(Debug, Clone, Default)]
pub struct TableOptions {
    /// ANSI colors (the CLI sets it only on a TTY).
    pub color: bool,
    /// Every metric column, not just min cos and max abs.
    pub all_metrics: bool,
    /// The row order.
    pub sort: Sort,
    /// Only red rows (and the folded counts of the rest).
    pub only_red: bool,
    /// How many error-growth jumps to list.
    pub growth_top: usize,
}

struct Paint {
    on: bool,
}

impl Paint {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn red(&self, s: &str) -> String {
        self.wrap("31;1", s)
    }
    fn green(&self, s: &str) -> String {
        self.wrap("32", s)
    }
    fn yellow(&self, s: &str) -> String {
        self.wrap("33", s)
    }
    fn dim(&self, s: &str) -> String {
        self.wrap("2", s)
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
}

fn status_word(s: Status) -> &'static str {
    match s {
        Status::Equal => "equal",
        Status::Pass => "ok",
        Status::Fail => "FAIL",
        Status::Mismatch => "MISMATCH",
        Status::Degenerate => "DEGENERATE",
        Status::Unreadable => "UNREADABLE",
    }
}

fn cause_word(row: &Row) -> String {
    match &row.cause {
        Some(Cause::Origin) => "origin".into(),
        Some(Cause::GrewFrom { from }) => format!("grew past tolerance <- {}", super::names(from)),
        Some(Cause::Inherited { from }) => format!("inherited <- {}", super::names(from)),
        None => String::new(),
    }
}

fn tree_line(label: &str, t: &crate::report::TreeInfo) -> String {
    let what: Vec<&str> = [t.model.as_str(), t.backend.as_str(), t.precision.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    format!(
        "{label}  {}  ({}{}{} taps, root {})",
        t.path,
        what.join(" "),
        if what.is_empty() { "" } else { ", " },
        t.taps,
        super::short_hash(&t.root)
    )
}

/// The diff as the terminal table (see the module doc); ANSI colors only when
/// `opts.color`.
pub fn render(report: &DiffReport, opts: &TableOptions) -> String {
    let p = Paint { on: opts.color };
    let mut out = String::new();
    let _ = writeln!(out, "{}", tree_line("A", &report.a));
    let _ = writeln!(out, "{}", tree_line("B", &report.b));
    if let Some(t) = &report.truth {
        let _ = writeln!(out, "{}", tree_line("T", t));
    }
    for n in &report.notes {
        let _ = writeln!(out, "{}", p.dim(&super::note(n)));
    }
    if report.outcome == DiffOutcome::Identical {
        let _ = writeln!(out, "{}", p.green(&super::summary(report)));
        render_controls(&mut out, report, &p);
        return out;
    }
    let _ = writeln!(
        out,
        "{}",
        p.dim(&format!("tolerance: {}", report.tolerance))
    );
    let _ = writeln!(out);

    render_rows(&mut out, report, opts, &p);
    render_findings(&mut out, report, opts, &p);
    render_footer(&mut out, report, &p);
    out
}

/// The column header, then one line per row (equal runs folded).
fn render_rows(out: &mut String, report: &DiffReport, opts: &TableOptions, p: &Paint) {
    let mut header = format!(
        "{:<28} {:<10} {:>18} {:>10} {:>10}",
        "op", "verdict", "min cos @pos", "max abs", "growth"
    );
    if opts.all_metrics {
        header.push_str(&format!(
            " {:>10} {:>10} {:>10} {:>9} {:>9} {:>10} {:>8}",
            "max rel", "rmse", "nmse", "sqnr dB", "max ulp", "eq", "argmax"
        ));
    }
    if report.truth.is_some() {
        header.push_str(&format!(" {:>22}", "err A / err B vs T"));
    }
    header.push_str("  cause");
    let _ = writeln!(out, "{}", p.bold(&header));

    let mut order: Vec<usize> = (0..report.rows.len()).collect();
    if opts.sort == Sort::Growth {
        let mut ranked = report.growth_ranking.clone();
        ranked.extend(order.iter().filter(|i| !report.growth_ranking.contains(i)));
        order = ranked;
    }
    // Rows folded into one line: (bitwise equal, within tolerance). Only
    // `--only-red` folds the second kind; the line says which it folded.
    let mut folded = (0usize, 0usize);
    let flush = |out: &mut String, folded: &mut (usize, usize)| {
        let line = match *folded {
            (0, 0) => return,
            (equal, 0) => format!("  ... {equal} rows bitwise equal"),
            (0, ok) => format!("  ... {ok} rows within tolerance, not shown"),
            (equal, ok) => format!(
                "  ... {} rows not shown: {equal} bitwise equal, {ok} within tolerance",
                equal + ok
            ),
        };
        let _ = writeln!(out, "{}", p.dim(&line));
        *folded = (0, 0);
    };
    for &i in &order {
        let row = &report.rows[i];
        let quiet = row.status == Status::Equal || (opts.only_red && !row.status.is_red());
        if quiet && opts.sort == Sort::Forward {
            if row.status == Status::Equal {
                folded.0 += 1;
            } else {
                folded.1 += 1;
            }
            continue;
        }
        if quiet {
            continue;
        }
        flush(out, &mut folded);
        let _ = writeln!(out, "{}", format_row(report, i, opts, p));
    }
    flush(out, &mut folded);
    let _ = writeln!(out);
}

/// The first diverging op, the first inexact one, error growth and truth.
fn render_findings(out: &mut String, report: &DiffReport, opts: &TableOptions, p: &Paint) {
    if let Some(i) = report.first_divergence {
        let row = &report.rows[i];
        let w = row.worst();
        let first = row.first_failing().unwrap_or(w);
        let worst = if first.label() == w.label() {
            String::new()
        } else {
            format!(", worst {}", w.label())
        };
        let _ = writeln!(
            out,
            "{} {}{} ({}{worst}): {}",
            p.red("first diverging op:"),
            p.bold(&row.name()),
            first.label(),
            cause_word(row),
            super::reasons(&row.reasons)
        );
        if let Some(t) = &row.truth {
            let _ = writeln!(out, "{}", truth_sentence(row, t));
        }
        if let Some(h) = &row.hint {
            let _ = writeln!(out, "{}", p.yellow(&super::hint(h)));
        }
    }
    // Where the runs first differ at all, when that is before the first op
    // out of tolerance: the change may start there, hidden by the tolerance.
    if let Some(e) = report
        .first_inexact
        .filter(|&e| report.first_divergence.is_none_or(|d| e < d))
    {
        let row = &report.rows[e];
        let _ = writeln!(
            out,
            "first op not bitwise equal: {} ({}), {}",
            p.bold(&row.name()),
            status_word(row.status),
            match report.first_divergence {
                Some(d) => format!("{} rows before the first diverging op", d - e),
                None => "within tolerance from there on".to_string(),
            }
        );
    }
    let top: Vec<String> = report
        .growth_ranking
        .iter()
        .take(opts.growth_top.max(1))
        .map(|&i| {
            let r = &report.rows[i];
            let g = r.growth.as_ref().unwrap();
            format!(
                "{}@{} +{} ({} -> {})",
                r.name(),
                g.pos,
                short(g.delta),
                short(g.input_error),
                short(g.output_error)
            )
        })
        .collect();
    if !top.is_empty() {
        let _ = writeln!(
            out,
            "largest error growth (relative RMS error): {}",
            top.join(", ")
        );
    }
    let red_truth: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.status.is_red() && r.truth.is_some())
        .collect();
    if !red_truth.is_empty() {
        let (a, b) =
            red_truth
                .iter()
                .fold((0, 0), |(a, b), r| match r.truth.as_ref().unwrap().closer {
                    Closer::A => (a + 1, b),
                    Closer::B => (a, b + 1),
                    _ => (a, b),
                });
        let _ = writeln!(
            out,
            "truth: of {} red rows, A is closer to T in {a}, B in {b}",
            red_truth.len()
        );
    }
    if report.truth.is_some() {
        let c = &report.counts;
        let _ = writeln!(
            out,
            "truth over every row: A is closer to T in {} rows, B in {}, neither clearly in {} (of {} rows compared with T)",
            c.truth_closer_a,
            c.truth_closer_b,
            c.truth_neither,
            c.truth_closer_a + c.truth_closer_b + c.truth_neither
        );
    }
}

/// Inputs that part, one-sided positions, counts, controls and the summary.
fn render_footer(out: &mut String, report: &DiffReport, p: &Paint) {
    if let Some(split) = &report.inputs_split {
        let slot = split
            .slot
            .map_or(String::new(), |s| format!(" of slot {s}"));
        let _ = writeln!(
            out,
            "{}",
            p.yellow(&format!(
                "inputs differ from position {}{slot} (A token {}, B token {}): {}",
                split.pos,
                split.token_a,
                split.token_b,
                match report.counts.positions_inputs_differ {
                    0 => "compared all the same (--all-positions)".to_string(),
                    n => format!(
                        "the runs were fed different tokens; {n} later positions not compared"
                    ),
                }
            ))
        );
    }
    if !report.only_in_a.is_empty() || !report.only_in_b.is_empty() {
        let list = |v: &[capture::Key]| {
            let mut s = v
                .iter()
                .take(4)
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            if v.len() > 4 {
                s.push_str(&format!(", ... ({} in all)", v.len()));
            }
            s
        };
        if !report.only_in_a.is_empty() {
            let _ = writeln!(
                out,
                "{}",
                p.yellow(&format!("only in A: {}", list(&report.only_in_a)))
            );
        }
        if !report.only_in_b.is_empty() {
            let _ = writeln!(
                out,
                "{}",
                p.yellow(&format!("only in B: {}", list(&report.only_in_b)))
            );
        }
    }
    let c = &report.counts;
    let _ = writeln!(
        out,
        "{}",
        p.dim(&format!(
            "{} positions matched; {} taps compared, {} skipped as equal by hash; {} bytes read",
            c.positions, c.taps_compared, c.taps_skipped, c.bytes_read
        ))
    );
    render_controls(out, report, p);
    let summary = super::summary(report);
    let summary = match report.outcome {
        DiffOutcome::Diverged => p.red(&summary),
        DiffOutcome::WithinTolerance | DiffOutcome::Identical => p.green(&summary),
        _ => p.yellow(&summary),
    };
    let _ = writeln!(out, "{summary}");
}

fn truth_sentence(row: &Row, t: &crate::report::TruthVerdict) -> String {
    let at = format!("{}@{}", row.name(), t.pos);
    let errs = format!(
        "relative error vs T: A {}, B {}",
        short(t.error_a),
        short(t.error_b)
    );
    match t.closer {
        Closer::A => format!("truth: B is the inaccurate side at {at} ({errs})"),
        Closer::B => format!("truth: A is the inaccurate side at {at} ({errs})"),
        Closer::Neither => format!("truth: A and B are about equally far from T at {at} ({errs})"),
        Closer::Unknown => format!("truth: T holds no tap for {at}"),
    }
}

fn render_controls(out: &mut String, report: &DiffReport, p: &Paint) {
    for c in &report.controls {
        let mark = if c.passed() {
            p.green("passed")
        } else {
            p.red("FAILED")
        };
        let _ = writeln!(
            out,
            "control {}: {mark}: {}",
            c.name().as_str(),
            super::finding(&c.finding)
        );
        for f in c.flagged().iter().take(8) {
            let _ = writeln!(out, "  {} {} is {}", f.tree.as_str(), f.key, f.what);
        }
        if c.flagged().len() > 8 {
            let _ = writeln!(out, "  ... {} flagged in all", c.flagged().len());
        }
    }
}

fn format_row(report: &DiffReport, i: usize, opts: &TableOptions, p: &Paint) -> String {
    let row = &report.rows[i];
    let w = row.worst();
    let m = &w.metrics;
    let verdict = status_word(row.status);
    let verdict = match row.status {
        Status::Fail | Status::Mismatch => p.red(&format!("{verdict:<10}")),
        Status::Degenerate | Status::Unreadable => p.yellow(&format!("{verdict:<10}")),
        Status::Pass => p.green(&format!("{verdict:<10}")),
        Status::Equal => p.dim(&format!("{verdict:<10}")),
    };
    let cos = format!("{:.6} {}", m.cos, w.label());
    let growth = row
        .growth
        .as_ref()
        .map_or(String::new(), |g| format!("{:+.2e}", g.delta));
    let mut s = format!(
        "{:<28} {verdict} {:>18} {:>10} {:>10}",
        row.name(),
        cos,
        short(m.max_abs),
        growth
    );
    if opts.all_metrics {
        let ulp = m.max_ulp.map_or("-".to_string(), |u| u.to_string());
        let eq = format!("{}/{}", m.bitwise_equal, m.n);
        let argmax = if row.stage == "logits" {
            format!("{}/{}", row.total.argmax_agree, row.total.rows)
        } else {
            "-".into()
        };
        s.push_str(&format!(
            " {:>10} {:>10} {:>10} {:>9} {:>9} {:>10} {:>8}",
            short(m.max_rel),
            short(m.rmse),
            short(m.nmse),
            short(m.sqnr_db),
            ulp,
            eq,
            argmax
        ));
    }
    if report.truth.is_some() {
        let t = row.truth.as_ref().map_or(String::new(), |t| {
            let mark = match t.closer {
                Closer::A => " A<",
                Closer::B => " B<",
                _ => "",
            };
            format!("{} / {}{mark}", short(t.error_a), short(t.error_b))
        });
        s.push_str(&format!(" {t:>22}"));
    }
    let cause = cause_word(row);
    if !cause.is_empty() {
        s.push_str("  ");
        s.push_str(&cause);
    }
    if row.hint.is_some() {
        s.push_str("  ");
        s.push_str(&p.yellow("layout?"));
    }
    if row.status == Status::Mismatch || row.status == Status::Degenerate {
        s.push_str("  ");
        s.push_str(&super::reasons(&row.reasons));
    }
    if let Some(why) = &row.unreadable {
        s.push_str("  could not read: ");
        s.push_str(&why.to_string());
    }
    s
}

/// `taptree stat`: one line per tap position.
pub fn render_stat(stat: &StatReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}  (root {})",
        stat.path,
        super::short_hash(&stat.root)
    );
    let _ = writeln!(out, "crushed: {}", stat.crushed_rule);
    let _ = writeln!(
        out,
        "{:<30} {:>11} {:>11} {:>10} {:>10}  {:<34} {:>18} {:>14}",
        "tap",
        "min",
        "max",
        "mean",
        "std",
        "top |x| (dim:value)",
        "crushed/256 worst",
        "crushed/32"
    );
    for t in &stat.taps {
        for p in &t.positions {
            let key = match t.key.split_once('@') {
                Some((head, _)) => format!("{head}@{}", p.pos),
                None => t.key.clone(),
            };
            let top: Vec<String> = p
                .top
                .iter()
                .take(3)
                .map(|(d, v)| format!("{d}:{}", short(*v)))
                .collect();
            let b256 = &p.blocks[0];
            let b32 = &p.blocks[1];
            let mut line = format!(
                "{:<30} {:>11} {:>11} {:>10} {:>10}  {:<34} {:>18} {:>14}",
                key,
                short(p.min),
                short(p.max),
                short(p.mean),
                short(p.std),
                top.join(" "),
                format!(
                    "{}/{} x{}",
                    b256.crushed,
                    b256.count,
                    short(b256.worst_ratio)
                ),
                format!("{}/{}", b32.crushed, b32.count),
            );
            if p.nonfinite > 0 {
                line.push_str(&format!("  {} nonfinite", p.nonfinite));
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    out
}
