//! The manifest (`manifest.json`): what a complete tree holds (its entries,
//! how the run was made, the stage vocabulary), where each tap's file lies,
//! the format's version and bounds, and the manifest's seal: its own blake3
//! (`manifest_blake3`) over its bytes, so a damaged manifest is refused even
//! where nothing else would notice. The hashes that make two trees
//! comparable without reading their tensors are [`crate::hashes`]'s.
//! docs/FORMAT.md is the normative description.

use crate::dtype::DType;
use crate::key::Key;
use crate::stage::StageSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The format version this crate writes, `major.minor`, and the newest it
/// reads: a reader refuses a major version it does not know, and a newer
/// minor of its own major (docs/FORMAT.md, "Versioning").
pub const FORMAT_VERSION: &str = "2.3";
/// The version written instead of [`FORMAT_VERSION`] by a tree (and in the
/// tap files) holding ranked taps (tensor parallel: `rank` and `shard` in
/// the key). Trees without ranks write 2.3 (2.1 until its index checksums
/// became chunked).
pub const FORMAT_VERSION_RANKED: &str = "2.2";
/// The major version this crate writes, and the newest it reads.
pub const FORMAT_MAJOR: u32 = 2;
/// The oldest major version this crate reads (format 1: hashes in capture
/// order, no header or manifest hashes).
pub const FORMAT_MAJOR_OLDEST: u32 = 1;
/// The manifest's file name at the root of a tree.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Marker written when a capture starts: a directory holding it is a tree
/// (complete only once the manifest exists).
pub const MARKER_FILE: &str = ".taptree";
/// The directory of the taps without a layer.
pub const GLOBAL_DIR: &str = "global";

/// Where and how a run was made. Only what steers a verdict enters the root
/// (`precision`, `switches`, `prompt_tokens`); the rest is there for people,
/// for `diff` headers and for `bisect`. Empty `host`, `argv` and `time` are
/// filled in by [`crate::Capture::start`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunInfo {
    /// The model file or directory the run loaded, as given.
    pub model: String,
    /// blake3 of the model (its file, or a directory's files), hex; `None` when
    /// the producer does not say.
    pub model_blake3: Option<String>,
    /// The forward that ran: `cpu`, `cuda`, or another engine's
    /// (`llama.cpp/cpu`, `hf/cuda`).
    pub backend: String,
    /// The arithmetic the forward ran in (`f32`, `q8`, ...); enters the root.
    pub precision: String,
    /// Numerical switches that change the forward's arithmetic, by name; enter the root.
    pub switches: BTreeMap<String, String>,
    /// The token ids of the prompt, in order; enter the root.
    pub prompt_tokens: Vec<u32>,
    /// `git rev-parse HEAD` of the producer, if it was run from a checkout.
    pub git_rev: Option<String>,
    /// The machine's host name.
    pub host: String,
    /// The producer's command line.
    pub argv: Vec<String>,
    /// UTC, RFC 3339.
    pub time: String,
    /// Free-form run details by name (e.g. `slots`, `generated_tokens`); not hashed.
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One tap of the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Which tap this is: stage, layer, positions, slot.
    pub key: Key,
    /// Relative to the tree root, `/`-separated: `L003/ffn_down.p0-7.safetensors`.
    pub path: String,
    /// The tensor's element type.
    pub dtype: DType,
    /// The tensor's shape; axis 0 is the positions.
    pub shape: Vec<usize>,
    /// blake3 of the tensor bytes (not of the file), lowercase hex.
    pub blake3: String,
    /// Tensor bytes: element count × dtype size.
    pub bytes: u64,
    /// blake3 of the file's bytes before the tensor data (length prefix,
    /// JSON header, padding), lowercase hex. Format 2; absent in format 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_blake3: Option<String>,
}

impl Entry {
    /// The directory its file lives in: `L007` (per layer) or `global`.
    pub fn dir(&self) -> String {
        dir_of(&self.key)
    }
}

