//! `taptree replay --html`: the replay report on the diff's page. One row
//! per (layer, stage), valued by its local error; its positions are each
//! position's relative RMS error against the recomputation; its inputs are
//! the stage graph's; the op with the largest local error and the first op
//! above tolerance are marked.

use capture::Manifest;
use diff::graph::StageGraph;
use diff::render::html::{diff_page, Detail, Marker, MarkerKind, Page, PageRow, PosValue, Verdict};
use replay::{ReplayOutcome, ReplayReport, Row};
use std::collections::{BTreeSet, HashMap};

/// The page of a replay report of the tree whose manifest is `m`.
pub fn page(r: &ReplayReport, m: &Manifest) -> Page {
    let layers: BTreeSet<u32> = r.rows.iter().filter_map(|x| x.layer).collect();
    let graph = StageGraph::new(&m.stages, &layers);
    let index: HashMap<(Option<u32>, &str), usize> = r
        .rows
        .iter()
        .enumerate()
        .map(|(i, x)| ((x.layer, x.stage.as_str()), i))
        .collect();
    let rows: Vec<PageRow> = r
        .rows
        .iter()
        .map(|x| page_row(x, r.tolerance, &graph, &index))
        .collect();
    let markers = markers(r);
    let (tokens, prompt_len) = diff_page::tokens(&m.run);
    let mut notes = vec![format!(
        "every op recomputed in {} from the tree's own inputs; local error: relative RMS of the tree's op against it",
        r.precision
    )];
    if !r.reconciled.is_empty() {
        notes.push(format!(
            "declared layouts reconciled: {} read in interleaved rotary order",
            r.reconciled.join(", ")
        ));
    }
    Page {
        title: "taptree replay".into(),
        headline: headline(r),
        red: r.outcome == ReplayOutcome::Above,
        facts: vec![
            (
                "tree".into(),
                format!("{} ({} {})", r.tree, r.tree_backend, r.tree_precision),
            ),
            ("model".into(), format!("{} ({})", r.model, r.model_check)),
        ],
        notes,
        value_name: "local error (relative RMS against the recomputation)".into(),
        columns: ["local err", "worst", "rel rms", "cos", "max abs"]
            .map(String::from)
            .to_vec(),
        rows,
        series: Vec::new(),
        markers,
        tokens,
        prompt_len,
    }
}

/// The page's row of one replayed op: its local error, its worst position,
/// each position's error and its inputs in the stage graph.
fn page_row(
    x: &Row,
    tolerance: f64,
    graph: &StageGraph,
    index: &HashMap<(Option<u32>, &str), usize>,
) -> PageRow {
    let verdict = if x.above {
        Verdict::Fail
    } else if x.whole.bitwise_equal == x.whole.n {
        Verdict::Equal
    } else {
        Verdict::Pass
    };
    let w = &x.worst;
    let at = match x.worst_slot {
        Some(s) => format!("@{}#{s}", x.worst_pos),
        None => format!("@{}", x.worst_pos),
    };
    PageRow {
        layer: x.layer,
        stage: x.stage.clone(),
        verdict,
        value: x.local_error,
        cells: vec![
            format!("{:.3e}", x.local_error),
            at.clone(),
            format!("{:.3e}", w.rel_rms),
            format!("{:.6}", w.cos),
            format!("{:.3e}", w.max_abs),
        ],
        positions: x
            .position_errors
            .iter()
            .map(|p| PosValue {
                pos: p.pos,
                slot: p.slot,
                value: p.rel_rms,
                pass: p.rel_rms <= tolerance,
            })
            .collect(),
        equal_runs: Vec::new(),
        inputs: graph
            .inputs(x.layer, &x.stage)
            .iter()
            .filter_map(|(l, s)| index.get(&(*l, s.as_str())).copied())
            .collect(),
        details: vec![Detail {
            title: "local error".into(),
            lines: vec![
                format!(
                    "relative RMS over {} positions: {:.4e} (tolerance {:.1e})",
                    x.positions, x.local_error, tolerance
                ),
                format!(
                    "worst position {at}: relative RMS {:.4e}, cos {:.8}, max abs {:.4e}",
                    w.rel_rms, w.cos, w.max_abs
                ),
                "its inputs are the tree's own: their errors are not in this op's".into(),
            ],
        }],
        tokens: Vec::new(),
    }
}

/// The first op above tolerance and the op with the largest local error.
fn markers(r: &ReplayReport) -> Vec<Marker> {
    let mut markers = Vec::new();
    if let Some(i) = r.first_above {
        markers.push(Marker {
            row: i,
            kind: MarkerKind::FirstDivergence,
            label: "first op above tolerance".into(),
        });
    }
    if let Some(i) = r.largest {
        markers.push(Marker {
            row: i,
            kind: MarkerKind::LargestLocal,
            label: format!("largest local error ({:.2e})", r.rows[i].local_error),
        });
    }
    markers
}

/// The page's one-line verdict.
fn headline(r: &ReplayReport) -> String {
    match r.outcome {
        ReplayOutcome::Within => format!(
            "every one of {} ops within {:.1e} local error",
            r.rows.len(),
            r.tolerance
        ),
        ReplayOutcome::Above => format!(
            "{} of {} ops above {:.1e} local error; largest {}",
            r.rows_above,
            r.rows.len(),
            r.tolerance,
            r.largest.map_or(String::new(), |i| r.rows[i].name())
        ),
    }
}
