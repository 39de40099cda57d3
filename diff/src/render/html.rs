//! A self-contained HTML report: summary, a layer × stage heatmap colored by
//! each cell's worst-position error (`-log10` of its relative RMS error, so
//! bitwise equal is the palest and red is large), and the rows.

use crate::report::{Cause, Outcome, Report, Status};
use crate::tolerance::short;
use std::collections::BTreeMap;
use std::fmt::Write as _;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Cell background: status first (mismatch, degenerate), then error size.
fn color(status: Status, rel: f64) -> &'static str {
    match status {
        Status::Mismatch => "#7b1fa2",
        Status::Degenerate => "#f9a825",
        Status::Equal => "#e8f5e9",
        Status::Unreadable => "#616161",
        _ if !rel.is_finite() || rel >= 1e-1 => "#b71c1c",
        _ if rel >= 1e-2 => "#e53935",
        _ if rel >= 1e-3 => "#ff8a65",
        _ if rel >= 1e-4 => "#ffe0b2",
        _ if rel >= 1e-6 => "#c8e6c9",
        _ => "#a5d6a7",
    }
}

pub fn render(report: &Report) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>taptree diff</title><style>\
body{{font:14px system-ui,sans-serif;margin:24px;color:#222}}\
table{{border-collapse:collapse}}td,th{{padding:2px 6px;border:1px solid #ddd;font-variant-numeric:tabular-nums}}\
.heat td{{width:18px;height:18px;padding:0}}.heat th{{font-weight:normal;font-size:11px}}\
.heat th.s{{writing-mode:vertical-rl;transform:rotate(180deg);height:110px}}\
.red{{color:#b71c1c;font-weight:bold}}.ok{{color:#2e7d32}}.dim{{color:#888}}\
.first{{outline:3px solid #000}}</style></head><body>"
    );
    let _ = write!(
        h,
        "<h1>taptree diff</h1><p class=\"{}\">{}</p>",
        if matches!(
            report.outcome,
            Outcome::Identical | Outcome::WithinTolerance
        ) {
            "ok"
        } else {
            "red"
        },
        esc(&super::summary(report))
    );
    let _ = write!(h, "<table>");
    for (label, t) in [
        ("A", Some(&report.a)),
        ("B", Some(&report.b)),
        ("T", report.truth.as_ref()),
    ] {
        if let Some(t) = t {
            let _ = write!(
                h,
                "<tr><th>{label}</th><td>{}</td><td>{} {} {}</td><td>{} taps</td><td class=\"dim\">{}</td></tr>",
                esc(&t.path), esc(&t.model), esc(&t.backend), esc(&t.precision), t.taps, esc(&t.root)
            );
        }
    }
    let _ = write!(
        h,
        "</table><p>tolerance: <code>{}</code></p>",
        esc(&report.tolerance)
    );
    if let Some(i) = report.first_divergence {
        let r = &report.rows[i];
        let _ = write!(
            h,
            "<p class=\"red\">first diverging op: {}{} — {}</p>",
            esc(&r.name()),
            esc(&r.worst().label()),
            esc(&r.reasons.join("; "))
        );
    }
    for c in &report.controls {
        let _ = write!(
            h,
            "<p>control {}: <span class=\"{}\">{}</span> {}</p>",
            esc(&c.name),
            if c.passed { "ok" } else { "red" },
            if c.passed { "passed" } else { "FAILED" },
            esc(&c.detail)
        );
    }

    heatmap(&mut h, report);
    rows_table(&mut h, report);
    h
}

/// The layer × stage heatmap and its legend.
fn heatmap(h: &mut String, report: &Report) {
    // Heatmap: layers down, per-layer stages across; globals in their own line.
    let mut stages: Vec<&str> = Vec::new();
    let mut cells: BTreeMap<(Option<u32>, &str), usize> = BTreeMap::new();
    for (i, r) in report.rows.iter().enumerate() {
        if r.layer.is_some() && !stages.contains(&r.stage.as_str()) {
            stages.push(&r.stage);
        }
        cells.insert((r.layer, r.stage.as_str()), i);
    }
    let layers: Vec<u32> = {
        let mut v: Vec<u32> = report.rows.iter().filter_map(|r| r.layer).collect();
        v.dedup();
        v
    };
    let cell = |h: &mut String, i: Option<usize>| match i {
        None => {
            let _ = write!(h, "<td></td>");
        }
        Some(i) => {
            let r = &report.rows[i];
            let w = r.worst();
            let tip = format!(
                "{}{} {:?} cos {} max abs {} nmse {}",
                r.name(),
                w.label(),
                r.status,
                short(w.metrics.cos),
                short(w.metrics.max_abs),
                short(w.metrics.nmse)
            );
            let first = if report.first_divergence == Some(i) {
                " class=\"first\""
            } else {
                ""
            };
            let _ = write!(
                h,
                "<td{first} style=\"background:{}\" title=\"{}\"></td>",
                color(r.status, w.metrics.rel_rms),
                esc(&tip)
            );
        }
    };
    if !report.rows.is_empty() {
        let _ = write!(
            h,
            "<h2>Layer × stage</h2><table class=\"heat\"><tr><th></th>"
        );
        for s in &stages {
            let _ = write!(h, "<th class=\"s\">{}</th>", esc(s));
        }
        let _ = write!(h, "</tr>");
        for l in &layers {
            let _ = write!(h, "<tr><th>L{l}</th>");
            for s in &stages {
                cell(h, cells.get(&(Some(*l), *s)).copied());
            }
            let _ = write!(h, "</tr>");
        }
        let _ = write!(
            h,
            "</table><p class=\"dim\">worst-position relative RMS error: "
        );
        for (label, status, rel) in [
            ("equal", Status::Equal, 0.0),
            ("< 1e-6", Status::Pass, 1e-7),
            ("< 1e-4", Status::Pass, 1e-5),
            ("< 1e-3", Status::Pass, 1e-4),
            ("< 1e-2", Status::Pass, 1e-3),
            ("< 0.1", Status::Pass, 1e-2),
            ("≥ 0.1", Status::Pass, 1.0),
            ("dtype/shape mismatch", Status::Mismatch, 0.0),
            ("degenerate", Status::Degenerate, 0.0),
        ] {
            let _ = write!(
                h,
                "<span style=\"display:inline-block;width:12px;height:12px;background:{};margin:0 4px 0 10px;vertical-align:middle\"></span>{label}",
                color(status, rel)
            );
        }
        let _ = write!(h, "; outlined: the first diverging op</p><p>");
        for (i, r) in report
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.layer.is_none())
        {
            let mut tmp = String::new();
            cell(&mut tmp, Some(i));
            let _ = write!(
                h,
                "<span style=\"display:inline-block;margin-right:12px\"><table class=\"heat\"><tr>{tmp}<th>{}</th></tr></table></span>",
                esc(&r.stage)
            );
        }
        let _ = write!(h, "</p>");
    }
}

/// One line per row, every row.
fn rows_table(h: &mut String, report: &Report) {
    let _ = write!(
        h,
        "<h2>Rows</h2><table><tr><th>op</th><th>verdict</th><th>min cos @pos</th><th>max abs</th>\
<th>nmse</th><th>sqnr dB</th><th>max ulp</th><th>growth</th><th>truth err A / B</th><th>cause</th></tr>"
    );
    for (i, r) in report.rows.iter().enumerate() {
        let w = r.worst();
        let m = &w.metrics;
        let cause = match &r.cause {
            Some(Cause::Origin) => "origin".to_string(),
            Some(Cause::GrewFrom { from }) => {
                format!("grew past tolerance from {}", super::names(from))
            }
            Some(Cause::Inherited { from }) => format!("inherited from {}", super::names(from)),
            None => String::new(),
        };
        let truth = r.truth.as_ref().map_or(String::new(), |t| {
            format!("{} / {}", short(t.error_a), short(t.error_b))
        });
        let _ = write!(
            h,
            "<tr{}><td>{}</td><td class=\"{}\">{:?}</td><td>{:.6} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if report.first_divergence == Some(i) { " class=\"first\"" } else { "" },
            esc(&r.name()),
            if r.status.is_red() { "red" } else { "ok" },
            r.status,
            m.cos,
            esc(&w.label()),
            short(m.max_abs),
            short(m.nmse),
            short(m.sqnr_db),
            m.max_ulp.map_or("-".into(), |u| u.to_string()),
            r.growth.as_ref().map_or(String::new(), |g| format!("{:+.2e}", g.delta)),
            truth,
            esc(&cause)
        );
    }
    let _ = writeln!(h, "</table></body></html>");
}
