//! Drift: greedy answers under two configurations, prompt by prompt.
//!
//! For each prompt, arm A generates greedily; arm B is fed A's tokens in
//! lockstep, so that at every step both arms see the same input and their
//! logits compare like with like (cosine, argmax). The first step where B's
//! argmax differs from A's is exactly where two independent greedy runs
//! part; from there B's own answer is generated separately, for display.
//!
//! Prompts file, one prompt per line:
//!
//! ```text
//! # comments and blank lines are ignored
//! chat: What is the capital of France?      (one user turn, the model's chat template)
//! text: The quick brown fox                  (raw text, no template)
//! tokens: 1 17 42                            (token ids, for models without a tokenizer)
//! ```
//!
//! An arm is a comma-separated list of `precision=f32|q8|f64`, `backend=cpu|cuda`
//! and precision switches (`TAPTREE_ACT_FFN_DOWN=q8`); what it leaves out is
//! f32 on the cpu with no switch.
//!
//! [`run`] computes a [`DriftReport`]; [`render`] presents it.

pub mod render;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kernels::generate::argmax;
use kernels::switches::{SwitchError, Switches};
use kernels::{Forward, ForwardError, Precision};
use model::tokenizer::{Tokenizer, TokenizerError};
use serde::Serialize;

/// Why a drift could not be run. Each message names the arm, or the prompts
/// file and line, it is about.
#[derive(Debug, thiserror::Error)]
pub enum DriftError {
    /// An arm's spec is malformed.
    #[error("arm {spec:?}: {reason}")]
    BadSetup {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An arm's precision switches are invalid.
    #[error("arm {spec:?}")]
    Switches {
        /// The spec as given.
        spec: String,
        /// The switch's error.
        #[source]
        source: SwitchError,
    },
    /// The forward of an arm could not be opened.
    #[error("arm {spec:?}")]
    Open {
        /// The spec as given.
        spec: String,
        /// The forward's error.
        #[source]
        source: ForwardError,
    },
    /// A line of the prompts file is malformed.
    #[error("{}:{line}: {reason}", path.display())]
    BadPrompt {
        /// The prompts file.
        path: PathBuf,
        /// Its 1-based line.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The prompts file holds no prompt.
    #[error("{}: no prompts", path.display())]
    NoPrompts {
        /// The prompts file.
        path: PathBuf,
    },
    /// A token id of a `tokens:` prompt is not a number.
    #[error("{}:{line}: bad token id {token:?}", path.display())]
    BadTokenId {
        /// The prompts file.
        path: PathBuf,
        /// Its 1-based line.
        line: usize,
        /// The text that is not an id.
        token: String,
        /// Why it does not parse.
        #[source]
        source: std::num::ParseIntError,
    },
    /// The tokenizer refused a prompt.
    #[error("{}:{line}", path.display())]
    Encode {
        /// The prompts file.
        path: PathBuf,
        /// Its 1-based line.
        line: usize,
        /// The tokenizer's error.
        #[source]
        source: TokenizerError,
    },
    /// A forward failed while running a prompt.
    #[error("{}:{line}", path.display())]
    Forward {
        /// The prompts file.
        path: PathBuf,
        /// Its 1-based line.
        line: usize,
        /// The forward's error.
        #[source]
        source: ForwardError,
    },
}

/// One configuration of the forward (a `--a`/`--b` arm).
#[derive(Debug, Clone, Serialize)]
pub struct ForwardSetup {
    /// The spec as given, e.g. `precision=f32,TAPTREE_ACT_FFN_DOWN=q8`.
    pub spec: String,
    /// `cpu` or `cuda`.
    pub backend: String,
    /// The precision's name.
    pub precision: String,
    /// The precision switches, by variable.
    pub switches: BTreeMap<String, String>,
    #[serde(skip)]
    parsed: (Precision, Switches),
}

impl ForwardSetup {
    /// Parses a comma-separated `precision=`, `backend=`, `TAPTREE_ACT_*=` list.
    pub fn parse(spec: &str) -> Result<ForwardSetup, DriftError> {
        let bad = |reason: String| DriftError::BadSetup {
            spec: spec.to_string(),
            reason,
        };
        let mut precision = Precision::F32;
        let mut backend = "cpu".to_string();
        let mut vars = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(bad(format!("{part:?}: expected KEY=VALUE")));
            };
            match key {
                "precision" => {
                    precision = Precision::parse(value).ok_or_else(|| {
                        bad(format!(
                            "precision {value:?}: expected f32, q8, llamacpp or f64"
                        ))
                    })?
                }
                "backend" => backend = value.to_string(),
                _ if key.starts_with("TAPTREE_ACT_") => vars.push((key, value)),
                _ => {
                    return Err(bad(format!(
                        "{key:?}: unknown setting (precision, backend, TAPTREE_ACT_*)"
                    )))
                }
            }
        }
        let switches =
            Switches::from_vars(vars.iter().copied()).map_err(|source| DriftError::Switches {
                spec: spec.to_string(),
                source,
            })?;
        Ok(ForwardSetup {
            spec: spec.to_string(),
            backend,
            precision: precision.name().to_string(),
            switches: switches.to_map(),
            parsed: (precision, switches),
        })
    }
}

