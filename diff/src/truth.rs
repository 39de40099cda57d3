//! What may serve as a truth, and the truth's verdict over every row.
//!
//! A truth settles "which side is wrong" only if it is more accurate than
//! both: every op computed in f64. A tree's manifest has to say so:
//! `precision` f64, no switch that quantizes an op family, every float tap
//! F64, and no engine-reported exception (`extra.all_ops_f64: false`, with
//! `extra.float32_islands` naming them: Hugging Face's "float64" runs
//! RMSNorm, its RoPE tables and its attention softmax in float32).

use crate::report::{Closer, DiffReport};
use capture::{DType, Manifest};

/// Why a tree's manifest does not show every op in f64, if it does not.
pub fn not_all_f64(m: &Manifest) -> Option<String> {
    let run = &m.run;
    if run.precision != "f64" {
        return Some(format!("its precision is {:?}, not f64", run.precision));
    }
    if let Some((k, v)) = run
        .switches
        .iter()
        .find(|(_, v)| !matches!(v.as_str(), "f32" | "f64"))
    {
        return Some(format!("switch {k}={v} quantizes an op family"));
    }
    if let Some(e) = m
        .entries
        .iter()
        .find(|e| matches!(e.dtype, DType::F32 | DType::F16 | DType::BF16))
    {
        return Some(format!("tap {} is {}, not F64", e.key, e.dtype));
    }
    if run.extra.get("all_ops_f64").and_then(|v| v.as_bool()) == Some(false) {
        let islands: Vec<String> = run
            .extra
            .get("float32_islands")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        return Some(if islands.is_empty() {
            "its engine reports ops outside f64 (all_ops_f64: false)".to_string()
        } else {
            format!("its engine reports ops outside f64: {}", islands.join("; "))
        });
    }
    None
}

/// Counts the rows by which side the truth finds closer.
pub fn count(report: &mut DiffReport) {
    let (mut a, mut b, mut neither) = (0, 0, 0);
    for r in &report.rows {
        match r.truth.as_ref().map(|t| t.closer) {
            Some(Closer::A) => a += 1,
            Some(Closer::B) => b += 1,
            Some(Closer::Neither) => neither += 1,
            _ => {}
        }
    }
    report.counts.truth_closer_a = a;
    report.counts.truth_closer_b = b;
    report.counts.truth_neither = neither;
}
