//! `taptree drift`: greedy answers under two configurations, prompt by prompt.
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

use crate::exit;
use anyhow::{bail, Context};
use kernels::generate::argmax;
use kernels::switches::Switches;
use kernels::tokenizer::Tokenizer;
use kernels::{Forward, Precision};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `taptree drift`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// `smollm2`, a fixture (`tiny-q`, ...), a GGUF file or an HF directory.
    #[arg(long)]
    pub model: String,
    /// The prompts file: one `chat: TEXT`, `text: TEXT` or `tokens: ID ...`
    /// per line; blank lines and `#` comments are ignored.
    #[arg(long, value_name = "FILE")]
    pub prompts: PathBuf,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 32)]
    pub gen: usize,
    /// Arm A, e.g. `precision=f32`.
    #[arg(long, value_name = "ARM")]
    pub a: String,
    /// Arm B, e.g. `precision=f32,TAPTREE_ACT_FFN_DOWN=q8`.
    #[arg(long, value_name = "ARM")]
    pub b: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report: each prompt's logits error
    /// per generated token, where the answers part.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// One configuration of the forward.
#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    pub spec: String,
    pub backend: String,
    pub precision: String,
    pub switches: std::collections::BTreeMap<String, String>,
    #[serde(skip)]
    parsed: (Precision, Switches),
}

impl Arm {
    pub fn parse(spec: &str) -> anyhow::Result<Arm> {
        let mut precision = Precision::F32;
        let mut backend = "cpu".to_string();
        let mut vars = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                bail!("arm {spec:?}: {part:?}: expected KEY=VALUE");
            };
            match key {
                "precision" => {
                    precision = Precision::parse(value).with_context(|| {
                        format!(
                            "arm {spec:?}: precision {value:?}: expected f32, q8, llamacpp or f64"
                        )
                    })?
                }
                "backend" => backend = value.to_string(),
                _ if key.starts_with("TAPTREE_ACT_") => vars.push((key, value)),
                _ => bail!(
                    "arm {spec:?}: {key:?}: unknown setting (precision, backend, TAPTREE_ACT_*)"
                ),
            }
        }
        let switches =
            Switches::from_vars(vars.iter().copied()).with_context(|| format!("arm {spec:?}"))?;
        Ok(Arm {
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
    Chat,
    Text,
    Tokens,
}

/// One line of the prompts file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub line: usize,
    pub kind: PromptKind,
    pub text: String,
}

/// Parses a prompts file; errors name the file and line.
pub fn parse_prompts(path: &Path, content: &str) -> anyhow::Result<Vec<Prompt>> {
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
            bail!(
                "{}:{}: {line:?}: expected a `chat:`, `text:` or `tokens:` prefix",
                path.display(),
                i + 1
            );
        };
        let text = text.trim().to_string();
        if text.is_empty() {
            bail!("{}:{}: empty prompt", path.display(), i + 1);
        }
        prompts.push(Prompt {
            line: i + 1,
            kind,
            text,
        });
    }
    if prompts.is_empty() {
        bail!("{}: no prompts", path.display());
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
    pub a_token: u32,
    pub b_token: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a_piece: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_piece: Option<String>,
}

/// The figures of one prompt.
#[derive(Debug, Clone, Serialize)]
pub struct PromptDrift {
    pub line: usize,
    pub kind: PromptKind,
    pub prompt: String,
    pub prompt_tokens: usize,
    /// Steps compared (A's generated tokens).
    pub steps: usize,
    pub min_cos: f64,
    /// The position of the minimum.
    pub min_cos_pos: usize,
    pub argmax_mismatches: usize,
    /// Every compared logit vector bitwise equal.
    pub bitwise: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parting: Option<Parting>,
    pub a_tokens: Vec<u32>,
    pub b_tokens: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a_text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_text: Option<String>,
    /// The logits' cosine at each step (for the HTML report).
    #[serde(skip)]
    pub step_cos: Vec<f64>,
    /// A's tokens as text, one per step (for the HTML report).
    #[serde(skip)]
    pub a_pieces: Vec<String>,
}

/// Everything drift found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    pub gen: usize,
    pub a: Arm,
    pub b: Arm,
    pub prompts: Vec<PromptDrift>,
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

