//! Drawing a [`Page`]: everything the summary says (chart, marks, red
//! rows) is HTML and SVG written here, readable without JavaScript; the
//! per-position data is one compact JSON block that the page's script
//! turns into a panel only when a row is opened, so a report of a large
//! tree stays light to load.

use super::chart;
use super::page::{color, esc, num, Page, PageRow, Verdict};
use serde_json::{json, Value};
use std::fmt::Write as _;

const LEGEND: [(&str, Verdict, f64); 10] = [
    ("equal", Verdict::Equal, 0.0),
    ("< 1e-6", Verdict::Pass, 1e-7),
    ("< 1e-4", Verdict::Pass, 1e-5),
    ("< 1e-3", Verdict::Pass, 1e-4),
    ("< 1e-2", Verdict::Pass, 1e-3),
    ("< 0.1", Verdict::Pass, 1e-2),
    ("≥ 0.1", Verdict::Pass, 1.0),
    ("dtype/shape mismatch", Verdict::Mismatch, 0.0),
    ("degenerate", Verdict::Degenerate, 0.0),
    ("unreadable", Verdict::Unreadable, 0.0),
];

impl Page {
    /// The whole file: inline CSS, SVG and script; nothing is fetched.
    pub fn render(&self) -> String {
        let mut h = String::new();
        let _ = write!(
            h,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body>",
            esc(&self.title),
            include_str!("report.css")
        );
        let _ = write!(
            h,
            "<h1>{}</h1><p class=\"headline {}\">{}</p><table class=\"facts\">",
            esc(&self.title),
            if self.red { "red" } else { "ok" },
            esc(&self.headline)
        );
        for (label, text) in &self.facts {
            let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(label), esc(text));
        }
        h.push_str("</table>");
        for n in &self.notes {
            let _ = write!(h, "<p class=\"note\">{}</p>", esc(n));
        }
        self.marks(&mut h);
        if !self.rows.is_empty() {
            let _ = write!(h, "<h2>Error against depth</h2>{}", chart::render(self));
            self.heatmap(&mut h);
            h.push_str("<div id=\"panel\" hidden></div>");
            self.tables(&mut h);
        }
        let _ = writeln!(
            h,
            "<script type=\"application/json\" id=\"taptree-data\">{}</script><script>{}</script></body></html>",
            self.data(),
            include_str!("report.js")
        );
        h
    }

    /// The markers as sentences: the summary without the chart.
    fn marks(&self, h: &mut String) {
        if self.markers.is_empty() {
            return;
        }
        h.push_str("<ul class=\"marks\">");
        for m in &self.markers {
            let r = &self.rows[m.row];
            let name = esc(&r.name());
            let _ = write!(
                h,
                "<li><span class=\"swatch\" style=\"background:{}\"></span>{}: <a href=\"#row={}\" data-row=\"{}\">{}</a> ({} {})</li>",
                m.kind.color(),
                esc(&m.label),
                name,
                m.row,
                name,
                esc(&self.value_name),
                num(r.value)
            );
        }
        h.push_str("</ul>");
    }

    fn cell(&self, h: &mut String, i: usize) {
        let r = &self.rows[i];
        let marked = self.markers.iter().any(|m| m.row == i);
        let name = esc(&r.name());
        let _ = write!(
            h,
            "<td{} data-row=\"{i}\" data-name=\"{}\" style=\"background:{}\" title=\"{} {} {}\"></td>",
            if marked { " class=\"mark\"" } else { "" },
            name,
            color(r.verdict, r.value),
            name,
            r.verdict.label(),
            num(r.value)
        );
    }

    /// Layers down, per-layer stages across; global rows in their own line.
    fn heatmap(&self, h: &mut String) {
        let mut stages: Vec<&str> = Vec::new();
        let mut layers: Vec<u32> = Vec::new();
        let mut at = std::collections::HashMap::new();
        for (i, r) in self.rows.iter().enumerate() {
            if let Some(l) = r.layer {
                if !stages.contains(&r.stage.as_str()) {
                    stages.push(&r.stage);
                }
                if !layers.contains(&l) {
                    layers.push(l);
                }
                at.insert((l, r.stage.as_str()), i);
            }
        }
        h.push_str("<h2>Layer × stage</h2><p class=\"dim\">click a cell for its positions, inputs and statistics</p>");
        if !layers.is_empty() {
            h.push_str("<table class=\"heat\"><tr><th></th>");
            for s in &stages {
                let _ = write!(h, "<th class=\"s\">{}</th>", esc(s));
            }
            h.push_str("</tr>");
            for l in &layers {
                let _ = write!(h, "<tr><th>L{l}</th>");
                for s in &stages {
                    match at.get(&(*l, *s)) {
                        Some(&i) => self.cell(h, i),
                        None => h.push_str("<td class=\"none\"></td>"),
                    }
                }
                h.push_str("</tr>");
            }
            h.push_str("</table>");
        }
        h.push_str("<div class=\"globals\">");
        for (i, r) in self
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.layer.is_none())
        {
            h.push_str("<table class=\"heat\"><tr>");
            self.cell(h, i);
            let _ = write!(h, "<th>{}</th></tr></table>", esc(&r.stage));
        }
        let _ = write!(h, "</div><p class=\"dim\">{}: ", esc(&self.value_name));
        for (label, verdict, value) in LEGEND {
            let _ = write!(
                h,
                "<span class=\"swatch\" style=\"background:{}\"></span>{label} ",
                color(verdict, value)
            );
        }
        h.push_str("; outlined: a marked op</p>");
    }

    fn table(&self, h: &mut String, rows: impl Iterator<Item = usize>) {
        h.push_str("<table class=\"rows\"><tr><th>op</th><th>verdict</th>");
        for c in &self.columns {
            let _ = write!(h, "<th>{}</th>", esc(c));
        }
        h.push_str("</tr>");
        for i in rows {
            let r = &self.rows[i];
            let _ = write!(
                h,
                "<tr data-row=\"{i}\"><td>{}</td><td class=\"{}\">{}</td>",
                esc(&r.name()),
                if r.verdict.is_red() { "red" } else { "ok" },
                r.verdict.label()
            );
            for c in &r.cells {
                let _ = write!(h, "<td>{}</td>", esc(c));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }

    fn tables(&self, h: &mut String) {
        let red: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].verdict.is_red())
            .collect();
        if red.is_empty() {
            h.push_str("<h2>Red rows</h2><p>No red rows.</p>");
        } else {
            let _ = write!(h, "<h2>Red rows ({})</h2>", red.len());
            self.table(h, red.into_iter());
        }
        let _ = write!(
            h,
            "<details><summary>All {} rows</summary>",
            self.rows.len()
        );
        self.table(h, 0..self.rows.len());
        h.push_str("</details>");
    }

    /// What the script needs to draw a panel, compactly: short keys,
    /// values to three significant digits, `null` for not finite.
    fn data(&self) -> String {
        let rows: Vec<Value> = self.rows.iter().map(row_data).collect();
        let v = json!({
            "value": self.value_name,
            "tokens": self.tokens,
            "prompt": self.prompt_len,
            "rows": rows,
        });
        // Nothing in the block may close the script element.
        v.to_string().replace('<', "\\u003c")
    }
}

