//! `taptree capture`: run a model's forward (prefill, then greedy decode) and
//! write every tap into a tree.
//!
//! Everything that can be refused is checked before the tree is started, so
//! bad input (unknown model, bad token id, empty or too long prompt, bad
//! selection or switch) leaves `--out` untouched.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use kernels::generate::{greedy, greedy_batch, Generation};
use kernels::switches::Switches;
use kernels::{backend, stages, Precision};
use model::load::{load_model, LoadedModel};
use model::tokenizer::Tokenizer;

use crate::cli::engine::{self, Engine, EngineRun};
use crate::cli::forward::{Backend, PrecisionArg};
use crate::exit;

/// Arguments of `taptree capture`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// `smollm2` or `gemma3-270m` (fetched once into the cache), a GGUF file, or an HF
    /// directory (config.json + *.safetensors).
    #[arg(long)]
    pub model: String,
    /// A plain-text prompt. Repeat (with --chat / --tokens) for batched
    /// slots: each sequence is prefilled into its slot, then all decode together.
    #[arg(long)]
    pub prompt: Vec<String>,
    /// A user turn, wrapped in the model's chat template.
    #[arg(long)]
    pub chat: Vec<String>,
    /// Token ids, comma-separated (`1,2,3`).
    #[arg(long)]
    pub tokens: Vec<String>,
    /// Tokens to generate greedily after the prefill; 0 = prefill only.
    #[arg(long, default_value_t = 0)]
    pub gen: usize,
    /// Generate through the end-of-turn token: `--gen N` then always runs N
    /// steps (to time decode over a fixed number of steps).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Where the built-in forward runs.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: Backend,
    /// Activation precision: `f32`, `q8` (int8 activations before quantized
    /// matmuls, as llama.cpp), `llamacpp` (`q8` with llama.cpp's own CPU
    /// rounding, RoPE and f16 attention; cpu only) or `f64` (the truth).
    /// `TAPTREE_ACT_*` variables override it per op family. A foreign
    /// `--engine` takes `f32`, `f64`, `bf16` or `f16` (its compute dtype).
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Tensor-parallel ranks (docs/TP.md): simulated on the cpu backend;
    /// on cuda one GPU per rank through NCCL, or every rank on one GPU
    /// with `TAPTREE_CUDA_TP=shared`. 1 (the default) is the one-device
    /// forward, unchanged.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Which taps to write, e.g. `stage=ffn_*;layer=20..30;pos=0`. Default: all.
    #[arg(long, env = "TAPTREE_SELECT")]
    pub select: Option<String>,
    /// The tree to write; with none (or an empty value), the run only
    /// prints its answer. A bisect's capture command writes where the
    /// bisect says, through the variable.
    #[arg(long, env = "TAPTREE_OUT", value_parser = clap::builder::ValueParser::os_string())]
    pub out: Option<std::ffi::OsString>,
    /// Replace an existing tree at `--out` (the variable: `1`, `true` or `yes`).
    #[arg(
        long,
        env = "TAPTREE_FORCE",
        action = clap::ArgAction::SetTrue,
        value_parser = force_value
    )]
    pub force: bool,
    /// Whose forward runs: `builtin` (taptree's own), `hf` (Hugging Face
    /// transformers) or `llama.cpp`. A foreign engine gets the prompt as
    /// taptree tokenizes it and writes its taps through the Python package
    /// (docs/ENGINES.md); its `--precision` is f32, f64, bf16 or f16.
    #[arg(long, value_enum, default_value = "builtin")]
    pub engine: Engine,
    /// CPU threads of a foreign engine's forward (the built-in forward
    /// reads `RAYON_NUM_THREADS`).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// One sequence to run: its label for the report and its token ids.
struct Sequence {
    label: String,
    tokens: Vec<u32>,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    if args.engine != Engine::Builtin {
        return run_engine(args);
    }
    if args.threads.is_some() {
        bail!(
            "--threads: only for a foreign --engine; the built-in forward reads RAYON_NUM_THREADS"
        );
    }
    let started = Instant::now();
    let precision = args.precision.builtin().with_context(|| {
        format!(
            "--precision: bad value {:?}: expected f32, q8, llamacpp or f64",
            args.precision.name()
        )
    })?;
    // What this machine decides (llama.cpp's build) is recorded as a switch.
    let switches = Switches::from_env()?.resolved_for(precision);
    let out = out_dir(&args);
    let selection = selection(&args)?;
    let (model, seqs) = load_sequences(&args)?;
    let mut fwd = backend::open_tp(
        args.backend.name(),
        &model.weights,
        precision,
        &switches,
        args.tp,
    )?;
    let stop = stop_ids(&args, &model);