/// How a prompt is turned into tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptKind {
    /// One user turn, in the model's chat template.
    Chat,
    /// Raw text, no template.
    Text,
    /// Token ids.
    Tokens,
}

/// One line of the prompts file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Its 1-based line in the file.
    pub line: usize,
    /// How it becomes tokens.
    pub kind: PromptKind,
    /// The text after the prefix, trimmed.
    pub text: String,
}

/// Parses a prompts file; errors name the file and line.
pub fn parse_prompts(path: &Path, content: &str) -> Result<Vec<Prompt>, DriftError> {
    let bad = |line: usize, reason: String| DriftError::BadPrompt {
        path: path.into(),
        line,
        reason,
    };
    let mut prompts = Vec::new();
    for (i, raw) in content.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (kind, text) = if let Some(t) = line.strip_prefix("chat:") {
            (PromptKind::Chat, t)
        } else if let Some(t) = line.strip_prefix("text:") {
            (PromptKind::Text, t)
        } else if let Some(t) = line.strip_prefix("tokens:") {
            (PromptKind::Tokens, t)
        } else {
            return Err(bad(
                i + 1,
                format!("{line:?}: expected a `chat:`, `text:` or `tokens:` prefix"),
            ));
        };
        let text = text.trim().to_string();
        if text.is_empty() {
            return Err(bad(i + 1, "empty prompt".into()));
        }
        prompts.push(Prompt {
            line: i + 1,
            kind,
            text,
        });
    }
    if prompts.is_empty() {
        return Err(DriftError::NoPrompts { path: path.into() });
    }
    Ok(prompts)
}

/// Where the greedy answers part.
#[derive(Debug, Clone, Serialize)]
pub struct Parting {
    /// Index of the generated token (0 = the first).
    pub step: usize,
    /// The position whose logits chose it.
    pub pos: usize,
    /// A's token there.
    pub a_token: u32,
    /// B's token there.
    pub b_token: u32,
    /// A's token as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a_piece: Option<String>,
    /// B's token as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_piece: Option<String>,
}

/// The figures of one prompt.
#[derive(Debug, Clone, Serialize)]
pub struct PromptDrift {
    /// The prompt's line in the prompts file.
    pub line: usize,
    /// How it became tokens.
    pub kind: PromptKind,
    /// Its text.
    pub prompt: String,
    /// How many tokens it encodes to.
    pub prompt_tokens: usize,
    /// Steps compared (A's generated tokens).
    pub steps: usize,
    /// The minimum cosine of the two arms' logits.
    pub min_cos: f64,
    /// The position of the minimum.
    pub min_cos_pos: usize,
    /// Steps where the two argmaxes differ.
    pub argmax_mismatches: usize,
    /// Every compared logit vector bitwise equal.
    pub bitwise: bool,
    /// Where the greedy answers part, if they do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parting: Option<Parting>,
    /// A's greedy answer.
    pub a_tokens: Vec<u32>,
    /// B's own greedy answer.
    pub b_tokens: Vec<u32>,
    /// A's answer as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a_text: Option<String>,
    /// B's answer as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_text: Option<String>,
}

