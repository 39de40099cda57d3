//! `taptree drift --html`: the drift report on the diff's page. One row per
//! prompt; its positions are the generated tokens, each valued by how far
//! B's logits are from A's (1 − cosine), failing where the argmax differs;
//! the first prompt whose answers part and the prompt with the largest
//! logits error are marked.

use super::{DriftReport, PromptKind};
use diff::render::html::{Detail, Marker, MarkerKind, Page, PageRow, PosValue, Verdict};

fn kind(k: PromptKind) -> &'static str {
    match k {
        PromptKind::Chat => "chat",
        PromptKind::Text => "text",
        PromptKind::Tokens => "tokens",
    }
}

fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The page of a drift report.
pub fn page(r: &DriftReport) -> Page {
    let rows: Vec<PageRow> = r
        .prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let verdict = if p.parting.is_some() {
                Verdict::Fail
            } else if p.bitwise {
                Verdict::Equal
            } else {
                Verdict::Pass
            };
            let parting = p.parting.as_ref().map_or("no".to_string(), |x| {
                format!(
                    "at token {}: A {:?} vs B {:?}",
                    x.step,
                    x.a_piece.as_deref().unwrap_or("?"),
                    x.b_piece.as_deref().unwrap_or("?")
                )
            });
            let mut lines = vec![format!(
                "{} prompt, {} tokens: {:?}",
                kind(p.kind),
                p.prompt_tokens,
                p.prompt
            )];
            lines.extend(p.a_text.as_ref().map(|t| format!("A: {t:?}")));
            if p.parting.is_some() {
                lines.extend(p.b_text.as_ref().map(|t| format!("B: {t:?}")));
            }
            lines.push(format!("answers part: {parting}"));
            PageRow {
                layer: None,
                stage: format!("prompt {}", i + 1),
                verdict,
                value: if p.bitwise { 0.0 } else { 1.0 - p.min_cos },
                cells: vec![
                    clip(&p.prompt, 40),
                    p.steps.to_string(),
                    format!("{:.6} @{}", p.min_cos, p.min_cos_pos),
                    format!("{}/{}", p.argmax_mismatches, p.steps),
                    parting,
                ],
                positions: p
                    .step_cos
                    .iter()
                    .enumerate()
                    .map(|(step, cos)| PosValue {
                        pos: step as u32,
                        slot: None,
                        value: 1.0 - cos,
                        // The step where the argmaxes first differ.
                        pass: p.parting.as_ref().is_none_or(|x| x.step != step),
                    })
                    .collect(),
                equal_runs: Vec::new(),
                inputs: Vec::new(),
                details: vec![Detail {
                    title: "answers".into(),
                    lines,
                }],
                tokens: p.a_pieces.clone(),
            }
        })
        .collect();
    let mut markers = Vec::new();
    if let Some(i) = r.prompts.iter().position(|p| p.parting.is_some()) {
        markers.push(Marker {
            row: i,
            kind: MarkerKind::FirstDivergence,
            label: "first prompt whose answers part".into(),
        });
    }
    let worst = (0..rows.len())
        .filter(|&i| rows[i].value > 0.0 || rows[i].value.is_nan())
        .max_by(|&i, &j| rows[i].value.total_cmp(&rows[j].value));
    if let Some(i) = worst {
        markers.push(Marker {
            row: i,
            kind: MarkerKind::LargestGrowth,
            label: "largest logits error".into(),
        });
    }
    let parted = r.prompts.iter().filter(|p| p.parting.is_some()).count();
    Page {
        title: "taptree drift".into(),
        headline: format!(
            "{parted} of {} prompts part within {} tokens",
            r.prompts.len(),
            r.gen
        ),
        red: parted > 0,
        facts: vec![
            ("model".into(), r.model.clone()),
            ("A".into(), r.a.spec.clone()),
            ("B".into(), r.b.spec.clone()),
        ],
        notes: vec![
            "B is fed A's tokens in lockstep: every step compares like with like; \
             a position is a generated token, out of tolerance where the argmaxes first differ"
                .into(),
        ],
        value_name: "1 − cosine of B's logits against A's".into(),
        columns: [
            "prompt",
            "steps",
            "min cos @pos",
            "argmax differs",
            "answers part",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        series: Vec::new(),
        markers,
        tokens: Vec::new(),
        prompt_len: None,
    }
}