    let mut run_info = run_info(&args, &model, precision, &switches, &seqs);
    let stages = match args.tp {
        1 => stages::for_config(&model.weights.config),
        _ => {
            // Only a split run says so: a one-device manifest keeps its bytes.
            run_info
                .extra
                .insert("tp".into(), serde_json::json!(args.tp));
            kernels::cpu::tp::stages(&model.weights.config)
        }
    };
    check_selection(&selection, &stages)?;
    let mut cap = match out {
        Some(out) => Some(capture::Capture::start(capture::CaptureOptions {
            out,
            selection,
            force: args.force,
            stages,
            run: run_info,
        })?),
        None => None,
    };

    let t0 = Instant::now();
    let gens: Vec<Generation> = if seqs.len() == 1 {
        vec![greedy(fwd.as_mut(), &seqs[0].tokens, args.gen, &stop)?]
    } else {
        let prompts: Vec<Vec<u32>> = seqs.iter().map(|s| s.tokens.clone()).collect();
        greedy_batch(fwd.as_mut(), &prompts, args.gen, &stop)?
    };
    let forward_s = t0.elapsed().as_secs_f64();
    if let Some(c) = cap.as_mut() {
        c.run_mut().extra.insert(
            "generated_tokens".into(),
            serde_json::json!(gens.iter().map(|g| &g.tokens).collect::<Vec<_>>()),
        );
        // Each position's token as text, for reports (one list per sequence).
        if let Some(t) = &model.tokenizer {
            c.run_mut().extra.insert(
                "token_pieces".into(),
                serde_json::json!(token_pieces(t, &seqs, &gens)),
            );
        }
    }

    // The report is written once the tree is finished: a reader that went
    // away, or a full disk, must not end the run with its tree unfinished.
    let mut report = format!(
        "model {} (blake3 {}), {} {}{}\n",
        model.source.path.display(),
        short(&model.source.blake3),
        args.backend.name(),
        precision,
        describe_switches(&switches)
    );
    report += &answers(&model, &seqs, &gens, args.gen)?;
    let positions: usize = seqs
        .iter()
        .zip(&gens)
        .map(|(s, g)| s.tokens.len() + g.tokens.len().saturating_sub(1))
        .sum();
    let speed = Speed {
        started,
        forward_s,
        positions,
    };
    report += &finish(cap, &speed)?;
    exit::report(exit::OK, |out| out.write_all(report.as_bytes()))
}

/// How long a run took, and over how many positions.
struct Speed {
    started: Instant,
    forward_s: f64,
    positions: usize,
}

/// Finishes the tree (if one is written); the line that says what was written.
fn finish(cap: Option<capture::Capture>, speed: &Speed) -> anyhow::Result<String> {
    let per_s = speed.positions as f64 / speed.forward_s.max(1e-9);
    Ok(match cap {
        Some(c) => {
            let summary = c.finish()?;
            format!(
                "captured {} taps, {} bytes, root {} in {:.2} s (forward {:.2} s, {:.1} positions/s) -> {}\n",
                summary.taps,
                summary.bytes,
                summary.root,
                speed.started.elapsed().as_secs_f64(),
                speed.forward_s,
                per_s,
                summary.path.display()
            )
        }
        None => format!(
            "no tree written (no --out, no TAPTREE_OUT); forward {:.2} s, {:.1} positions/s\n",
            speed.forward_s, per_s
        ),
    })
}

