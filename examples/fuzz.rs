//! A bounded fuzz loop on stable Rust over the parsers that read what a
//! user hands taptree (the manifest, its index, the tap-file header, the
//! tolerance expression and the GGUF reader), and over whole trees that a
//! hostile writer edited and sealed again, run through the command line.
//!
//! ```text
//! cargo run --release --example fuzz -- TARGET [--seconds 60] [--seed 1] [--dir DIR] [--root DIR]
//! TARGET: manifest | index | tapfile | tolerance | gguf | tree
//! ```
//!
//! Seeds are read under `--root` (default: this repository):
//! `fixtures/golden/tiny-q-f32` and `target/fixtures/tiny-q.gguf`; the
//! `tree` target reads every golden tree and captures two more from the
//! fixture models (module [`tree`]).
//!
//! Each iteration takes a seed input (a golden tree's manifest or tap file,
//! valid tolerances, a fixture GGUF), applies one to four random mutations
//! (bit flips, interesting bytes and integers, inserts, deletions, copies,
//! truncations) and parses it. A panic is caught, counted and its input
//! saved in DIR; a single allocation over 1 GiB aborts the run, naming it
//! (the input is in DIR/input). A mutated manifest is sealed again (its
//! `manifest_blake3` redone) half the time, so that the parser behind the
//! seal check is reached. The `index` target mutates the binary index
//! (`manifest.idx`) of the golden manifest made format 2.3 (chunked
//! checksums) or 2.1 (whole-file checksums), each beside its manifest in a
//! tree of its own, and redoes its body hash and head seal half the time, so
//! that the record decoder is reached. Exit 1 if any panic was seen.
//!
//! The `tree` target is not a parser's: it edits the meaning of a seed
//! tree's manifest (positions, layers, slots, ranks and shards, stages,
//! shapes, dtypes, paths, the entries' number and order, the prompt, the
//! stage vocabulary), sometimes writes an edited tap's file again to match,
//! redoes every hash, and runs `taptree` (built beside this example:
//! `cargo build --release --bin taptree --bin taptree-full`) on it. A
//! panic, a signal, a hang, an exit code other than 0, 1 or 2, or
//! "identical" said of two roots that differ is a failure; the tree is
//! kept in DIR with its command line. Exit 1 if any failure was seen.

#[path = "fuzz/hostile.rs"]
mod hostile;
#[path = "fuzz/reseal.rs"]
mod reseal;
#[path = "fuzz/tap_files.rs"]
mod tap_files;
#[path = "fuzz/tree.rs"]
mod tree;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The largest single allocation allowed: anything above is a parser that
/// trusts a size it read.
const ALLOC_LIMIT: usize = 1 << 30;

struct Bounded;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only refuses sizes over the limit.
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            over_limit(layout.size());
        }
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, that is from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_LIMIT {
            over_limit(new_size);
        }
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Bounded = Bounded;

fn over_limit(size: usize) -> ! {
    // No allocation here: write the message with a fixed buffer.
    use std::io::Write;
    let mut buf = [0u8; 128];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    let _ = writeln!(cur, "fuzz: allocation of {size} bytes (over the limit)");
    let n = cur.position() as usize;
    let _ = std::io::stderr().write_all(&buf[..n]);
    std::process::abort()
}

