//! `taptree capture --engine hf|llama.cpp`: a foreign engine's forward,
//! captured by the Python package (`python3 -m taptree capture`).
//!
//! The Rust side does what must be the same for every engine: it resolves
//! `--model` (fetch, sha256 check), tokenizes the prompt with taptree's own
//! tokenizer so every engine sees the same ids, checks the flags, and passes
//! the run record. The engine's adapter (python/taptree/hf.py, ...) runs the
//! forward and writes the tree. Any failure of the Python side is exit 2:
//! a tool that could not capture is never a verdict on the model.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// `--engine`: whose forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// taptree's own forward.
    Builtin,
    /// Hugging Face transformers.
    Hf,
    /// llama.cpp (llama-cpp-python).
    #[value(name = "llama.cpp")]
    LlamaCpp,
}

impl Engine {
    /// The name the Python package's `--engine` takes.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Builtin => "builtin",
            Engine::Hf => "hf",
            Engine::LlamaCpp => "llama.cpp",
        }
    }
}

/// Compute dtypes a foreign engine may be asked for.
pub const PRECISIONS: &[&str] = &["f32", "f64", "bf16", "f16"];

/// The Python interpreter: `$TAPTREE_PYTHON`, else `python3`.
fn python() -> OsString {
    std::env::var_os("TAPTREE_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// The package directory of this checkout, when the binary was built from
/// one: it goes first on `PYTHONPATH`, so the Python side always matches
/// this binary's contract even where an older `pip install ./python` is
/// installed.
fn repo_package() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    dir.join("taptree")
        .join("__main__.py")
        .is_file()
        .then_some(dir)
}

/// What a foreign engine is asked to capture.
pub struct EngineRun<'a> {
    pub engine: &'a str,
    pub model_file: &'a Path,
    pub tokens: &'a [u32],
    pub out: &'a Path,
    pub gen: usize,
    /// Token ids that end a greedy answer (the tokenizer's end ids).
    pub stop: &'a [u32],
    pub select: Option<&'a str>,
    pub force: bool,
    pub precision: &'a str,
    pub threads: Option<usize>,
    /// Merged into the manifest's run record (model, its blake3, argv, ...).
    pub run: serde_json::Value,
}

impl EngineRun<'_> {
    /// The `python3 -m taptree capture ...` arguments.
    pub fn args(&self) -> Vec<OsString> {
        let ids: Vec<String> = self.tokens.iter().map(u32::to_string).collect();
        let mut a: Vec<OsString> = vec![
            "-m".into(),
            "taptree".into(),
            "capture".into(),
            "--engine".into(),
            self.engine.into(),
            "--model-file".into(),
            self.model_file.into(),
            "--tokens".into(),
            ids.join(",").into(),
            "--out".into(),
            self.out.into(),
            "--gen".into(),
            self.gen.to_string().into(),
            "--precision".into(),
            self.precision.into(),
            "--run".into(),
            self.run.to_string().into(),
        ];
        if !self.stop.is_empty() {
            let stop: Vec<String> = self.stop.iter().map(u32::to_string).collect();
            a.extend(["--stop".into(), stop.join(",").into()]);
        }
        if let Some(s) = self.select {
            a.extend(["--select".into(), s.into()]);
        }
        if self.force {
            a.push("--force".into());
        }
        if let Some(n) = self.threads {
            a.extend(["--threads".into(), n.to_string().into()]);
        }
        a
    }
}

/// Runs the engine; its output goes straight to the user. Exit 2 on any
/// failure (the Python side has printed why).
pub fn run(req: &EngineRun) -> anyhow::Result<()> {
    if !PRECISIONS.contains(&req.precision) {
        bail!(
            "--precision: bad value {:?} for --engine {}: expected {}",
            req.precision,
            req.engine,
            PRECISIONS.join(", ")
        );
    }
    let py = python();
    let mut path = std::env::split_paths(&std::env::var_os("PYTHONPATH").unwrap_or_default())
        .filter(|p| !p.as_os_str().is_empty())
        .collect::<Vec<_>>();
    if let Some(dir) = repo_package() {
        path.insert(0, dir);
    }
    let pythonpath = std::env::join_paths(&path).context("PYTHONPATH")?;
    let probe = Command::new(&py)
        .args(["-c", "import taptree.__main__"])
        .env("PYTHONPATH", &pythonpath)
        .output();
    match probe {
        Err(e) => bail!(
            "--engine {}: cannot run {}: {e} (set TAPTREE_PYTHON to a Python 3 interpreter)",
            req.engine,
            py.to_string_lossy()
        ),
        Ok(o) if !o.status.success() => bail!(
            "--engine {}: the taptree Python package is not importable by {} \
             (pip install ./python from taptree's repository): {}",
            req.engine,
            py.to_string_lossy(),
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("")
        ),
        Ok(_) => {}
    }
    let status = Command::new(&py)
        .args(req.args())
        .env("PYTHONPATH", &pythonpath)
        .status()
        .with_context(|| {
            format!(
                "--engine {}: cannot run {}",
                req.engine,
                py.to_string_lossy()
            )
        })?;
    if !status.success() {
        bail!(
            "--engine {}: the engine's capture failed ({} -m taptree capture exited with {}); {} holds no tree from this run",
            req.engine,
            py.to_string_lossy(),
            status
                .code()
                .map_or_else(|| "a signal".to_string(), |c| c.to_string()),
            req.out.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn engine_words_are_what_the_python_package_takes() {
        let words: Vec<String> = Engine::value_variants()
            .iter()
            .map(|&e| e.to_possible_value().unwrap().get_name().to_string())
            .collect();
        assert_eq!(words, ["builtin", "hf", "llama.cpp"]);
        for &e in Engine::value_variants() {
            assert_eq!(
                e.to_possible_value().unwrap().get_name().to_string(),
                e.name()
            );
        }
    }
}
