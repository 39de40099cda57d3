//! The manifest (`manifest.json`): what a complete tree holds, and the hashes
//! that make two trees comparable without reading their tensors.
//!
//! The per-directory hash covers, in capture order, one line per tap of that
//! directory: `stage \t layer \t pos_start \t pos_end \t slot \t dtype \t shape \t blake3 \n`
//! (`-` for an absent layer or slot, shape as comma-separated dimensions).
//! The root hash covers `dir \t dir_hash \n` for every directory in byte
//! order of its name. Nothing else — no time, host, path or run metadata —
//! enters either hash, so equal roots mean bitwise-equal tensors under equal
//! keys. docs/FORMAT.md is the normative description.

use crate::dtype::DType;
use crate::key::Key;
use crate::stage::StageSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The format version this crate writes, `major.minor`. A reader refuses a
/// different major version; a newer minor only adds fields it may ignore.
pub const FORMAT_VERSION: &str = "1.0";
/// The major version this crate reads.
pub const FORMAT_MAJOR: u32 = 1;
/// The manifest's file name at the root of a tree.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Marker written when a capture starts: a directory holding it is a tree
/// (complete only once the manifest exists).
pub const MARKER_FILE: &str = ".taptree";
/// The directory of the taps without a layer.
pub const GLOBAL_DIR: &str = "global";

/// Where and how a run was made. None of it enters a hash: it is there for
/// people, for `diff` headers and for `bisect`. Empty `host`, `argv` and
/// `time` are filled in by [`crate::Capture::start`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunInfo {
    pub model: String,
    pub model_blake3: Option<String>,
    pub backend: String,
    pub precision: String,
    pub switches: BTreeMap<String, String>,
    pub prompt_tokens: Vec<u32>,
    pub git_rev: Option<String>,
    pub host: String,
    pub argv: Vec<String>,
    /// UTC, RFC 3339.
    pub time: String,
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One tap of the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub key: Key,
    /// Relative to the tree root, `/`-separated: `L003/ffn_down.p0-7.safetensors`.
    pub path: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// blake3 of the tensor bytes (not of the file), lowercase hex.
    pub blake3: String,
    /// Tensor bytes: element count × dtype size.
    pub bytes: u64,
}

/// The whole manifest, as written at the end of a capture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"taptree"`.
    pub format: String,
    /// `major.minor`.
    pub format_version: String,
    pub root: String,
    pub run: RunInfo,
    /// The selection the capture used (`all` for everything).
    #[serde(default)]
    pub selection: String,
    /// The stage vocabulary in forward order, with each stage's inputs.
    pub stages: Vec<StageSpec>,
    /// Per-directory hash, by directory name.
    pub dirs: BTreeMap<String, String>,
    /// One per tap, in capture order (= forward order).
    #[serde(deserialize_with = "entries")]
    pub entries: Vec<Entry>,
}

thread_local! {
    /// How many entries the manifest being parsed on this thread holds, by
    /// its head: see [`with_entries_hint`].
    static ENTRIES_HINT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `parse` with the entries read into a vector of capacity `n` rather
/// than one grown by doubling: on a manifest of many thousand entries each
/// growth faults in and fills fresh pages, which costs more than the parse
/// of the entries it holds. `n` is a hint (from the manifest's own head),
/// so the caller bounds it by the manifest's size.
pub(crate) fn with_entries_hint<T>(n: usize, parse: impl FnOnce() -> T) -> T {
    ENTRIES_HINT.with(|h| h.set(n));
    let out = parse();
    ENTRIES_HINT.with(|h| h.set(0));
    out
}

fn entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Entry>, D::Error> {
    struct Entries;
    impl<'de> serde::de::Visitor<'de> for Entries {
        type Value = Vec<Entry>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of entries")
        }

        fn visit_seq<S: serde::de::SeqAccess<'de>>(
            self,
            mut seq: S,
        ) -> Result<Vec<Entry>, S::Error> {
            let mut out = Vec::with_capacity(ENTRIES_HINT.with(|h| h.get()));
            while let Some(e) = seq.next_element()? {
                out.push(e);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Entries)
}

/// The manifest as written: the head (`format`, `format_version`, `root`,
/// `taps`, `bytes`) first, so that `TreeReader::head` finds it in the
/// first few hundred bytes without parsing the entries.
#[derive(Serialize)]
pub(crate) struct ManifestOut<'a> {
    pub format: &'a str,
    pub format_version: &'a str,
    pub root: &'a str,
    pub taps: u64,
    pub bytes: u64,
    pub run: &'a RunInfo,
    pub selection: &'a str,
    pub stages: &'a [StageSpec],
    pub dirs: &'a BTreeMap<String, String>,
    pub entries: &'a [Entry],
}