/// The run's record in the manifest: model, backend, precision, switches,
/// the command line's sequences.
fn run_info(
    args: &Args,
    model: &LoadedModel,
    precision: Precision,
    switches: &Switches,
    seqs: &[Sequence],
) -> capture::RunInfo {
    capture::RunInfo {
        model: model.source.path.display().to_string(),
        model_blake3: Some(model.source.blake3.clone()),
        backend: args.backend.name().into(),
        precision: precision.name().into(),
        switches: switches.to_map(),
        prompt_tokens: seqs[0].tokens.clone(),
        git_rev: git_rev(),
        extra: [
            ("model_spec".to_string(), serde_json::json!(args.model)),
            ("gen".to_string(), serde_json::json!(args.gen)),
            (
                "slots".to_string(),
                serde_json::json!(seqs.iter().map(|s| &s.tokens).collect::<Vec<_>>()),
            ),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// Each position's token as text (prompt, then generated), one list per
/// sequence: `#id` where the tokenizer cannot decode a token alone.
fn token_pieces(t: &Tokenizer, seqs: &[Sequence], gens: &[Generation]) -> Vec<Vec<String>> {
    seqs.iter()
        .zip(gens)
        .map(|(s, g)| {
            s.tokens
                .iter()
                .chain(&g.tokens)
                .map(|&id| t.decode(&[id]).unwrap_or_else(|_| format!("#{id}")))
                .collect()
        })
        .collect()
}

/// Each sequence's prompt length, generated count and (with `gen > 0`)
/// its answer as text, a line each.
fn answers(
    model: &LoadedModel,
    seqs: &[Sequence],
    gens: &[Generation],
    gen: usize,
) -> anyhow::Result<String> {
    let mut out = String::new();
    for (s, g) in seqs.iter().zip(gens) {
        // The stop token ends the answer; it is not part of its text.
        let shown = &g.tokens[..g.tokens.len() - usize::from(g.stopped)];
        let text = match &model.tokenizer {
            Some(t) => t.decode(shown)?,
            None => format!("{shown:?}"),
        };
        out += &format!(
            "{}: {} prompt tokens, {} generated{}\n",
            s.label,
            s.tokens.len(),
            g.tokens.len(),
            if g.stopped {
                " (stopped at end of turn)"
            } else {
                ""
            }
        );
        if gen > 0 {
            out += &format!("  {}\n", text.trim_end());
        }
    }
    Ok(out)
}

/// `--engine hf|llama.cpp`: the same model resolution, tokenization and
/// checks as the built-in forward, then the engine's Python adapter writes
/// the tree.
fn run_engine(args: Args) -> anyhow::Result<u8> {
    let name = args.engine.name();
    if args.backend != Backend::Cpu {
        bail!(
            "--backend {:?}: the built-in forward's flag; --engine {name} picks its own device",
            args.backend.name(),
        );
    }
    if !engine::PRECISIONS.contains(&args.precision.name()) {
        bail!(
            "--precision: bad value {:?} for --engine {name}: expected {}",
            args.precision.name(),
            engine::PRECISIONS.join(", ")
        );
    }
    let out = out_dir(&args)
        .with_context(|| format!("--engine {name} writes a tree: give --out (or TAPTREE_OUT)"))?;
    let selection = selection(&args)?;
    let (model, seqs) = load_sequences(&args)?;
    check_selection(&selection, &stages::for_config(&model.weights.config))?;
    if seqs.len() > 1 {
        bail!(
            "--engine {name}: one sequence at a time ({} given)",
            seqs.len()
        );
    }
    let seq = &seqs[0];
    // The engine parses the same grammar; "all" is no selection.
    let select = (!selection.is_all()).then(|| selection.to_string());
    // Said now, before the engine's long run; a failure to write it (a
    // reader gone, a full disk) must not end the run before the engine has
    // written its tree: the report at the end meets it again.
    let _ = writeln!(
        std::io::stdout(),
        "model {} (blake3 {}), engine {} {}; {}: {} prompt tokens",
        model.source.path.display(),
        short(&model.source.blake3),
        name,
        args.precision.name(),
        seq.label,
        seq.tokens.len()
    );
    let run = serde_json::json!({
        "model": model.source.path.display().to_string(),
        "model_blake3": model.source.blake3,
        "prompt_tokens": seq.tokens,
        "git_rev": git_rev(),
        "argv": std::env::args().collect::<Vec<_>>(),
        "extra": {"model_spec": args.model, "gen": args.gen, "slots": [&seq.tokens]},
    });
    let stop = stop_ids(&args, &model);
    engine::run(&EngineRun {
        engine: name,
        model_file: &model.source.path,
        tokens: &seq.tokens,
        out: &out,
        gen: args.gen,
        stop: &stop,
        select: select.as_deref(),
        force: args.force,
        precision: args.precision.name(),
        threads: args.threads,
        run,
    })?;
    // The engine's greedy answer, in taptree's own words.
    let mut report = String::new();
    if args.gen > 0 {
        let tree = capture::TreeReader::open(&out)?;
        let extra = &tree.manifest().run.extra;
        let ids: Vec<u32> = extra
            .get("generated_tokens")
            .and_then(|g| g.get(0))
            .and_then(|g| serde_json::from_value(g.clone()).ok())
            .unwrap_or_default();
        let shown: Vec<u32> = ids.iter().copied().filter(|t| !stop.contains(t)).collect();
        let text = match &model.tokenizer {
            Some(t) => t.decode(&shown)?,
            None => format!("{shown:?}"),
        };
        report = format!("{} generated: {}\n", ids.len(), text.trim_end());
    }
    exit::report(exit::OK, |out| out.write_all(report.as_bytes()))
}

/// `--out` (or `$TAPTREE_OUT`), none when empty.
fn out_dir(args: &Args) -> Option<PathBuf> {
    args.out
        .clone()
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `--force`'s value from `TAPTREE_FORCE` (the flag alone gives `true`).
fn force_value(v: &str) -> Result<bool, std::convert::Infallible> {
    Ok(capture::force_is_set(v))
}

/// `--select` (or `$TAPTREE_SELECT`), parsed before any work; a misspelt
/// stage would capture nothing, so one that no model family taps is refused
/// here, before the model loads ([`check_selection`] then holds it to the
/// model's own vocabulary).
fn selection(args: &Args) -> anyhow::Result<capture::Selection> {
    let selection = match &args.select {
        Some(s) => capture::Selection::parse(s)
            .with_context(|| format!("--select (or TAPTREE_SELECT) {s:?}"))?,
        None => capture::Selection::all(),
    };
    check_selection(&selection, &stages::every_family())?;
    Ok(selection)
}

/// Refuses a selection with a stage glob that matches no stage of
/// `vocabulary`, naming the stages there are.
fn check_selection(
    selection: &capture::Selection,
    vocabulary: &[capture::StageSpec],
) -> anyhow::Result<()> {
    let names: Vec<&str> = vocabulary.iter().map(|s| s.name.as_str()).collect();
    if let Some(glob) = selection.unmatched_stage_globs(&names).first() {
        bail!(
            "--select {:?}: stage {glob:?} is not one of {}",
            selection.to_string(),
            names.join(", ")
        );
    }
    Ok(())
}

/// The tokens that end generation: the tokenizer's end ids, none with
/// `--ignore-eos`.
fn stop_ids(args: &Args, model: &LoadedModel) -> Vec<u32> {
    match &model.tokenizer {
        Some(t) if !args.ignore_eos => t.end_ids(),
        _ => Vec::new(),
    }
}

/// The model and the command line's sequences, checked against its
/// vocabulary and context length: the same for every engine.
fn load_sequences(args: &Args) -> anyhow::Result<(LoadedModel, Vec<Sequence>)> {
    if args.prompt.is_empty() && args.chat.is_empty() && args.tokens.is_empty() {
        bail!("nothing to run: give --prompt, --chat or --tokens");
    }
    let path = fetch::resolve(&args.model)?;
    let model = load_model(&path)?;
    let seqs = sequences(args, &model)?;
    let cfg = &model.weights.config;
    for s in &seqs {
        let end = s.tokens.len().saturating_add(args.gen.saturating_sub(1));
        if end > cfg.context_length {
            bail!(
                "{}: {} prompt tokens + {} generated exceed the context length {} of {}",
                s.label,
                s.tokens.len(),
                args.gen,
                cfg.context_length,
                path.display()
            );
        }
        if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            bail!(
                "{}: token id {id} is outside the vocabulary (size {})",
                s.label,
                cfg.vocab_size
            );
        }
    }
    Ok((model, seqs))
}

/// The sequences of the command line, tokenized: prompts, then chat turns,
/// then token lists.
fn sequences(args: &Args, model: &LoadedModel) -> anyhow::Result<Vec<Sequence>> {
    let tok = || {
        model.tokenizer.as_ref().with_context(|| {
            format!(
                "{}: carries no tokenizer; give --tokens",
                model.source.path.display()
            )
        })
    };
    let mut seqs = Vec::new();
    for p in &args.prompt {
        if p.is_empty() {
            bail!("--prompt: empty prompt");
        }
        seqs.push(Sequence {
            label: format!("--prompt {:?}", clip(p)),
            tokens: tok()?.encode(p)?,
        });
    }
    for c in &args.chat {
        if c.is_empty() {
            bail!("--chat: empty prompt");
        }
        seqs.push(Sequence {
            label: format!("--chat {:?}", clip(c)),
            tokens: tok()?.encode_chat(c)?,
        });
    }
    for t in &args.tokens {
        let tokens = t
            .split(',')
            .filter(|_| !t.trim().is_empty())
            .enumerate()
            .map(|(i, s)| match s.trim() {
                "" => bail!("--tokens {t:?}: token {} is empty", i + 1),
                s => s
                    .parse::<u32>()
                    .with_context(|| format!("--tokens {t:?}: bad token id {s:?}")),
            })
            .collect::<anyhow::Result<Vec<u32>>>()?;
        seqs.push(Sequence {
            label: format!("--tokens {}", clip(t)),
            tokens,
        });
    }
    if let Some(s) = seqs.iter().find(|s| s.tokens.is_empty()) {
        bail!("{}: empty prompt", s.label);
    }
    Ok(seqs)
}

fn clip(s: &str) -> String {
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s.to_string()
    }
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

fn describe_switches(s: &Switches) -> String {
    let m = s.to_map();
    if m.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(" ({})", parts.join(", "))
    }
}

/// The commit of the working directory, when it is a git checkout (a bisect
/// runs each capture inside the commit's worktree).
fn git_rev() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}
