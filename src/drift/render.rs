//! The drift report for people; `--json` serializes [`DriftReport`] as is.

use super::{DriftReport, PromptDrift, PromptKind};

/// The line shown on stderr as each prompt is done.
pub fn progress_line(r: &PromptDrift, n: usize, total: usize) -> String {
    match &r.parting {
        Some(p) => format!(
            "prompt {n}/{total} (line {}): answers part at generated token {}",
            r.line, p.step
        ),
        None => format!(
            "prompt {n}/{total} (line {}): answers identical for {} tokens",
            r.line, r.steps
        ),
    }
}

fn quoted(s: &Option<String>) -> String {
    s.as_ref().map_or("?".into(), |s| format!("{s:?}"))
}

/// The report for people.
pub fn text(r: &DriftReport) -> String {
    let mut out = format!(
        "drift: {} greedy tokens per prompt\n  A: {}\n  B: {}\n\n",
        r.gen, r.a.spec, r.b.spec
    );
    for (i, p) in r.prompts.iter().enumerate() {
        let kind = match p.kind {
            PromptKind::Chat => "chat",
            PromptKind::Text => "text",
            PromptKind::Tokens => "tokens",
        };
        out += &format!(
            "prompt {} ({kind}, {} tokens): {:?}\n",
            i + 1,
            p.prompt_tokens,
            p.prompt
        );
        if p.bitwise {
            out += &format!("  logits bitwise identical at all {} steps\n", p.steps);
        } else {
            out += &format!(
                "  min logits cos {:.6} @{}, argmax mismatches {}/{}\n",
                p.min_cos, p.min_cos_pos, p.argmax_mismatches, p.steps
            );
        }
        match &p.parting {
            None => out += &format!("  greedy answers identical for {} tokens\n", p.steps),
            Some(x) => {
                out += &format!(
                    "  greedy answers part at generated token {} (pos {}): A {} vs B {}\n",
                    x.step,
                    x.pos,
                    quoted(&x.a_piece),
                    quoted(&x.b_piece)
                );
            }
        }
        if let Some(a) = &p.a_text {
            out += &format!("  A: {a:?}\n");
        }
        if p.parting.is_some() {
            if let Some(b) = &p.b_text {
                out += &format!("  B: {b:?}\n");
            }
        }
        out += "\n";
    }
    let parted = r.prompts.iter().filter(|p| p.parting.is_some()).count();
    out += &format!(
        "{parted} of {} prompts part within {} tokens\n",
        r.prompts.len(),
        r.gen
    );
    out
}