fn short(x: f64) -> Value {
    if x.is_finite() {
        let r: f64 = format!("{x:.2e}").parse().unwrap_or(x);
        json!(r)
    } else {
        Value::Null
    }
}

fn row_data(r: &PageRow) -> Value {
    let mut o = json!({
        "n": r.name(),
        "v": r.verdict.label(),
        "x": short(r.value),
        "p": r.positions.iter().map(|p| p.pos).collect::<Vec<_>>(),
        "y": r.positions.iter().map(|p| short(p.value)).collect::<Vec<_>>(),
    });
    let failing: Vec<usize> = (0..r.positions.len())
        .filter(|&i| !r.positions[i].pass)
        .collect();
    if !failing.is_empty() {
        o["f"] = json!(failing);
    }
    if r.positions.iter().any(|p| p.slot.is_some()) {
        o["s"] = json!(r.positions.iter().map(|p| p.slot).collect::<Vec<_>>());
    }
    if !r.equal_runs.is_empty() {
        o["e"] = json!(r
            .equal_runs
            .iter()
            .map(|(s, a, b)| json!([a, b, s]))
            .collect::<Vec<_>>());
    }
    if !r.inputs.is_empty() {
        o["i"] = json!(r.inputs);
    }
    if !r.tokens.is_empty() {
        o["t"] = json!(r.tokens);
    }
    if !r.details.is_empty() {
        o["d"] = json!(r
            .details
            .iter()
            .map(|d| json!([d.title, d.lines]))
            .collect::<Vec<_>>());
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::html::page::*;

    fn page() -> Page {
        let mut rows = vec![
            PageRow::new(None, "embedding", Verdict::Equal, 0.0),
            PageRow::new(Some(0), "attn", Verdict::Pass, 1e-5),
            PageRow::new(Some(0), "x</script><b>", Verdict::Fail, 0.2),
        ];
        rows[2].positions = vec![
            PosValue {
                pos: 0,
                slot: None,
                value: 1e-5,
                pass: true,
            },
            PosValue {
                pos: 1,
                slot: None,
                value: f64::NAN,
                pass: false,
            },
        ];
        rows[2].inputs = vec![1];
        rows[1].equal_runs = vec![(None, 0, 2)];
        Page {
            title: "t".into(),
            headline: "diverged".into(),
            red: true,
            value_name: "error".into(),
            rows,
            markers: vec![Marker {
                row: 2,
                kind: MarkerKind::FirstDivergence,
                label: "first diverging op".into(),
            }],
            ..Default::default()
        }
    }

    fn data(html: &str) -> Value {
        let tag = "id=\"taptree-data\">";
        let start = html.find(tag).unwrap() + tag.len();
        let end = start + html[start..].find("</script>").unwrap();
        serde_json::from_str(&html[start..end]).unwrap()
    }

    #[test]
    fn a_name_cannot_close_the_script_and_reads_back() {
        let html = page().render();
        assert_eq!(html.matches("</script>").count(), 2, "{html}");
        assert!(!html.contains("x</script><b>"));
        assert!(!html[..html.find("<script").unwrap()].contains("<b>"));
        let d = data(&html);
        assert_eq!(d["rows"][2]["n"], "L0/x</script><b>");
        // Not finite is null; failing positions by index; equal runs.
        assert_eq!(d["rows"][2]["y"], json!([1e-5, null]));
        assert_eq!(d["rows"][2]["f"], json!([1]));
        assert_eq!(d["rows"][2]["i"], json!([1]));
        assert_eq!(d["rows"][1]["e"], json!([[0, 2, null]]));
        assert!(d["rows"][0].get("f").is_none());
    }

    #[test]
    fn the_summary_reads_without_the_script() {
        let html = page().render();
        let body = &html[..html.find("<script").unwrap()];
        // The marker as a sentence and in the chart, the red row in its table.
        assert!(body.contains(
            "first diverging op: <a href=\"#row=L0/x&lt;/script&gt;&lt;b&gt;\" data-row=\"2\">"
        ));
        assert!(body.contains("first diverging op L0/x&lt;/script&gt;"));
        assert!(body.contains("<h2>Red rows (1)</h2>"));
        assert!(body.contains("<svg class=\"chart\""));
        let mut ok = page();
        ok.rows.truncate(2);
        ok.markers.clear();
        assert!(ok.render().contains("<p>No red rows.</p>"));
    }
}
