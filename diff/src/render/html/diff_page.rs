//! `taptree diff`'s page: a [`DiffReport`] laid out on a [`Page`], with what the
//! report does not hold read from the trees by [`DiffContext::read`]: the
//! stage graph (a row's inputs), the tokens, and `stat` of both sides at
//! each differing row's worst position.

use super::page::{num, Detail, Marker, MarkerKind, Page, PageRow, PosValue, Series, Verdict};
use crate::graph::StageGraph;
use crate::report::{Cause, DiffOutcome, DiffReport, Row, Status};
use crate::stat::{self, PosStat};
use crate::tolerance::short;
use crate::tree::Tree;
use crate::Error;
use rayon::prelude::*;
use std::collections::{BTreeSet, HashMap};

/// What a diff's page shows beyond its report.
#[derive(Debug, Clone, Default)]
pub struct DiffContext {
    /// Per row (as `report.rows`): the indices of its input rows.
    pub inputs: Vec<Vec<usize>>,
    /// Per row: statistics of A and B at its worst position.
    pub stats: Vec<Vec<Detail>>,
    /// Each position's token as text (`#id` where the manifest has no text).
    pub tokens: Vec<String>,
    /// The number of prompt (prefill) positions.
    pub prompt_len: Option<u32>,
    /// Per row: its local error from `replay` (its output against its
    /// recomputation from its own inputs), where known.
    pub local_error: Vec<Option<f64>>,
}

impl DiffContext {
    /// Reads the stage graph and the tokens from A's (and B's) manifest and
    /// computes `stat` of both trees at every row that is not bitwise equal.
    pub fn read(report: &DiffReport, a: &dyn Tree, b: &dyn Tree) -> Result<DiffContext, Error> {
        let (ma, mb) = (a.manifest(), b.manifest());
        let vocabulary = crate::walk::vocabulary(ma, mb);
        let layers: BTreeSet<u32> = report.rows.iter().filter_map(|r| r.layer).collect();
        let graph = StageGraph::new(&vocabulary, &layers);
        let index: HashMap<(Option<u32>, &str), usize> = report
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.layer, r.stage.as_str()), i))
            .collect();
        let inputs = report
            .rows
            .iter()
            .map(|r| {
                graph
                    .inputs(r.layer, &r.stage)
                    .iter()
                    .filter_map(|(l, s)| index.get(&(*l, s.as_str())).copied())
                    .collect()
            })
            .collect();
        let (ia, ib) = (entry_index(a), entry_index(b));
        let stats = report
            .rows
            .par_iter()
            .map(|r| row_stats(r, [("A", a, &ia), ("B", b, &ib)]))
            .collect::<Result<_, Error>>()?;
        let (tokens, prompt_len) = tokens(&ma.run);
        Ok(DiffContext {
            inputs,
            stats,
            tokens,
            prompt_len,
            local_error: Vec::new(),
        })
    }
}

/// The prompt's and the generated tokens (slot 0) as text: the manifest's
/// `token_pieces` where it has them, else `#id`.
pub fn tokens(run: &capture::RunInfo) -> (Vec<String>, Option<u32>) {
    let mut ids: Vec<u64> = run.prompt_tokens.iter().map(|&t| t as u64).collect();
    if let Some(g) = run
        .extra
        .get("generated_tokens")
        .and_then(|g| g.get(0))
        .and_then(|g| g.as_array())
    {
        ids.extend(g.iter().filter_map(|t| t.as_u64()));
    }
    let pieces = run
        .extra
        .get("token_pieces")
        .and_then(|p| p.get(0))
        .and_then(|p| p.as_array());
    let text = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            pieces
                .and_then(|p| p.get(i))
                .and_then(|p| p.as_str())
                .map_or_else(|| format!("#{id}"), str::to_string)
        })
        .collect();
    let prompt = (!run.prompt_tokens.is_empty()).then_some(run.prompt_tokens.len() as u32);
    (text, prompt)
}

/// Each tree's entries by (layer, stage, slot): one lookup per row instead
/// of a scan of the manifest.
type EntryIndex<'a> = HashMap<(Option<u32>, &'a str, Option<u32>), Vec<usize>>;

fn entry_index(tree: &dyn Tree) -> EntryIndex<'_> {
    let mut index: EntryIndex<'_> = HashMap::new();
    for (i, e) in tree.manifest().entries.iter().enumerate() {
        index
            .entry((e.key.layer, e.key.stage.as_str(), e.key.slot))
            .or_default()
            .push(i);
    }
    index
}

