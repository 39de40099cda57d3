//! The hashes of a tree (format 2; format 1 still read): one line per tap
//! per directory, the directories and what steers a verdict into the root,
//! and the manifest's seal over its own bytes. The module doc of
//! [`crate::manifest`] and docs/FORMAT.md say what each covers.

use crate::dtype::DType;
use crate::key::Key;
use crate::manifest::{dir_of_layer, Entry, RunInfo};
use crate::stage::StageSpec;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Everything in a manifest besides its entries that steers a verdict, and
/// so enters the root: which taps were selected, how the run was made
/// (precision, prompt tokens, switches), and the stage graph that decides
/// an origin from an inherited divergence.
#[derive(Debug, Clone, Copy)]
pub struct VerdictInputs<'a> {
    /// The selection's canonical string (`all` for everything).
    pub selection: &'a str,
    /// How the run was made; only its `precision`, `switches` and
    /// `prompt_tokens` are hashed.
    pub run: &'a RunInfo,
    /// The stage vocabulary in forward order, with each stage's inputs.
    pub stages: &'a [StageSpec],
}

/// The `manifest_blake3` a writer puts down before sealing.
pub const UNSEALED: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Where the 64 hex digits of the manifest's `manifest_blake3` lie in
/// `json`: after the first `"manifest_blake3"` key, its colon and quote.
pub(crate) fn seal_digits(json: &[u8]) -> Option<std::ops::Range<usize>> {
    const KEY: &[u8] = b"\"manifest_blake3\"";
    let mut i = memchr::memmem::find(json, KEY)? + KEY.len();
    let skip_blank = |i: &mut usize| {
        while json.get(*i).is_some_and(|c| c.is_ascii_whitespace()) {
            *i += 1;
        }
    };
    skip_blank(&mut i);
    (json.get(i) == Some(&b':')).then_some(())?;
    i += 1;
    skip_blank(&mut i);
    (json.get(i) == Some(&b'"')).then_some(())?;
    i += 1;
    let digits = i..i + UNSEALED.len();
    (json.get(digits.end) == Some(&b'"')).then_some(())?;
    Some(digits)
}

/// The blake3 of `json` with its `manifest_blake3` digits read as zeros,
/// or `None` when it has no such field.
pub fn seal_of(json: &[u8]) -> Option<String> {
    let digits = seal_digits(json)?;
    let mut h = blake3::Hasher::new();
    h.update(&json[..digits.start]);
    h.update(UNSEALED.as_bytes());
    h.update(&json[digits.end..]);
    Some(h.finalize().to_hex().to_string())
}

/// Fills in the `manifest_blake3` of a manifest's bytes (written with any
/// 64 characters there, normally [`UNSEALED`]). Returns false when `json`
/// has no such field.
pub fn seal(json: &mut [u8]) -> bool {
    let (Some(digits), Some(hash)) = (seal_digits(json), seal_of(json)) else {
        return false;
    };
    json[digits].copy_from_slice(hash.as_bytes());
    true
}

/// Whether `json`'s `manifest_blake3` is its own blake3: `Err` names what
/// is wrong (no field, or the hash it has).
pub fn check_seal(json: &[u8]) -> Result<(), String> {
    let digits = seal_digits(json).ok_or("no manifest_blake3 field (format 2 requires one)")?;
    let stored = &json[digits];
    let actual = seal_of(json).expect("the field was found");
    if stored != actual.as_bytes() {
        return Err(format!(
            "its bytes hash to {actual}, its manifest_blake3 says {}: the manifest was edited or damaged",
            String::from_utf8_lossy(stored)
        ));
    }
    Ok(())
}

/// The line an entry contributes to its directory's hash.
pub fn hash_line(out: &mut String, key: &Key, dtype: DType, shape: &[usize], blake3: &str) {
    // Written piece by piece, not through `write!`: opening a tree hashes
    // every entry, and formatting was most of that.
    let opt = |out: &mut String, v: Option<u32>| match v {
        Some(v) => push_decimal(out, v as u64),
        None => out.push('-'),
    };
    out.push_str(&key.stage);
    out.push('\t');
    opt(out, key.layer);
    out.push('\t');
    push_decimal(out, key.pos.start as u64);
    out.push('\t');
    push_decimal(out, key.pos.end as u64);
    out.push('\t');
    opt(out, key.slot);
    out.push('\t');
    out.push_str(dtype.name());
    out.push('\t');
    for (i, &d) in shape.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_decimal(out, d as u64);
    }
    out.push('\t');
    out.push_str(blake3);
    // Format 2.2: only a ranked tap's line grows, so trees without ranks
    // keep their hashes.
    if let Some(rank) = key.rank {
        out.push_str("\trank ");
        push_decimal(out, rank as u64);
    }
    if let Some(shard) = key.shard {
        use std::fmt::Write as _;
        let _ = write!(out, "\tshard {shard}");
    }
    out.push('\n');
}

pub(crate) fn push_decimal(out: &mut String, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[i..]).expect("ASCII digits"));
}

