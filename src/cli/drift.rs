//! `taptree drift`: greedy answers under two configurations, prompt by
//! prompt (the algorithm and its report are [`crate::drift`]'s).

use crate::drift::{self, ForwardSetup};
use crate::exit;
use anyhow::{bail, Context};
use std::path::PathBuf;

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

pub fn run(args: Args) -> anyhow::Result<u8> {
    let arm_a = ForwardSetup::parse(&args.a).context("--a")?;
    let arm_b = ForwardSetup::parse(&args.b).context("--b")?;
    if args.gen == 0 {
        bail!("--gen 0: nothing to generate");
    }
    let content = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("{}", args.prompts.display()))?;
    let prompts = drift::parse_prompts(&args.prompts, &content)?;
    let path = fetch::resolve(&args.model)?;
    let model = model::load::load_model(&path)?;
    let report = drift::run(
        &model,
        arm_a,
        arm_b,
        &args.prompts,
        &prompts,
        args.gen,
        |r, n, total| {
            if !args.json {
                eprintln!("{}", drift::render::progress_line(r, n, total));
            }
        },
    )?;
    if let Some(path) = &args.html {
        std::fs::write(path, drift::html::page(&report).render())
            .with_context(|| format!("{}", path.display()))?;
    }
    let code = if report.any_parted() {
        exit::DIVERGED
    } else {
        exit::OK
    };
    exit::report(code, |out| {
        if args.json {
            exit::json(out, &report)
        } else {
            out.write_all(drift::render::text(&report).as_bytes())
        }
    })
}