/// The whole manifest, as written at the end of a capture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"taptree"`.
    pub format: String,
    /// `major.minor`.
    pub format_version: String,
    /// The root hash, lowercase hex: every entry's hash and everything that
    /// steers a verdict (see docs/FORMAT.md).
    pub root: String,
    /// blake3 of the manifest file with this value's 64 hex digits read as
    /// `0`s (see [`seal`]). Format 2; absent in format 1.
    #[serde(default)]
    pub manifest_blake3: Option<String>,
    /// How the run was made.
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
    /// Written as zeros, then filled in by [`seal`].
    pub manifest_blake3: &'static str,
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
            manifest_blake3: UNSEALED,
            run: &m.run,
            selection: &m.selection,
            stages: &m.stages,
            dirs: &m.dirs,
            entries: &m.entries,
        }
    }
}

impl Manifest {
    /// Total tensor bytes of the entries (saturating: an opened tree's
    /// total was checked not to overflow), summed on every core (a
    /// saturating sum is the same in any order).
    pub fn bytes_of_entries(&self) -> u64 {
        use rayon::prelude::*;
        self.entries
            .par_iter()
            .map(|e| e.bytes)
            .reduce(|| 0, u64::saturating_add)
    }
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

/// The directory a key's file lives in: `L007` (per layer) or `global`.
pub fn dir_of(key: &Key) -> String {
    dir_of_layer(key.layer)
}

/// The directory of a layer's taps: `L007`, or `global` for none.
pub fn dir_of_layer(layer: Option<u32>) -> String {
    let mut dir = String::with_capacity(8);
    push_dir_of_layer(&mut dir, layer);
    dir
}

/// Appends a layer's directory name: `L` and the layer, three digits at
/// least (`L007`, `L1234`), or `global`.
fn push_dir_of_layer(p: &mut String, layer: Option<u32>) {
    match layer {
        Some(layer) => {
            p.push('L');
            if layer < 100 {
                p.push('0');
            }
            if layer < 10 {
                p.push('0');
            }
            push_decimal(p, u64::from(layer));
        }
        None => p.push_str(GLOBAL_DIR),
    }
}

/// The relative path a writer gives a key's file.
pub fn path_of(key: &Key) -> String {
    // Written piece by piece, not through `format!`: decoding an index
    // builds the path of nearly every entry, and formatting was most of
    // that. The same text as `{dir}/{stage}.p{start}-{end}[.s{slot}][.r{rank}].safetensors`.
    let mut p = String::with_capacity(key.stage.len() + 40);
    push_dir_of_layer(&mut p, key.layer);
    p.push('/');
    p.push_str(&key.stage);
    p.push_str(".p");
    push_decimal(&mut p, u64::from(key.pos.start));
    p.push('-');
    push_decimal(&mut p, u64::from(key.pos.end));
    if let Some(slot) = key.slot {
        p.push_str(".s");
        push_decimal(&mut p, u64::from(slot));
    }
    if let Some(rank) = key.rank {
        p.push_str(".r");
        push_decimal(&mut p, u64::from(rank));
    }
    p.push_str(".safetensors");
    p
}

/// `v`'s decimal digits, in the end of the array from the returned index.
fn decimal_digits(mut v: u64) -> ([u8; 20], usize) {
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
    (digits, i)
}

/// Appends `v` in decimal: paths and hash lines are written piece by
/// piece, without `format!`.
pub(crate) fn push_decimal(out: &mut String, v: u64) {
    let (digits, i) = decimal_digits(v);
    // Pushed as characters: the digits are ASCII, and checking a few bytes
    // for UTF-8 cost more than the pushes (a hash line has six numbers).
    out.extend(digits[i..].iter().map(|&d| char::from(d)));
}

/// [`push_decimal`] appended to bytes (a directory hash's text).
pub(crate) fn push_decimal_bytes(out: &mut Vec<u8>, v: u64) {
    let (digits, i) = decimal_digits(v);
    out.extend_from_slice(&digits[i..]);
}

/// The largest layer index a key may have: far beyond any model, small
/// enough that nothing sized by a layer index can exhaust memory.
pub const MAX_LAYER: u32 = 65_535;
/// Positions are below this (16,777,216 tokens), and a tree's taps hold no
/// more positions than this in all: bounds any work done per position.
pub const MAX_POSITION: u32 = 1 << 24;

/// Whether a key's layer and positions are within the format's bounds and
/// its position range is not empty.
pub fn check_key_bounds(layer: Option<u32>, pos: &std::ops::Range<u32>) -> Result<(), String> {
    if layer.is_some_and(|l| l > MAX_LAYER) {
        return Err(format!("layer index above the format's {MAX_LAYER}"));
    }
    if pos.end > MAX_POSITION {
        return Err(format!(
            "position range {}..{} goes past the format's {MAX_POSITION} positions",
            pos.start, pos.end
        ));
    }
    if pos.start >= pos.end {
        return Err(format!(
            "empty or reversed position range {}..{}",
            pos.start, pos.end
        ));
    }
    Ok(())
}

/// Whether a shard can place a tensor of `ndim` axes in a full one: its
/// axis one of the tensor's, not the positions', and its range non-empty
/// and inside the full extent. (Whether the tensor's shape holds the range
/// is the writer's check, and the diff's, which names the rank.)
pub fn check_shard_bounds(shard: crate::key::Shard, ndim: usize) -> Result<(), String> {
    let axis = shard.axis as usize;
    if axis == 0 || axis >= ndim {
        return Err(format!(
            "shard {shard}: axis {axis} is not a non-position axis of a tensor of {ndim} axes"
        ));
    }
    if shard.start >= shard.end || shard.end > shard.full {
        return Err(format!(
            "shard {shard}: range is empty or leaves the full extent"
        ));
    }
    Ok(())
}

/// The rule [`valid_stage_name`] holds a stage name to, as messages say it.
pub const STAGE_NAME_RULE: &str = "[A-Za-z0-9_.-], at most 128 bytes, not starting with '.'";

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

/// Splits `"1.3"` into (1, 3).
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `path_of` writes what the `format!` it replaced wrote, for layers
    /// across the zero padding, positions, slots and ranks.
    #[test]
    fn path_of_matches_the_formatted_path() {
        let formatted = |k: &Key| {
            let dir = match k.layer {
                Some(l) => format!("L{l:03}"),
                None => GLOBAL_DIR.to_string(),
            };
            let mut p = format!("{dir}/{}.p{}-{}", k.stage, k.pos.start, k.pos.end);
            if let Some(s) = k.slot {
                p += &format!(".s{s}");
            }
            if let Some(r) = k.rank {
                p += &format!(".r{r}");
            }
            p + ".safetensors"
        };
        let layers = [
            None,
            Some(0),
            Some(7),
            Some(10),
            Some(99),
            Some(100),
            Some(999),
            Some(1000),
            Some(65_535),
        ];
        for layer in layers {
            for (start, end) in [(0, 1), (9, 10), (10, 123), (4_000_000, 16_777_216)] {
                for slot in [None, Some(0), Some(12)] {
                    for rank in [None, Some(3)] {
                        let mut k = Key::new("ffn_down", layer, start..end).with_slot(slot);
                        k.rank = rank;
                        assert_eq!(path_of(&k), formatted(&k));
                    }
                }
            }
        }
        // The check can fail: a key whose path is not the reference's.
        let k = Key::new("x", Some(5), 0..1);
        assert_ne!(path_of(&k), formatted(&Key::new("x", Some(50), 0..1)));
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
    fn a_sealed_manifest_detects_any_change_to_its_bytes() {
        let mut json = format!(
            "{{\"format\":\"taptree\",\"manifest_blake3\": \"{UNSEALED}\",\"entries\":[{{}}]}}\n"
        )
        .into_bytes();
        assert!(check_seal(&json).is_err(), "unsealed");
        assert!(seal(&mut json));
        check_seal(&json).unwrap();
        for i in 0..json.len() {
            let mut flipped = json.clone();
            flipped[i] ^= 0x04;
            assert!(check_seal(&flipped).is_err(), "flip at {i}");
        }
        for len in 0..json.len() {
            assert!(check_seal(&json[..len]).is_err(), "cut at {len}");
        }
        assert!(check_seal(b"{\"format\":\"taptree\"}").is_err());
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("1.0"), Some((1, 0)));
        assert_eq!(parse_version(FORMAT_VERSION), Some((FORMAT_MAJOR, 3)));
        assert_eq!(parse_version("12.34"), Some((12, 34)));
        assert_eq!(parse_version("1"), None);
        assert_eq!(parse_version("x.y"), None);
    }
}