/// Everything drift found.
#[derive(Debug, Clone, Serialize)]
pub struct DriftReport {
    /// The model's path.
    pub model: String,
    /// Tokens generated per prompt (at most).
    pub gen: usize,
    /// Arm A.
    pub a: ForwardSetup,
    /// Arm B.
    pub b: ForwardSetup,
    /// One entry per prompt, in file order.
    pub prompts: Vec<PromptDrift>,
}

impl DriftReport {
    /// Whether any prompt's greedy answers part.
    pub fn any_parted(&self) -> bool {
        self.prompts.iter().any(|p| p.parting.is_some())
    }
}

/// The diff's metrics of two logit vectors (cosine, bitwise equality).
fn compare_logits(a: &[f32], b: &[f32]) -> diff::Metrics {
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    diff::metrics::compare(
        &bytes(a),
        capture::DType::F32,
        &bytes(b),
        capture::DType::F32,
    )
    .metrics()
}

/// A prompt's token ids.
pub fn encode(tok: Option<&Tokenizer>, p: &Prompt, path: &Path) -> Result<Vec<u32>, DriftError> {
    let bad = |reason: &str| DriftError::BadPrompt {
        path: path.into(),
        line: p.line,
        reason: reason.into(),
    };
    if p.kind == PromptKind::Tokens {
        return p
            .text
            .split_whitespace()
            .map(|t| {
                t.parse::<u32>().map_err(|source| DriftError::BadTokenId {
                    path: path.into(),
                    line: p.line,
                    token: t.into(),
                    source,
                })
            })
            .collect();
    }
    let Some(tok) = tok else {
        return Err(bad(
            "the model carries no tokenizer; use a `tokens:` prompt",
        ));
    };
    let ids = match p.kind {
        PromptKind::Chat => tok.encode_chat(&p.text),
        _ => tok.encode(&p.text),
    }
    .map_err(|source| DriftError::Encode {
        path: path.into(),
        line: p.line,
        source,
    })?;
    if ids.is_empty() {
        return Err(bad("the prompt encodes to no tokens"));
    }
    Ok(ids)
}

/// Runs both arms over one prompt.
pub fn drift_one(
    a: &mut dyn Forward,
    b: &mut dyn Forward,
    tok: Option<&Tokenizer>,
    prompt: &Prompt,
    ids: &[u32],
    gen: usize,
) -> Result<PromptDrift, ForwardError> {
    a.reset();
    b.reset();
    let is_end = |t: u32| tok.is_some_and(|k| k.is_end(t));
    let piece = |t: u32| tok.and_then(|k| k.decode(&[t]).ok());
    let mut la = a.forward(None, ids, 0)?;
    let mut lb = b.forward(None, ids, 0)?;
    let mut pos = ids.len() - 1;
    let (mut min_cos, mut min_cos_pos) = (f64::INFINITY, pos);
    let mut mismatches = 0;
    let mut bitwise = true;
    let mut parting: Option<Parting> = None;
    let mut a_tokens = Vec::new();
    for step in 0..gen {
        let m = compare_logits(&la, &lb);
        bitwise &= m.bitwise();
        let cos = m.cos;
        if cos < min_cos || cos.is_nan() {
            (min_cos, min_cos_pos) = (cos, pos);
        }
        let (ta, tb) = (argmax(&la), argmax(&lb));
        if ta != tb {
            mismatches += 1;
            if parting.is_none() {
                parting = Some(Parting {
                    step,
                    pos,
                    a_token: ta,
                    b_token: tb,
                    a_piece: piece(ta),
                    b_piece: piece(tb),
                });
            }
        }
        a_tokens.push(ta);
        if is_end(ta) || step + 1 == gen {
            break;
        }
        pos += 1;
        la = a.forward(None, &[ta], pos)?;
        lb = b.forward(None, &[ta], pos)?;
    }
    // B's own answer: the shared prefix, its own choice at the parting, then
    // its own greedy continuation.
    let b_tokens = match &parting {
        None => a_tokens.clone(),
        Some(p) => {
            let mut own: Vec<u32> = a_tokens[..p.step].to_vec();
            own.push(p.b_token);
            if !is_end(p.b_token) && own.len() < gen {
                b.reset();
                let mut context = ids.to_vec();
                context.extend_from_slice(&own);
                let stops = tok.map(|k| k.end_ids()).unwrap_or_default();
                let rest = kernels::generate::greedy(b, &context, gen - own.len(), &stops)?;
                own.extend(rest.tokens);
            }
            own
        }
    };
    let text = |t: &[u32]| tok.and_then(|k| k.decode(t).ok());
    Ok(PromptDrift {
        line: prompt.line,
        kind: prompt.kind,
        prompt: prompt.text.clone(),
        prompt_tokens: ids.len(),
        steps: a_tokens.len(),
        min_cos,
        min_cos_pos,
        argmax_mismatches: mismatches,
        bitwise,
        parting,
        a_text: text(&a_tokens),
        b_text: text(&b_tokens),
        a_tokens,
        b_tokens,
    })
}