/// Per-directory hashes and the root hash (format 2) of `entries`, in any
/// order, and of what else steers a verdict.
pub fn tree_hashes(
    entries: &[Entry],
    inputs: &VerdictInputs,
) -> (BTreeMap<String, String>, String) {
    use rayon::prelude::*;
    // Each directory's entries, then (a directory per core) its lines in
    // one buffer, sorted in byte order and hashed.
    let dirs = by_layer(entries, |_| Vec::new(), |d: &mut Vec<&Entry>, e| d.push(e));
    let dirs: BTreeMap<String, String> = dirs
        .into_par_iter()
        .map(|(layer, d)| {
            let mut text = String::with_capacity(d.len() * 128);
            let mut lines: Vec<std::ops::Range<usize>> = Vec::with_capacity(d.len());
            for e in d {
                let start = text.len();
                hash_line(&mut text, &e.key, e.dtype, &e.shape, &e.blake3);
                lines.push(start..text.len());
            }
            let text = text.as_bytes();
            lines.sort_unstable_by(|a, b| text[a.clone()].cmp(&text[b.clone()]));
            let mut hasher = blake3::Hasher::new();
            hasher.update(b"taptree dir v2\n");
            // Hashed a batch of lines at a time: each update still hashes
            // many blake3 chunks at once.
            let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
            for line in lines {
                batch.extend_from_slice(&text[line]);
                if batch.len() >= 60 * 1024 {
                    hasher.update(&batch);
                    batch.clear();
                }
            }
            hasher.update(&batch);
            (dir_of_layer(layer), hasher.finalize().to_hex().to_string())
        })
        .collect();
    let root = root_hash(&dirs, inputs);
    (dirs, root)
}

/// The root hash (format 2) over directory hashes and what else steers a
/// verdict. Strings are written `{byte length}:{text}`, so no value can
/// forge a separator.
pub fn root_hash(dirs: &BTreeMap<String, String>, inputs: &VerdictInputs) -> String {
    fn text(out: &mut String, s: &str) {
        let _ = write!(out, "{}:{s}", s.len());
    }
    fn list(out: &mut String, items: &[String]) {
        for (i, s) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            text(out, s);
        }
    }
    let mut root = String::from("taptree root v2\n");
    for (dir, hash) in dirs {
        let _ = writeln!(root, "{dir}\t{hash}");
    }
    root.push_str("selection\t");
    text(&mut root, inputs.selection);
    root.push_str("\nprecision\t");
    text(&mut root, &inputs.run.precision);
    root.push_str("\ntokens\t");
    for (i, t) in inputs.run.prompt_tokens.iter().enumerate() {
        if i > 0 {
            root.push(',');
        }
        push_decimal(&mut root, u64::from(*t));
    }
    root.push('\n');
    for (name, value) in &inputs.run.switches {
        root.push_str("switch\t");
        text(&mut root, name);
        root.push('\t');
        text(&mut root, value);
        root.push('\n');
    }
    for s in inputs.stages {
        root.push_str("stage\t");
        text(&mut root, &s.name);
        root.push_str(match s.scope {
            crate::stage::Scope::Global => "\tglobal\t",
            crate::stage::Scope::Layer => "\tlayer\t",
        });
        list(&mut root, &s.inputs);
        root.push('\t');
        list(&mut root, &s.first_layer_inputs);
        root.push('\n');
    }
    blake3::hash(root.as_bytes()).to_hex().to_string()
}

/// Format 1's per-directory hashes and root hash of `entries`: lines in
/// capture order, and nothing but the entries in the root.
pub fn tree_hashes_v1(entries: &[Entry]) -> (BTreeMap<String, String>, String) {
    /// A directory's hash under way. Its lines are hashed a batch of whole
    /// blake3 chunks at a time: each update still hashes many chunks at
    /// once, and no directory's text (megabytes on a large tree, all fresh
    /// pages) is ever held whole.
    struct Dir {
        layer: Option<u32>,
        hasher: blake3::Hasher,
        pending: String,
    }
    const CHUNK: usize = 1024;
    const BATCH: usize = 16 * CHUNK;
    let dirs = by_layer(
        entries,
        |layer| {
            let mut pending = String::with_capacity(BATCH + 256);
            pending.push_str("taptree dir v1\n");
            Dir {
                layer,
                hasher: blake3::Hasher::new(),
                pending,
            }
        },
        |d, e| {
            hash_line(&mut d.pending, &e.key, e.dtype, &e.shape, &e.blake3);
            if d.pending.len() >= BATCH {
                // Whole chunks only, so that the next update starts on a chunk.
                let whole = d.pending.len() / CHUNK * CHUNK;
                d.hasher.update(&d.pending.as_bytes()[..whole]);
                d.pending.drain(..whole);
            }
        },
    );
    let dirs: BTreeMap<String, String> = dirs
        .into_iter()
        .map(|(_, mut d)| {
            d.hasher.update(d.pending.as_bytes());
            (
                dir_of_layer(d.layer),
                d.hasher.finalize().to_hex().to_string(),
            )
        })
        .collect();
    let mut root = String::from("taptree root v1\n");
    for (dir, hash) in &dirs {
        let _ = writeln!(root, "{dir}\t{hash}");
    }
    (dirs, blake3::hash(root.as_bytes()).to_hex().to_string())
}

/// Entries grouped by directory (layer), in the order each layer first
/// appears, each group built by `add` on what `new` made for its layer.
/// Found without building each entry's directory name: consecutive entries
/// mostly share a layer, so the last one is tried first.
fn by_layer<'e, D>(
    entries: &'e [Entry],
    mut new: impl FnMut(Option<u32>) -> D,
    mut add: impl FnMut(&mut D, &'e Entry),
) -> Vec<(Option<u32>, D)> {
    let mut dirs: Vec<(Option<u32>, D)> = Vec::new();
    let mut slot_of: std::collections::HashMap<Option<u32>, usize> = Default::default();
    let mut last: Option<(Option<u32>, usize)> = None;
    for e in entries {
        let layer = e.key.layer;
        let i = match last {
            Some((l, i)) if l == layer => i,
            _ => *slot_of.entry(layer).or_insert_with(|| {
                dirs.push((layer, new(layer)));
                dirs.len() - 1
            }),
        };
        last = Some((layer, i));
        add(&mut dirs[i].1, e);
    }
    dirs
}
