//! The self-contained HTML reports: one file, inline CSS, SVG and script,
//! nothing fetched.
//!
//! Every report is a [`Page`] ([`page`], drawn by `draw`): a headline, a chart of error
//! against depth ([`chart`]) with the first diverging op, the largest error
//! growth and the largest local error marked, a layer × stage heatmap whose
//! cells open a panel (the row's per-position strip, prefill and decode
//! apart, tokens as text; its inputs' errors; `stat` of both sides), the red
//! rows, and every row. The summary is HTML and SVG, readable without
//! JavaScript; the per-position data is a compact JSON block the script
//! draws from only when a row is opened.
//!
//! [`render`] draws a diff's report alone; [`render_diff`] adds what
//! [`DiffContext::read`] reads from the trees. Another report (`drift`,
//! `replay`) builds a [`Page`] of its own rows and calls [`Page::render`].

pub mod chart;
pub mod diff_page;
mod draw;
pub mod page;

pub use diff_page::DiffContext;
pub use page::{Detail, Marker, MarkerKind, Page, PageRow, PosValue, Series, Verdict};

use crate::report::DiffReport;

/// A diff's page from its report alone (no inputs, tokens or statistics).
pub fn render(report: &DiffReport) -> String {
    render_diff(report, &DiffContext::default())
}

/// A diff's page with what `ctx` read from the trees.
pub fn render_diff(report: &DiffReport, ctx: &DiffContext) -> String {
    diff_page::page(report, ctx).render()
}