fn encode(tok: Option<&Tokenizer>, p: &Prompt, path: &Path) -> anyhow::Result<Vec<u32>> {
    let at = || format!("{}:{}", path.display(), p.line);
    if p.kind == PromptKind::Tokens {
        return p
            .text
            .split_whitespace()
            .map(|t| {
                t.parse::<u32>()
                    .with_context(|| format!("{}: bad token id {t:?}", at()))
            })
            .collect();
    }
    let Some(tok) = tok else {
        bail!(
            "{}: the model carries no tokenizer; use a `tokens:` prompt",
            at()
        );
    };
    let ids = match p.kind {
        PromptKind::Chat => tok.encode_chat(&p.text),
        _ => tok.encode(&p.text),
    }
    .with_context(at)?;
    if ids.is_empty() {
        bail!("{}: the prompt encodes to no tokens", at());
    }
    Ok(ids)
}

/// Runs both arms over one prompt.
fn drift_one(
    a: &mut dyn Forward,
    b: &mut dyn Forward,
    tok: Option<&Tokenizer>,
    prompt: &Prompt,
    ids: &[u32],
    gen: usize,
) -> anyhow::Result<PromptDrift> {
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
    let mut step_cos = Vec::new();
    for step in 0..gen {
        let m = compare_logits(&la, &lb);
        bitwise &= m.bitwise();
        let cos = m.cos;
        step_cos.push(cos);
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
        step_cos,
        a_pieces: a_tokens
            .iter()
            .map(|&t| piece(t).unwrap_or_else(|| format!("#{t}")))
            .collect(),
        a_tokens,
        b_tokens,
    })
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let arm_a = Arm::parse(&args.a).context("--a")?;
    let arm_b = Arm::parse(&args.b).context("--b")?;
    if args.gen == 0 {
        bail!("--gen 0: nothing to generate");
    }
    let content = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("{}", args.prompts.display()))?;
    let prompts = parse_prompts(&args.prompts, &content)?;
    let path = kernels::fetch::resolve(&args.model)?;
    let model = kernels::load::load_model(&path)?;
    let tok = model.tokenizer.as_ref();
    let encoded: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| encode(tok, p, &args.prompts))
        .collect::<anyhow::Result<_>>()?;
    let open = |arm: &Arm| {
        kernels::backend::open(&arm.backend, &model.weights, arm.parsed.0, &arm.parsed.1)
            .with_context(|| format!("arm {:?}", arm.spec))
    };
    let mut fa = open(&arm_a)?;
    let mut fb = open(&arm_b)?;
    let mut results = Vec::new();
    for (p, ids) in prompts.iter().zip(&encoded) {
        let r = drift_one(fa.as_mut(), fb.as_mut(), tok, p, ids, args.gen)
            .with_context(|| format!("{}:{}", args.prompts.display(), p.line))?;
        if !args.json {
            eprintln!("{}", progress_line(&r, results.len() + 1, prompts.len()));
        }
        results.push(r);
    }
    let report = Report {
        model: path.display().to_string(),
        gen: args.gen,
        a: arm_a,
        b: arm_b,
        prompts: results,
    };
    if let Some(path) = &args.html {
        std::fs::write(path, super::drift_html::page(&report).render())
            .with_context(|| format!("{}", path.display()))?;
    }
    if args.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.prompts.iter().any(|p| p.parting.is_some()) {
        exit::DIVERGED
    } else {
        exit::OK
    })
}

fn progress_line(r: &PromptDrift, n: usize, total: usize) -> String {
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

fn render(r: &Report) -> String {
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
        let a = Arm::parse("TAPTREE_ACT_FFN_DOWN=q8,TAPTREE_ACT_ATTN=f32").unwrap();
        assert_eq!(a.precision, "f32");
        assert_eq!(a.switches["TAPTREE_ACT_FFN_DOWN"], "q8");
        assert_eq!(a.switches.len(), 2);
        let b = Arm::parse("precision=q8").unwrap();
        assert_eq!(b.parsed.0, Precision::Q8);
        assert!(Arm::parse("precision=int4").is_err());
        assert!(Arm::parse("TAPTREE_ACT_FFN_DOWN=int4").is_err());
        assert!(Arm::parse("speed=fast").is_err());
        assert!(Arm::parse("q8").is_err());
    }
}
