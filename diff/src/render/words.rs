//! The report's values in words, the same in the table, the JSON and the
//! HTML: a row's reasons and layout hint, a control's finding, a note.

use crate::report::{Finding, LayoutHint, Note, PartialsLeftOut, Reason, ReduceFault};

/// A row's reason in words.
pub fn reason(r: &Reason) -> String {
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

/// A red row's layout hint: what it looks like and what to do.
pub fn hint(h: &LayoutHint) -> String {
    format!(
        "layout? cos {:.3} here while {} (which reads it) agrees: the engines may order \
         this tensor's width differently; declare the stage's layout (docs/FORMAT.md)",
        h.cos, h.reader
    )
}

/// What a control checked and found.
pub fn finding(f: &Finding) -> String {
    match f {
        Finding::SelfEqual { positions } => {
            format!("A against A: {positions} positions bitwise equal")
        }
        Finding::SelfDiffers {
            rows,
            first,
            matched,
            positions,
        } => format!(
            "A against A is not bitwise equal: {rows} rows differ (first {}), \
             {matched} of {positions} positions matched",
            first.as_ref().map_or("-".to_string(), |r| r.to_string()),
        ),
        Finding::NothingToPerturb => "A holds no tap to perturb".to_string(),
        Finding::PlantedNamed { at } => format!("planted change at {at}: named exactly"),
        Finding::PlantedMisnamed {
            at,
            found,
            pos,
            red,
        } => format!(
            "planted change at {at}, but the first diverging op is {found}@{pos} ({red} red rows)"
        ),
        Finding::PlantedUnseen { at } => {
            format!("planted change at {at} was not seen: no divergence")
        }
        Finding::FixturesValid { positions } => {
            format!("{positions} tap positions checked: none all zero, all nonfinite or constant")
        }
        Finding::FixturesDegenerate { positions, flagged } => {
            let first = &flagged[0];
            format!(
                "{} of {positions} tap positions degenerate (first: {} {} is {})",
                flagged.len(),
                first.tree.as_str(),
                first.key,
                first.what
            )
        }
    }
}

/// A note under a diff.
pub fn note(n: &Note) -> String {
    match n {
        Note::TensorParallel { tp_a, tp_b } => {
            let tp =
                |v: &Option<serde_json::Value>| v.as_ref().map_or("1".into(), |v| v.to_string());
            format!(
                "tensor parallel: A tp {}, B tp {}; shards compared as the full tensors they tile",
                tp(tp_a),
                tp(tp_b)
            )
        }
        Note::PartialsNotCompared { why } => format!(
            "per-rank partial sums (*_partial) not compared: {} \
             (the all-reduced sums are compared)",
            match why {
                PartialsLeftOut::OtherRanks => "the trees do not split over the same ranks",
                PartialsLeftOut::NoRanks => "the other tree has no ranks",
            }
        ),
        Note::Aligned { shift } => {
            format!("aligned: position p of A is compared with position p{shift:+} of B")
        }
        Note::LayoutsReconciled { stages } => format!(
            "declared layouts reconciled: {} compared in interleaved rotary order",
            stages.join(", ")
        ),
        Note::Shards { row, tree, shards } => {
            let parts: Vec<String> = shards
                .iter()
                .map(|s| match s.max_abs {
                    0.0 => format!(
                        "rank {} (columns {}..{}) bitwise equal",
                        s.rank, s.start, s.end
                    ),
                    m => format!(
                        "rank {} (columns {}..{}) differs, max |a-b| {m:.3e}",
                        s.rank, s.start, s.end
                    ),
                })
                .collect();
            format!("{row}: shards of {}: {}", tree.as_str(), parts.join("; "))
        }
        Note::AllReduce {
            row,
            tree,
            taps,
            first,
            end,
            fault,
        } => {
            let why = match fault {
                ReduceFault::MissingRank {
                    rank,
                    partial_stage,
                } => format!(
                    "rank {rank}'s partial sum ({partial_stage}) is missing from the all-reduce"
                ),
                ReduceFault::NotRankOrderSum {
                    partials,
                    partial_stage,
                } => format!(
                    "not the rank-order sum of its {partials} partial sums ({partial_stage})"
                ),
            };
            format!(
                "{row} in {} ({taps} taps, positions {first}..{end}): {why}",
                tree.as_str()
            )
        }
    }
}
