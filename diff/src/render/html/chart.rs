//! The chart of error against depth: the rows in forward order across, each
//! row's value down a log scale, one line per stage family (the residual
//! stream, norms, matmuls, attention, activations), the page's further series
//! dashed, and its markers as labelled vertical lines. Plain SVG, drawn
//! here, so the summary reads without JavaScript; the page's script only
//! makes its points open the row they stand for.

use super::page::{esc, num, Page};
use std::fmt::Write as _;

const W: f64 = 960.0;
const H: f64 = 300.0;
const LEFT: f64 = 58.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 30.0;

/// The family a stage's line belongs to, and the line's color.
pub fn family(stage: &str) -> (&'static str, &'static str) {
    let matmul = stage.ends_with("_proj")
        || stage.ends_with("qkv")
        || matches!(stage, "ffn_gate" | "ffn_up" | "ffn_down" | "logits");
    if stage.contains("residual") {
        ("residual stream", "#263238")
    } else if stage.contains("norm") {
        ("norms", "#1e88e5")
    } else if matmul {
        ("matmuls", "#d81b60")
    } else if stage.contains("rope") || stage.contains("attn") {
        ("attention", "#00897b")
    } else if stage.contains("glu") || stage.contains("gelu") || stage.contains("act") {
        ("activations", "#fb8c00")
    } else {
        ("other", "#757575")
    }
}

/// The decades the y axis spans: from the smallest nonzero value (at most
/// 1e-9 below) to the largest finite one (at least 1).
fn decades(page: &Page) -> (i32, i32) {
    let values = page
        .rows
        .iter()
        .map(|r| r.value)
        .chain(
            page.series
                .iter()
                .flat_map(|s| s.values.iter().flatten().copied()),
        )
        .filter(|v| v.is_finite() && *v > 0.0);
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let hi = (hi.log10().ceil() as i32).max(0);
    let lo = if lo.is_finite() {
        (lo.log10().floor() as i32).max(hi - 12)
    } else {
        hi - 6
    };
    (lo.min(hi - 2), hi)
}

/// The page's chart (see the module doc) as one inline `<svg>` element.
pub fn render(page: &Page) -> String {
    let n = page.rows.len().max(1) as f64;
    let (lo, hi) = decades(page);
    let x = |i: usize| LEFT + (i as f64 + 0.5) * (W - LEFT - RIGHT) / n;
    // Exact values (0) sit on the floor; values not finite on the ceiling.
    let y = |v: f64| {
        let d = if v.is_nan() || v == f64::INFINITY {
            hi as f64
        } else if v <= 0.0 {
            lo as f64
        } else {
            v.log10().clamp(lo as f64, hi as f64)
        };
        TOP + (hi as f64 - d) / (hi - lo) as f64 * (H - TOP - BOTTOM)
    };
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"chart\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{} per row, forward order\">",
        esc(&page.value_name)
    );
    for d in lo..=hi {
        let yy = y(10f64.powi(d));
        let _ = write!(
            s,
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/><text class=\"ax\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 4.0,
            yy + 4.0,
            if d == lo { format!("≤1e{d}") } else { format!("1e{d}") }
        );
    }
    ticks(page, &mut s, &x);
    // One line per family, through its rows in forward order.
    let mut families: Vec<(&str, &str)> = Vec::new();
    for r in &page.rows {
        let f = family(&r.stage);
        if !families.contains(&f) {
            families.push(f);
        }
    }
    for (name, color) in &families {
        let idx: Vec<usize> = (0..page.rows.len())
            .filter(|&i| family(&page.rows[i].stage).0 == *name)
            .collect();
        let pts: Vec<String> = idx
            .iter()
            .map(|&i| format!("{:.1},{:.1}", x(i), y(page.rows[i].value)))
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.3\" points=\"{}\"/>",
            pts.join(" ")
        );
        for &i in &idx {
            let r = &page.rows[i];
            let _ = write!(
                s,
                "<circle data-row=\"{i}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"{}\" fill=\"{}\"><title>{} {} {}</title></circle>",
                x(i),
                y(r.value),
                if r.verdict.is_red() { 3.2 } else { 2.2 },
                if r.value.is_finite() { color } else { "#b71c1c" },
                esc(&r.name()),
                r.verdict.label(),
                num(r.value)
            );
        }
    }
    for (k, series) in page.series.iter().enumerate() {
        let pts: Vec<String> = series
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", x(i), y(v))))
            .collect();
        let _ = write!(
            s,
            "<polyline class=\"series\" fill=\"none\" stroke=\"#000\" stroke-opacity=\"0.6\" stroke-dasharray=\"{}\" points=\"{}\"><title>{}</title></polyline>",
            ["5 3", "2 2", "8 3 2 3"][k % 3],
            pts.join(" "),
            esc(&series.name)
        );
    }
    for (k, m) in page.markers.iter().enumerate() {
        let xx = x(m.row);
        let right = xx > W / 2.0;
        let _ = write!(
            s,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{TOP}\" y2=\"{}\" stroke=\"{}\" stroke-dasharray=\"3 2\"/><text class=\"mk\" x=\"{:.1}\" y=\"{:.1}\" fill=\"{}\" text-anchor=\"{}\">{} {}</text>",
            H - BOTTOM,
            m.kind.color(),
            if right { xx - 3.0 } else { xx + 3.0 },
            TOP + 10.0 + 12.0 * k as f64,
            m.kind.color(),
            if right { "end" } else { "start" },
            esc(&m.label),
            esc(&page.rows[m.row].name())
        );
    }
    s.push_str("</svg>");
    legend(page, &families, &mut s);
    s
}