/// Runs both arms over every prompt and collects the report; `on_prompt`
/// sees each prompt's figures as they come (prompt number, of how many).
pub fn run(
    model: &model::load::LoadedModel,
    a: ForwardSetup,
    b: ForwardSetup,
    prompts_path: &Path,
    prompts: &[Prompt],
    gen: usize,
    mut on_prompt: impl FnMut(&PromptDrift, usize, usize),
) -> Result<DriftReport, DriftError> {
    let tok = model.tokenizer.as_ref();
    let encoded: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| encode(tok, p, prompts_path))
        .collect::<Result<_, _>>()?;
    let open = |arm: &ForwardSetup| {
        kernels::backend::open(&arm.backend, &model.weights, arm.parsed.0, &arm.parsed.1).map_err(
            |source| DriftError::Open {
                spec: arm.spec.clone(),
                source,
            },
        )
    };
    let mut fa = open(&a)?;
    let mut fb = open(&b)?;
    let mut results = Vec::new();
    for (p, ids) in prompts.iter().zip(&encoded) {
        let r = drift_one(fa.as_mut(), fb.as_mut(), tok, p, ids, gen).map_err(|source| {
            DriftError::Forward {
                path: prompts_path.into(),
                line: p.line,
                source,
            }
        })?;
        on_prompt(&r, results.len() + 1, prompts.len());
        results.push(r);
    }
    Ok(DriftReport {
        model: model.source.path.display().to_string(),
        gen,
        a,
        b,
        prompts: results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prompts_and_names_bad_lines() {
        let p = Path::new("p.txt");
        let got =
            parse_prompts(p, "# x\n\nchat: Hi there\ntext:  The fox \ntokens: 1 2\n").unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].kind, PromptKind::Chat);
        assert_eq!(got[0].line, 3);
        assert_eq!(got[1].text, "The fox");
        assert_eq!(got[2].kind, PromptKind::Tokens);
        let e = parse_prompts(p, "chat: a\nhello\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "p.txt:2: \"hello\": expected a `chat:`, `text:` or `tokens:` prefix"
        );
        assert!(parse_prompts(p, "# only\n").is_err());
        assert!(parse_prompts(p, "text:   \n").is_err());
    }

    #[test]
    fn parses_arms() {
        let a = ForwardSetup::parse("TAPTREE_ACT_FFN_DOWN=q8,TAPTREE_ACT_ATTN=f32").unwrap();
        assert_eq!(a.precision, "f32");
        assert_eq!(a.switches["TAPTREE_ACT_FFN_DOWN"], "q8");
        assert_eq!(a.switches.len(), 2);
        let b = ForwardSetup::parse("precision=q8").unwrap();
        assert_eq!(b.parsed.0, Precision::Q8);
        assert!(ForwardSetup::parse("precision=int4").is_err());
        assert!(ForwardSetup::parse("TAPTREE_ACT_FFN_DOWN=int4").is_err());
        assert!(ForwardSetup::parse("speed=fast").is_err());
        assert!(ForwardSetup::parse("q8").is_err());
    }
}
