//! Renderers of a [`crate::DiffReport`] (and of a [`crate::stat::StatReport`]):
//! siblings that only format what the report holds.

pub mod html;
pub mod json;
mod summary;
pub mod table;
mod words;

pub use summary::summary;
pub use words::{finding, hint, note, reason};

/// A row's reasons in words, joined by `; `.
fn reasons(r: &[crate::report::Reason]) -> String {
    r.iter().map(reason).collect::<Vec<_>>().join("; ")
}

/// Rows named one after the other: `L3/ffn_up, L3/ffn_gate`.
fn names(rows: &[capture::RowId]) -> String {
    let names: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
    names.join(", ")
}

/// A hash as the reports show it: its first 12 hex digits.
pub(crate) fn short_hash(h: &str) -> &str {
    &h[..h.len().min(12)]
}