/// `stat` of the row's worst position in one tree; `None` where the tree
/// has no such tap (a row of the other side only).
fn stat_at(tree: &dyn Tree, index: &EntryIndex<'_>, r: &Row) -> Result<Option<PosStat>, Error> {
    let w = r.worst();
    let m = tree.manifest();
    let Some(&i) = index
        .get(&(r.layer, r.stage.as_str(), w.slot))
        .and_then(|list| {
            list.iter()
                .find(|&&i| m.entries[i].key.pos.contains(&w.pos))
        })
    else {
        return Ok(None);
    };
    let e = &m.entries[i];
    let t = tree.read(i)?;
    let rows = e.key.rows().max(1) as usize;
    let width = t.bytes().len() / rows;
    let row = (w.pos - e.key.pos.start) as usize;
    let values = crate::metrics::decode(&t.bytes()[row * width..(row + 1) * width], e.dtype);
    Ok(Some(stat::pos_stat(w.pos, &values)))
}

fn row_stats(
    r: &Row,
    sides: [(&str, &dyn Tree, &EntryIndex<'_>); 2],
) -> Result<Vec<Detail>, Error> {
    // An unreadable row's tap cannot be read again here.
    if matches!(r.status, Status::Equal | Status::Unreadable) || r.positions.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (side, tree, index) in sides {
        if let Some(p) = stat_at(tree, index, r)? {
            out.push(Detail {
                title: format!("stat {side}{}", r.worst().label()),
                lines: stat_lines(&p),
            });
        }
    }
    Ok(out)
}

fn stat_lines(p: &PosStat) -> Vec<String> {
    let mut lines = vec![format!(
        "n {}  min {}  max {}  mean {}  std {}  nonfinite {}  zeros {}",
        p.n,
        short(p.min),
        short(p.max),
        short(p.mean),
        short(p.std),
        p.nonfinite,
        p.zeros
    )];
    let top: Vec<String> = p
        .top
        .iter()
        .map(|(d, v)| format!("d{d} = {}", short(*v)))
        .collect();
    lines.push(format!("largest |x|: {}", top.join(", ")));
    for b in &p.blocks {
        lines.push(format!(
            "blocks of {}: {} of {} crushed (largest/second-largest |x| ≥ {}); worst ratio {} in block {} (d{})",
            b.block,
            b.crushed,
            b.count,
            stat::CRUSHED_RATIO,
            short(b.worst_ratio),
            b.worst_block,
            b.worst_dim
        ));
    }
    lines
}

fn verdict(s: Status) -> Verdict {
    match s {
        Status::Equal => Verdict::Equal,
        Status::Pass => Verdict::Pass,
        Status::Fail => Verdict::Fail,
        Status::Mismatch => Verdict::Mismatch,
        Status::Degenerate => Verdict::Degenerate,
        Status::Unreadable => Verdict::Unreadable,
    }
}

fn cause(c: &Option<Cause>) -> String {
    match c {
        Some(Cause::Origin) => "origin".to_string(),
        Some(Cause::GrewFrom { from }) => {
            format!("grew past tolerance from {}", crate::render::names(from))
        }
        Some(Cause::Inherited { from }) => {
            format!("inherited from {}", crate::render::names(from))
        }
        None => String::new(),
    }
}

fn page_row(r: &Row, i: usize, ctx: &DiffContext) -> PageRow {
    let w = r.worst();
    let m = &w.metrics;
    let value = if r.status == Status::Equal {
        0.0
    } else {
        m.rel_rms
    };
    let cells = vec![
        format!("{:.6} {}", m.cos, w.label()),
        short(m.max_abs),
        short(m.nmse),
        short(m.sqnr_db),
        m.max_ulp.map_or("-".into(), |u| u.to_string()),
        r.growth
            .as_ref()
            .map_or(String::new(), |g| format!("{:+.2e}", g.delta)),
        r.truth.as_ref().map_or(String::new(), |t| {
            format!("{} / {}", short(t.error_a), short(t.error_b))
        }),
        ctx.local_error
            .get(i)
            .copied()
            .flatten()
            .map_or(String::new(), num),
        cause(&r.cause),
    ];
    let mut details = Vec::new();
    if !r.reasons.is_empty() || r.cause.is_some() || r.hint.is_some() || r.unreadable.is_some() {
        let mut lines: Vec<String> = r.reasons.iter().map(crate::render::reason).collect();
        lines.extend(r.cause.as_ref().map(|_| cause(&r.cause)));
        lines.extend(r.hint.as_ref().map(crate::render::hint));
        lines.extend(
            r.unreadable
                .as_ref()
                .map(|why| format!("unreadable: {why}")),
        );
        details.push(Detail {
            title: "verdict".into(),
            lines,
        });
    }
    if let Some(t) = &r.truth {
        details.push(Detail {
            title: format!("against the truth @{}", t.pos),
            lines: vec![format!(
                "relative error A {} (max abs {}), B {} (max abs {}): closer {:?}",
                short(t.error_a),
                short(t.max_abs_a),
                short(t.error_b),
                short(t.max_abs_b),
                t.closer
            )],
        });
    }
    details.extend(ctx.stats.get(i).cloned().unwrap_or_default());
    PageRow {
        layer: r.layer,
        stage: r.stage.clone(),
        verdict: verdict(r.status),
        value,
        cells,
        positions: r
            .positions
            .iter()
            .map(|p| PosValue {
                pos: p.pos,
                slot: p.slot,
                value: if r.status == Status::Equal {
                    0.0
                } else {
                    p.metrics.rel_rms
                },
                pass: p.pass,
            })
            .collect(),
        equal_runs: r.equal.iter().map(|e| (e.slot, e.start, e.end)).collect(),
        inputs: ctx.inputs.get(i).cloned().unwrap_or_default(),
        details,
        tokens: Vec::new(),
    }
}

/// The page of a diff.
pub fn page(report: &DiffReport, ctx: &DiffContext) -> Page {
    let mut facts = Vec::new();
    for (label, t) in [
        ("A", Some(&report.a)),
        ("B", Some(&report.b)),
        ("T", report.truth.as_ref()),
    ] {
        if let Some(t) = t {
            facts.push((
                label.to_string(),
                format!(
                    "{}  {} {} {}  {} taps  root {}",
                    t.path,
                    t.model,
                    t.backend,
                    t.precision,
                    t.taps,
                    crate::render::short_hash(&t.root)
                ),
            ));
        }
    }
    facts.push(("tolerance".into(), report.tolerance.to_string()));
    let mut notes: Vec<String> = Vec::new();
    if let Some(i) = report.first_divergence {
        let r = &report.rows[i];
        notes.push(format!(
            "first diverging op: {}{} — {}",
            r.name(),
            r.worst().label(),
            crate::render::reasons(&r.reasons)
        ));
    }
    for c in &report.controls {
        notes.push(format!(
            "control {}: {} {}",
            c.name().as_str(),
            if c.passed() { "passed" } else { "FAILED" },
            crate::render::finding(&c.finding)
        ));
    }
    notes.extend(report.notes.iter().map(crate::render::note));
    let rows: Vec<PageRow> = report
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| page_row(r, i, ctx))
        .collect();
    let mut series = Vec::new();
    if report.truth.is_some() {
        let side = |f: fn(&crate::report::TruthVerdict) -> f64| {
            report
                .rows
                .iter()
                .map(|r| r.truth.as_ref().map(f))
                .collect()
        };
        series.push(Series {
            name: "A vs truth".into(),
            values: side(|t| t.error_a),
        });
        series.push(Series {
            name: "B vs truth".into(),
            values: side(|t| t.error_b),
        });
    }
    Page {
        title: "taptree diff".into(),
        headline: crate::render::summary(report),
        red: !matches!(
            report.outcome,
            DiffOutcome::Identical | DiffOutcome::WithinTolerance
        ),
        facts,
        notes,
        value_name: "relative RMS error of B against A".into(),
        columns: [
            "min cos @pos",
            "max abs",
            "nmse",
            "sqnr dB",
            "max ulp",
            "growth",
            "truth err A / B",
            "local err",
            "cause",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        series,
        markers: markers(report, ctx),
        tokens: ctx.tokens.clone(),
        prompt_len: ctx.prompt_len,
    }
}

fn markers(report: &DiffReport, ctx: &DiffContext) -> Vec<Marker> {
    let mut out = Vec::new();
    if let Some(i) = report.first_divergence {
        out.push(Marker {
            row: i,
            kind: MarkerKind::FirstDivergence,
            label: "first diverging op".into(),
        });
    }
    if let Some(&i) = report.growth_ranking.first() {
        let delta = report.rows[i].growth.as_ref().map_or(0.0, |g| g.delta);
        out.push(Marker {
            row: i,
            kind: MarkerKind::LargestGrowth,
            label: format!("largest error growth ({delta:+.2e})"),
        });
    }
    let local = ctx
        .local_error
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.filter(|v| !v.is_nan()).map(|v| (i, v)))
        .max_by(|x, y| x.1.total_cmp(&y.1));
    if let Some((i, v)) = local {
        out.push(Marker {
            row: i,
            kind: MarkerKind::LargestLocal,
            label: format!("largest local error ({})", num(v)),
        });
    }
    if let (Some(i), true) = (report.first_inexact, report.first_divergence.is_none()) {
        out.push(Marker {
            row: i,
            kind: MarkerKind::Note,
            label: "first op not bitwise equal".into(),
        });
    }
    out
}

impl DiffContext {
    /// Sets each row's local error from `(layer, stage, error)` triples
    /// (`replay`'s rows); rows it does not name keep none.
    pub fn with_local_errors(
        mut self,
        report: &DiffReport,
        errors: impl IntoIterator<Item = (Option<u32>, String, f64)>,
    ) -> DiffContext {
        let index: HashMap<(Option<u32>, &str), usize> = report
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.layer, r.stage.as_str()), i))
            .collect();
        self.local_error = vec![None; report.rows.len()];
        for (layer, stage, e) in errors {
            if let Some(&i) = index.get(&(layer, stage.as_str())) {
                self.local_error[i] = Some(e);
            }
        }
        self
    }
}