#[derive(Clone, Copy, PartialEq)]
enum Target {
    Manifest,
    Index,
    TapFile,
    Tolerance,
    Gguf,
    Tree,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("fuzz: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let target = match args.next().as_deref() {
        Some("manifest") => Target::Manifest,
        Some("index") => Target::Index,
        Some("tapfile") => Target::TapFile,
        Some("tolerance") => Target::Tolerance,
        Some("gguf") => Target::Gguf,
        Some("tree") => Target::Tree,
        other => {
            return Err(format!(
                "{other:?}: expected a target: manifest, index, tapfile, tolerance, gguf or tree"
            ))
        }
    };
    let (mut seconds, mut seed, mut dir) = (60u64, 1u64, None);
    let mut root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seconds" => seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--seed" => seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--root" => root = PathBuf::from(value()?),
            _ => return Err(format!("unexpected argument {flag:?}")),
        }
    }
    let dir = match dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("taptree-fuzz-{}", std::process::id())),
    };
    if target == Target::Tree {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let failures = tree::run(seconds, seed, &dir, &root)?;
        if failures > 0 {
            eprintln!("fuzz: failing trees kept in {}", dir.display());
            std::process::exit(1);
        }
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let (trees, seeds) = seeds_of(target, &root, &dir)?;
    // Panics are caught and counted; the default hook would print each.
    std::panic::set_hook(Box::new(|_| {}));
    let input = dir.join("input");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut iterations, mut accepted, mut panics) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        let which = rng.usize(..seeds.len());
        let tree = &trees[which.min(trees.len() - 1)];
        let mut data = seeds[which].clone();
        for _ in 0..rng.usize(1..=4) {
            mutate(&mut rng, &mut data, target);
        }
        if target == Target::Manifest && rng.bool() {
            capture::manifest::seal(&mut data);
        }
        if target == Target::Index && rng.bool() {
            capture::index::reseal(&mut data);
        }
        // Where an abort leaves its input; the file targets read it here.
        let path = match target {
            Target::Manifest => tree.join("manifest.json"),
            Target::Index => tree.join(capture::index::INDEX_FILE),
            _ => input.clone(),
        };
        std::fs::write(&path, &data).map_err(|e| format!("{}: {e}", path.display()))?;
        let outcome = std::panic::catch_unwind(|| parse(target, &data, tree, &path));
        iterations += 1;
        match outcome {
            Ok(true) => accepted += 1,
            Ok(false) => {}
            Err(_) => {
                panics += 1;
                let saved = dir.join(format!("panic-{iterations}"));
                let _ = std::fs::write(&saved, &data);
                eprintln!("fuzz: panic; input saved in {}", saved.display());
            }
        }
    }
    println!(
        "fuzz {}: {iterations} inputs in {seconds} s (seed {seed}): {accepted} accepted, {} refused, {panics} panics; largest allocation {} bytes",
        ["manifest", "index", "tapfile", "tolerance", "gguf", "tree"][target as usize],
        iterations - accepted - panics,
        LARGEST.load(Ordering::Relaxed)
    );
    if panics > 0 {
        // The inputs that panicked are kept there.
        eprintln!("fuzz: inputs kept in {}", dir.display());
        std::process::exit(1);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Parses one input; true when it was accepted.
fn parse(target: Target, data: &[u8], tree: &Path, path: &Path) -> bool {
    match target {
        Target::Manifest | Target::Index => {
            // Trusted verify's path, then the full one.
            let _ = capture::TreeReader::head(tree).map_err(|e| e.to_string());
            match capture::TreeReader::open(tree) {
                Ok(t) => {
                    // What a reader does next: list, read one tap.
                    let _ = t.entries().first().map(|e| t.read(e).map(|v| v.to_f64()));
                    true
                }
                Err(e) => {
                    let _ = e.to_string();
                    false
                }
            }
        }
        Target::TapFile => match capture::tapfile::parse(data) {
            Ok(h) => {
                let _ = &data[h.data_start..h.data_start + h.data_len];
                true
            }
            Err(_) => false,
        },
        Target::Tolerance => match std::str::from_utf8(data).map(diff::Tolerance::parse) {
            Ok(Ok(t)) => {
                // Printed and parsed again, as a report and bisect do.
                let again = diff::Tolerance::parse(&t.to_string());
                assert!(again.is_ok(), "{t} does not parse again");
                true
            }
            _ => false,
        },
        Target::Gguf => match model::gguf::GgufFile::open(path) {
            Ok(g) => {
                for t in g.tensors() {
                    let _ = (t.shape(), t.numel());
                }
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        },
        Target::Tree => unreachable!("the tree target runs its own loop"),
    }
}

const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7f,
    0xff,
    0x8000,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

fn mutate(rng: &mut fastrand::Rng, data: &mut Vec<u8>, target: Target) {
    if data.is_empty() {
        data.push(rng.u8(..));
        return;
    }
    // Parsers read their headers: most mutations land in the first 4 KiB.
    let span = if target == Target::Gguf || target == Target::TapFile {
        data.len().min(4096)
    } else {
        data.len()
    };
    let at = rng.usize(..span);
    match rng.u8(..8) {
        0 => data[at] ^= 1 << rng.u8(..8),
        1 => {
            data[at] = [0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'}', b'[', b']', b','][rng.usize(..10)]
        }
        2 => {
            let v = INTERESTING[rng.usize(..INTERESTING.len())].to_le_bytes();
            let n = [1usize, 2, 4, 8][rng.usize(..4)].min(data.len() - at);
            data[at..at + n].copy_from_slice(&v[..n]);
        }
        3 => {
            let n = rng.usize(1..16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            data.splice(at..at, bytes);
        }
        4 => {
            let end = (at + rng.usize(1..64)).min(data.len());
            data.drain(at..end);
        }
        5 => {
            let end = (at + rng.usize(1..64)).min(data.len());
            let copy = data[at..end].to_vec();
            let to = rng.usize(..data.len());
            data.splice(to..to, copy);
        }
        6 => data.truncate(rng.usize(..data.len())),
        _ => {
            // Digits become other numbers: counts, shapes, offsets, positions.
            if let Some(d) = data[at..].iter().position(u8::is_ascii_digit) {
                let digits: Vec<u8> = INTERESTING[rng.usize(..INTERESTING.len())]
                    .to_string()
                    .into_bytes();
                data.splice(at + d..at + d + 1, digits);
            }
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    for item in walkdir::WalkDir::new(from) {
        let item = item.map_err(|e| e.to_string())?;
        let rel = item.path().strip_prefix(from).expect("under the root");
        let dest = to.join(rel);
        if item.file_type().is_dir() {
            std::fs::create_dir_all(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        } else {
            std::fs::copy(item.path(), &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        }
    }
    Ok(())
}

/// The golden tree's manifest made format `version` (written into `tree`)
/// and the bytes of its index: a seed of the `index` target.
fn index_seed(golden: &Path, tree: &Path, version: &str) -> Result<Vec<u8>, String> {
    let text = String::from_utf8(read(&golden.join("manifest.json"))?)
        .map_err(|e| format!("golden manifest: {e}"))?;
    let mut json = text
        .replacen(
            "\"format_version\":\"2.0\"",
            &format!("\"format_version\":\"{version}\""),
            1,
        )
        .into_bytes();
    capture::manifest::seal(&mut json);
    let m: capture::Manifest =
        serde_json::from_slice(&json).map_err(|e| format!("golden manifest: {e}"))?;
    if m.format_version != version {
        return Err("the golden manifest is not format 2.0".into());
    }
    let index = capture::index::build(&json, &m)?;
    let path = tree.join("manifest.json");
    std::fs::write(&path, &json).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::write(tree.join(capture::index::INDEX_FILE), &index)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // The seed must be accepted, or the target fuzzes nothing.
    capture::TreeReader::open(tree).map_err(|e| format!("seed tree: {e}"))?;
    Ok(index)
}

/// The inputs a target's mutations start from, and the tree each is read
/// in (an index is read beside the manifest of its own version, so the
/// index target has a tree per seed).
fn seeds_of(
    target: Target,
    root: &Path,
    dir: &Path,
) -> Result<(Vec<PathBuf>, Vec<Vec<u8>>), String> {
    let golden = root.join("fixtures/golden/tiny-q-f32");
    let tree = dir.join("tree");
    std::fs::create_dir_all(&tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    let mut trees = vec![tree.clone()];
    let seeds: Vec<Vec<u8>> = match target {
        Target::Manifest => {
            copy_tree(&golden, &tree)?;
            vec![read(&golden.join("manifest.json"))?]
        }
        Target::Index => {
            trees.push(dir.join("tree-2.1"));
            let mut seeds = Vec::new();
            for (t, version) in trees.iter().zip(["2.3", "2.1"]) {
                copy_tree(&golden, t)?;
                seeds.push(index_seed(&golden, t, version)?);
            }
            seeds
        }
        Target::TapFile => [
            "L000/attn_norm.p0-5.safetensors",
            "global/logits.p6-7.safetensors",
        ]
        .iter()
        .map(|p| read(&golden.join(p)))
        .collect::<Result<_, _>>()?,
        Target::Tolerance => [
            diff::tolerance::DEFAULT,
            "cos>=0.999",
            "ulp<=4",
            "abs<=1e-3|rel<=1e-2",
            "(cos>=0.99 & abs<1e-2) | bitwise",
            "sqnr>=40 & nmse<=1e-4 & eq>=0.5 & argmax==1",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        Target::Gguf => vec![
            read(&root.join("target/fixtures/tiny-q.gguf")).map_err(|e| {
                format!("{e} (write it: cargo run --release -p fixtures --bin generate -- models)")
            })?,
        ],
        Target::Tree => return Err("the tree target runs its own loop".into()),
    };
    Ok((trees, seeds))
}