impl<'a> ManifestOut<'a> {
    pub fn new(m: &'a Manifest) -> ManifestOut<'a> {
        ManifestOut {
            format: &m.format,
            format_version: &m.format_version,
            root: &m.root,
            taps: m.entries.len() as u64,
            bytes: m.bytes_of_entries(),
            run: &m.run,
            selection: &m.selection,
            stages: &m.stages,
            dirs: &m.dirs,
            entries: &m.entries,
        }
    }
}

impl Manifest {
    /// Total tensor bytes of the entries.
    pub fn bytes_of_entries(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }
}

/// The directory a key's file lives in: `L007` (per layer) or `global`.
pub fn dir_of(key: &Key) -> String {
    dir_of_layer(key.layer)
}

fn dir_of_layer(layer: Option<u32>) -> String {
    match layer {
        Some(layer) => format!("L{layer:03}"),
        None => GLOBAL_DIR.to_string(),
    }
}

/// The relative path a writer gives a key's file.
pub fn path_of(key: &Key) -> String {
    let mut p = format!(
        "{}/{}.p{}-{}",
        dir_of(key),
        key.stage,
        key.pos.start,
        key.pos.end
    );
    if let Some(slot) = key.slot {
        let _ = write!(p, ".s{slot}");
    }
    p.push_str(".safetensors");
    p
}

/// Whether `stage` may be used as a stage name: it becomes part of a file
/// name and of the hashed line, so it must not hold separators.
pub fn valid_stage_name(stage: &str) -> bool {
    !stage.is_empty()
        && !stage.starts_with('.')
        && stage.len() <= 128
        && stage
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.')
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
    out.push('\n');
}

fn push_decimal(out: &mut String, mut v: u64) {
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

/// Per-directory hashes and the root hash of `entries` (in capture order).
pub fn tree_hashes(entries: &[Entry]) -> (BTreeMap<String, String>, String) {
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
    // Found without building each entry's directory name: consecutive
    // entries mostly share a layer, so the last one is tried first.
    let mut dirs: Vec<Dir> = Vec::new();
    let mut slot_of: std::collections::HashMap<Option<u32>, usize> = Default::default();
    let mut last: Option<(Option<u32>, usize)> = None;
    for e in entries {
        let layer = e.key.layer;
        let i = match last {
            Some((l, i)) if l == layer => i,
            _ => *slot_of.entry(layer).or_insert_with(|| {
                let mut pending = String::with_capacity(BATCH + 256);
                pending.push_str("taptree dir v1\n");
                dirs.push(Dir {
                    layer,
                    hasher: blake3::Hasher::new(),
                    pending,
                });
                dirs.len() - 1
            }),
        };
        last = Some((layer, i));
        let d = &mut dirs[i];
        hash_line(&mut d.pending, &e.key, e.dtype, &e.shape, &e.blake3);
        if d.pending.len() >= BATCH {
            // Whole chunks only, so that the next update starts on a chunk.
            let whole = d.pending.len() / CHUNK * CHUNK;
            d.hasher.update(&d.pending.as_bytes()[..whole]);
            d.pending.drain(..whole);
        }
    }
    let dirs: BTreeMap<String, String> = dirs
        .into_iter()
        .map(|mut d| {
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

/// Splits `"1.3"` into (1, 3).
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(stage: &str, layer: Option<u32>, hash: &str) -> Entry {
        let key = Key::new(stage, layer, 0..2);
        Entry {
            path: path_of(&key),
            key,
            dtype: DType::F32,
            shape: vec![2, 3],
            blake3: hash.to_string(),
            bytes: 24,
        }
    }

    #[test]
    fn paths() {
        assert_eq!(
            path_of(&Key::new("ffn_down", Some(3), 0..7)),
            "L003/ffn_down.p0-7.safetensors"
        );
        assert_eq!(
            path_of(&Key::new("logits", None, 5..6).with_slot(Some(2))),
            "global/logits.p5-6.s2.safetensors"
        );
        assert_eq!(dir_of(&Key::new("x", Some(1234), 0..1)), "L1234");
    }

    #[test]
    fn stage_names() {
        assert!(valid_stage_name("post_ffn_residual"));
        assert!(valid_stage_name("my-stage.v2"));
        for bad in ["", "a/b", "..", ".hidden", "a b", "a\tb", "ü"] {
            assert!(!valid_stage_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn hashes_see_only_tensor_identity() {
        let a = vec![
            entry("attn_norm", Some(0), "aa"),
            entry("logits", None, "bb"),
        ];
        let (dirs, root) = tree_hashes(&a);
        assert_eq!(dirs.len(), 2);
        // Same content, other run metadata: same root (the run never enters).
        assert_eq!(tree_hashes(&a.clone()).1, root);
        // A changed tensor changes its directory's hash and the root, not the other directory.
        let mut b = a.clone();
        b[1].blake3 = "cc".into();
        let (dirs_b, root_b) = tree_hashes(&b);
        assert_ne!(root_b, root);
        assert_eq!(dirs_b["L000"], dirs["L000"]);
        assert_ne!(dirs_b["global"], dirs["global"]);
        // Shape and dtype are part of the identity too.
        let mut c = a.clone();
        c[0].shape = vec![3, 2];
        assert_ne!(tree_hashes(&c).1, root);
        let mut d = a.clone();
        d[0].dtype = DType::I32;
        assert_ne!(tree_hashes(&d).1, root);
        let mut e = a.clone();
        e[0].key.slot = Some(0);
        assert_ne!(tree_hashes(&e).1, root);
    }

    #[test]
    fn directory_hashes_of_many_entries_equal_the_hash_of_the_whole_text() {
        // Directories far larger than one hashing batch, their entries
        // interleaved as a decode loop writes them.
        let mut entries = Vec::new();
        for p in 0..1000u32 {
            for layer in [Some(0), Some(1), None] {
                let key = Key::new("ffn_down", layer, p..p + 1);
                entries.push(Entry {
                    path: path_of(&key),
                    key,
                    dtype: DType::F32,
                    shape: vec![1, 576],
                    blake3: format!("{:064x}", p as u64 * 7 + layer.map_or(9, u64::from)),
                    bytes: 576 * 4,
                });
            }
        }
        let (dirs, _) = tree_hashes(&entries);
        for layer in [Some(0), Some(1), None] {
            let mut text = String::from("taptree dir v1\n");
            for e in entries.iter().filter(|e| e.key.layer == layer) {
                hash_line(&mut text, &e.key, e.dtype, &e.shape, &e.blake3);
            }
            assert!(text.len() > 3 * 16 * 1024);
            let want = blake3::hash(text.as_bytes()).to_hex().to_string();
            assert_eq!(dirs[&dir_of_layer(layer)], want);
        }
    }

    #[test]
    fn golden_root() {
        // The hash definition is part of the format: a change here is a
        // format change (bump the major version in FORMAT_VERSION and FORMAT.md).
        let a = vec![
            entry("attn_norm", Some(0), "aa"),
            entry("logits", None, "bb"),
        ];
        let mut text = String::new();
        hash_line(&mut text, &a[0].key, a[0].dtype, &a[0].shape, &a[0].blake3);
        assert_eq!(text, "attn_norm\t0\t0\t2\t-\tF32\t2,3\taa\n");
        let dir = blake3::hash(format!("taptree dir v1\n{text}").as_bytes()).to_hex();
        assert_eq!(tree_hashes(&a).0["L000"], dir.as_str());
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("1.0"), Some((1, 0)));
        assert_eq!(parse_version("12.34"), Some((12, 34)));
        assert_eq!(parse_version("1"), None);
        assert_eq!(parse_version("x.y"), None);
    }
}
