//! Renderers of a [`ReplayReport`]: a table for people, JSON for machines. They
//! only format what the report holds.

use crate::report::{ReplayOutcome, ReplayReport, Row};
use std::fmt::Write;

/// A number in at most four significant digits, `0` for an exact zero.
fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.is_infinite() {
        "inf".into()
    } else if (1e-3..1e4).contains(&x.abs()) {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}

fn at(r: &Row) -> String {
    match r.worst_slot {
        Some(s) => format!("@{}#{s}", r.worst_pos),
        None => format!("@{}", r.worst_pos),
    }
}

/// The table: a header naming the tree, the model and the arithmetic; one
/// line per (layer, stage) in forward order; the op with the largest local
/// error; the verdict.
pub fn table(r: &ReplayReport) -> String {
    let mut o = String::new();
    let short = |h: &str| h.chars().take(12).collect::<String>();
    let _ = writeln!(
        o,
        "tree   {}  ({} {}, root {})",
        r.tree,
        r.tree_backend,
        r.tree_precision,
        short(&r.root)
    );
    let _ = writeln!(o, "model  {} ({})", r.model, r.model_check);
    let _ = writeln!(
        o,
        "replay every op from the tree's own inputs in {}; local error: relative RMS of the tree's op against it, over the op's positions; tolerance {}",
        r.precision,
        num(r.tolerance)
    );
    if !r.reconciled.is_empty() {
        let _ = writeln!(
            o,
            "declared layouts reconciled: {} read in interleaved rotary order",
            r.reconciled.join(", ")
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<26} {:>10}  {:<7} {:>9} {:>10} {:>10} {:>10}",
        "op", "local err", "verdict", "worst", "rel rms", "cos", "max abs"
    );
    for row in &r.rows {
        let w = &row.worst;
        let _ = writeln!(
            o,
            "{:<26} {:>10}  {:<7} {:>9} {:>10} {:>10} {:>10}",
            row.name(),
            num(row.local_error),
            if row.above { "ABOVE" } else { "ok" },
            at(row),
            num(w.rel_rms),
            format!("{:.6}", w.cos),
            num(w.max_abs)
        );
    }
    let _ = writeln!(o);
    if let Some(i) = r.largest {
        let row = &r.rows[i];
        let _ = writeln!(
            o,
            "largest local error: {} {} (worst {}: relative RMS {}, cos {:.6}, max abs {})",
            row.name(),
            num(row.local_error),
            at(row),
            num(row.worst.rel_rms),
            row.worst.cos,
            num(row.worst.max_abs)
        );
    }
    let positions: u64 = r.rows.iter().map(|x| x.positions).sum();
    let _ = writeln!(
        o,
        "{} taps replayed ({} op positions) in {:.2} s, read in {:.2} s",
        r.taps, positions, r.seconds_replay, r.seconds_read
    );
    let _ = match (r.outcome, r.first_above) {
        (ReplayOutcome::Above, Some(i)) => writeln!(
            o,
            "above tolerance: {} of {} ops, the first in forward order {} ({})",
            r.rows_above,
            r.rows.len(),
            r.rows[i].name(),
            num(r.rows[i].local_error)
        ),
        _ => writeln!(
            o,
            "within tolerance: every one of {} ops' local error <= {}",
            r.rows.len(),
            num(r.tolerance)
        ),
    };
    o
}

/// The report as JSON (schema `taptree-replay/1`, documented in docs/GUIDE.md).
pub fn json(r: &ReplayReport) -> String {
    serde_json::to_string_pretty(r).expect("a report serializes")
}
