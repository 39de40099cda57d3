//! The bisect reports for people; `--json` serializes them as they are.

use super::judge::FirstOp;
use super::{commits, switches};

fn short(id: &str) -> &str {
    &id[..id.len().min(10)]
}

fn op_or_dash(op: &Option<FirstOp>) -> String {
    op.as_ref().map_or("-".into(), |o| o.to_string())
}

/// `step 3: 1a2b3c4d5e commit 23: red at L0/ffn_down@1 (origin, cos 0.873211)`.
pub fn step_line(n: usize, s: &commits::Step) -> String {
    let verdict = match s.verdict {
        commits::StepVerdict::Green => "green".to_string(),
        commits::StepVerdict::Red => format!(
            "red at {}; logits min cos {}",
            op_or_dash(&s.first_op),
            cos_or_dash(s.logits_min_cos)
        ),
        commits::StepVerdict::Skip => "skip (capture command exited 125)".to_string(),
    };
    let cached = if s.cached { " [cached]" } else { "" };
    format!(
        "step {n}: {} {}: {verdict}{cached}",
        short(&s.commit),
        s.subject
    )
}

/// The commits bisect's report for people.
pub fn commits_text(r: &commits::CommitsReport) -> String {
    use commits::Answer;
    let mut out = String::new();
    let named = |c: &commits::Named| format!("{} {}", c.commit, c.subject);
    match &r.answer {
        Answer::FirstBad {
            commit,
            first_op,
            first_change,
        } => {
            out += &format!("first bad commit: {}\n", named(commit));
            out += &format!("first diverging op: {}\n", op_or_dash(first_op));
            if let Some(op) = first_op {
                for reason in &op.reasons {
                    out += &format!("  {reason}\n");
                }
            }
            if let Some(change) = first_change {
                out += &format!("first op not bitwise equal to the reference: {change}\n");
            }
        }
        Answer::Ambiguous { candidates } => {
            out += "skipped commits hide the boundary; the first bad commit is one of:\n";
            for c in candidates {
                out += &format!("  {}\n", named(c));
            }
        }
        Answer::GoodIsRed { commit, first_op } => {
            out += &format!(
                "--good {} is already red against the reference (first diverging op: {}); \
                 nothing to bisect: check --reference and --good\n",
                named(commit),
                op_or_dash(first_op)
            );
        }
        Answer::BadIsGreen { commit } => {
            out += &format!(
                "--bad {} is within tolerance of the reference; nothing to bisect: \
                 check --reference, --bad and the tolerance\n",
                named(commit)
            );
        }
        Answer::EndpointSkipped { commit } => {
            out += &format!(
                "{}: the answer rests on this endpoint and its capture command exits 125; \
                 choose another --good/--bad\n",
                named(commit)
            );
        }
    }
    out += &format!(
        "{} commits in range, {} steps: {} captures run, {} from cache ({})\n",
        r.range,
        r.steps.len(),
        r.captures_run,
        r.cache_hits,
        r.cache.display()
    );
    out
}

fn cos_or_dash(c: Option<f64>) -> String {
    c.map_or("-".into(), |c| format!("{c:.6}"))
}

/// The switches bisect's report for people: the arms table, then the answer.
pub fn switches_text(r: &switches::SwitchesReport) -> String {
    use switches::{Answer, ArmVerdict};
    let labels: Vec<String> = r.arms.iter().map(|a| a.label()).collect();
    let width = labels.iter().map(String::len).max().unwrap_or(3).max(3);
    let changes: Vec<String> = r
        .arms
        .iter()
        .map(|a| a.first_change.clone().unwrap_or_else(|| "-".into()))
        .collect();
    let cwidth = changes.iter().map(String::len).max().unwrap_or(0).max(12);
    let mut out = format!(
        "{:width$}  {:7}  {:14}  {:cwidth$}  {}\n",
        "arm", "verdict", "logits min cos", "first change", "first diverging op"
    );
    for ((arm, label), change) in r.arms.iter().zip(&labels).zip(&changes) {
        let verdict = match arm.verdict {
            ArmVerdict::Green => "green",
            ArmVerdict::Red => "red",
            ArmVerdict::Skip => "skip",
        };
        out += &format!(
            "{label:width$}  {verdict:7}  {:14}  {change:cwidth$}  {}\n",
            cos_or_dash(arm.logits_min_cos),
            op_or_dash(&arm.first_op)
        );
    }
    out += "\n";
    match &r.answer {
        Answer::NoDivergence => out += "no arm diverges from the reference\n",
        Answer::BaselineRed { first_op } => {
            out += &format!(
                "all off already diverges from the reference (first diverging op: {}); \
                 the switches cannot explain it\n",
                op_or_dash(first_op)
            )
        }
        Answer::Single { culprits } => {
            if culprits.len() > 1 {
                out += "switches red alone, earliest first divergence first:\n";
                for c in culprits {
                    out += &format!(
                        "  {}: {} (first change {})\n",
                        c.switches.join(" "),
                        op_or_dash(&c.first_op),
                        c.first_change.as_deref().unwrap_or("-")
                    );
                }
            }
            let first = &culprits[0];
            let what = if culprits.len() > 1 {
                "culprit of the first divergence"
            } else {
                "culprit"
            };
            out += &format!(
                "{what}: {} alone (first diverging op: {})\n",
                first.switches.join(" "),
                op_or_dash(&first.first_op)
            );
        }
        Answer::Set { culprit } => {
            out += "no single switch diverges alone\n";
            out += &format!(
                "minimal culprit set (delta debugging): {} (first diverging op: {})\n",
                culprit.switches.join(" "),
                op_or_dash(&culprit.first_op)
            );
        }
        Answer::Undecided => {
            out += "no single switch diverges alone and all on could not be captured \
                    (exit 125): undecided\n"
        }
    }
    out += &format!(
        "{} arms: {} captures run, {} from cache\n",
        r.arms.len(),
        r.captures_run,
        r.cache_hits
    );
    out
}