/// The families' colors and the series' dashes, under the chart.
fn legend(page: &Page, families: &[(&str, &str)], s: &mut String) {
    s.push_str("<p class=\"legend\">");
    for (name, color) in families {
        let _ = write!(
            s,
            "<span class=\"swatch\" style=\"background:{color}\"></span>{name} "
        );
    }
    for (k, series) in page.series.iter().enumerate() {
        let _ = write!(
            s,
            "<svg width=\"24\" height=\"8\"><line x1=\"0\" x2=\"24\" y1=\"4\" y2=\"4\" stroke=\"#000\" stroke-dasharray=\"{}\"/></svg> {} ",
            ["5 3", "2 2", "8 3 2 3"][k % 3],
            esc(&series.name)
        );
    }
    let _ = write!(
        s,
        "<span class=\"dim\">— y: {}, log scale; x: rows in forward order</span></p>",
        esc(&page.value_name)
    );
}

/// Layer labels along the bottom (every few layers), or global rows' names.
fn ticks(page: &Page, s: &mut String, x: &dyn Fn(usize) -> f64) {
    let layers = page
        .rows
        .iter()
        .filter_map(|r| r.layer)
        .max()
        .map_or(0, |l| l + 1);
    let every = layers.div_ceil(16).max(1);
    let mut last = None;
    let mut last_x = f64::NEG_INFINITY;
    let base = H - BOTTOM;
    for (i, r) in page.rows.iter().enumerate() {
        let label = match r.layer {
            Some(l) if last != Some(l) => {
                last = Some(l);
                (l % every == 0).then(|| format!("L{l}"))
            }
            Some(_) => None,
            None if page.rows.len() <= 40 || i == 0 || i + 1 == page.rows.len() => {
                Some(r.stage.clone())
            }
            None => None,
        };
        // A label too close to the previous one is left out.
        if let Some(label) = label.filter(|l| x(i) - last_x > 7.0 * l.len().min(6) as f64) {
            last_x = x(i);
            let _ = write!(
                s,
                "<line class=\"grid\" x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{base}\" y2=\"{1}\"/><text class=\"ax\" x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\">{3}</text>",
                x(i),
                base + 4.0,
                base + 16.0,
                esc(&label)
            );
        }
    }
}
