//! Renderers of a [`crate::DiffReport`] (and of a [`crate::stat::StatReport`]):
//! siblings that only format what the report holds.

pub mod html;
pub mod json;
mod summary;
pub mod table;

pub use summary::summary;

/// Rows named one after the other: `L3/ffn_up, L3/ffn_gate`.
/// A row's reason in words, the same in the table, the JSON and the HTML.
pub fn reason(r: &crate::report::Reason) -> String {
    use crate::report::Reason;
    match r {
        Reason::ShapeMismatch { a, b } => format!("shape mismatch: row shape {a:?} vs {b:?}"),
        Reason::DtypeMismatch { a, b } => format!("dtype mismatch: {a} vs {b}"),
        Reason::NonfiniteMismatch { elements } => {
            format!("nonfinite mismatch in {elements} elements")
        }
        Reason::NotBitwise { differ, of } => format!("bitwise: {differ} of {of} elements differ"),
        Reason::Undefined { metric } => format!("{} undefined (dtypes differ)", metric.name()),
        Reason::Fails {
            metric,
            value,
            op,
            bound,
        } => format!(
            "{}={} not {}{}",
            metric.name(),
            crate::tolerance::short(*value),
            op.text(),
            bound
        ),
        Reason::Degenerate { pos, slot, a, b } => {
            let side = |d: &Option<crate::metrics::Degeneracy>| {
                d.map_or("ok".to_string(), |d| d.to_string())
            };
            format!(
                "degenerate at {}: A {}, B {}",
                crate::report::at_label(*pos, *slot),
                side(a),
                side(b)
            )
        }
    }
}

/// A row's reasons in words, joined by `; `.
fn reasons(r: &[crate::report::Reason]) -> String {
    r.iter().map(reason).collect::<Vec<_>>().join("; ")
}

fn names(rows: &[capture::RowId]) -> String {
    let names: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
    names.join(", ")
}

/// A hash as the reports show it: its first 12 hex digits.
pub(crate) fn short_hash(h: &str) -> &str {
    &h[..h.len().min(12)]
}
