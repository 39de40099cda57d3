//! The manifest's binary index (`manifest.idx`, format 2.1): the entries in
//! fixed-size records, and a small sealed head that binds the index to the
//! exact bytes of `manifest.json`.
//!
//! Why: a tree of 37,674 taps has a 12 MB manifest. Checking it whole
//! (blake3) and parsing it costs tens of milliseconds, which trusted
//! `verify A B` and `diff` paid on every call. With the index, trusted
//! `verify A B` checks a 288-byte head, the sizes of both files, the
//! manifest's bytes outside its entry list, and a fast checksum (XXH3-128)
//! of every byte of both files; opening a tree hashes
//! the manifest (to refuse any damage) but parses only those few KB and
//! decodes the entries from the records. docs/FORMAT.md ("The index") is the
//! normative description; docs/TRUST.md says what each path checks.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::manifest::{self, Entry, Manifest, MANIFEST_FILE};
use crate::open::*;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// The index's file name at the root of a tree, beside `manifest.json`.
pub const INDEX_FILE: &str = "manifest.idx";
/// The fixed size of the index's head.
pub const HEAD_LEN: usize = 288;
/// The first bytes of every index.
pub const MAGIC: &[u8; 16] = b"taptree index\n\0\0";
/// The fixed size of one entry's record.
pub const RECORD_LEN: usize = 104;
/// Where the head's own blake3 starts: it covers the bytes before it.
const SEAL_AT: usize = HEAD_LEN - 32;
/// A writer's own path (`path_of(key)`), in a record's path field.
const NONE: u32 = u32::MAX;
/// Record flags: the entry has a `header_blake3`, a layer, a slot.
const HAS_HEADER_HASH: u16 = 1;
const HAS_LAYER: u16 = 2;
const HAS_SLOT: u16 = 4;

/// The head of an index: what trusted `verify A B` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexHead {
    /// The tree format's major version the index was built for (the manifest's).
    pub major: u32,
    /// The tree format's minor version.
    pub minor: u32,
    /// Number of entries.
    pub taps: u64,
    /// Total tensor bytes of the entries.
    pub bytes: u64,
    /// The size of `manifest.json`.
    pub json_len: u64,
    /// Where in `manifest.json` the `[` that opens `entries` lies, and
    /// where the array ends (just after its `]`).
    pub entries_at: u64,
    /// Where the entry array ends in `manifest.json` (just after its `]`).
    pub entries_end: u64,
    /// Bytes of the body: the records, the dims and the strings.
    pub body_len: u64,
    /// How many shape dimensions, and strings, the body holds.
    pub dims: u64,
    /// How many strings the body's string table holds.
    pub strings: u64,
    /// The tree's root hash, raw.
    pub root: [u8; 32],
    /// The manifest's own `manifest_blake3`.
    pub manifest_blake3: [u8; 32],
    /// blake3 of `manifest.json`'s bytes outside its entry list: those
    /// before `entries_at`, then those from `entries_end` on.
    pub prefix_blake3: [u8; 32],
    /// blake3 of the body (everything after the head).
    pub body_blake3: [u8; 32],
    /// XXH3-128 (canonical, big-endian) of the whole `manifest.json`, and
    /// of the whole body: trusted `verify A B`'s damage check of every byte.
    pub json_xxh3: [u8; 16],
    /// XXH3-128 (canonical) of the whole body.
    pub body_xxh3: [u8; 16],
}

/// XXH3-128 of `b`, in its canonical (big-endian) byte order.
pub fn xxh3(b: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(b).to_be_bytes()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn hash_at(b: &[u8], at: usize) -> [u8; 32] {
    b[at..at + 32].try_into().expect("32 bytes")
}

/// 64 lowercase hex digits as 32 bytes.
pub(crate) fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    blake3::Hash::from_hex(s).ok().map(|h| *h.as_bytes())
}

pub(crate) fn hex(h: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*h).to_hex().to_string()
}

impl IndexHead {
    /// Parses and checks a head: magic, its own blake3, reserved bytes.
    pub fn parse(b: &[u8]) -> std::result::Result<IndexHead, String> {
        if b.len() < HEAD_LEN {
            return Err(format!(
                "truncated: {} bytes, the head alone is {HEAD_LEN}",
                b.len()
            ));
        }
        if &b[..16] != MAGIC {
            return Err("not a taptree index (bad magic)".into());
        }
        let actual = blake3::hash(&b[..SEAL_AT]);
        if actual.as_bytes() != &b[SEAL_AT..HEAD_LEN] {
            return Err(format!(
                "its head hashes to {}, its seal says {}: the index was edited or damaged",
                actual.to_hex(),
                hex(&hash_at(b, SEAL_AT))
            ));
        }
        if b[248..SEAL_AT].iter().any(|&c| c != 0) {
            return Err("reserved head bytes are not zero".into());
        }
        Ok(IndexHead {
            major: u32_at(b, 16),
            minor: u32_at(b, 20),
            taps: u64_at(b, 24),
            bytes: u64_at(b, 32),
            json_len: u64_at(b, 40),
            entries_at: u64_at(b, 48),
            body_len: u64_at(b, 56),
            dims: u64_at(b, 64),
            strings: u64_at(b, 72),
            root: hash_at(b, 80),
            manifest_blake3: hash_at(b, 112),
            prefix_blake3: hash_at(b, 144),
            body_blake3: hash_at(b, 176),
            entries_end: u64_at(b, 208),
            json_xxh3: b[216..232].try_into().expect("16 bytes"),
            body_xxh3: b[232..248].try_into().expect("16 bytes"),
        })
    }

    fn write(&self) -> [u8; HEAD_LEN] {
        let mut b = [0u8; HEAD_LEN];
        b[..16].copy_from_slice(MAGIC);
        b[16..20].copy_from_slice(&self.major.to_le_bytes());
        b[20..24].copy_from_slice(&self.minor.to_le_bytes());
        for (at, v) in [
            (24, self.taps),
            (32, self.bytes),
            (40, self.json_len),
            (48, self.entries_at),
            (56, self.body_len),
            (64, self.dims),
            (72, self.strings),
            (208, self.entries_end),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        for (at, h) in [
            (80, &self.root),
            (112, &self.manifest_blake3),
            (144, &self.prefix_blake3),
            (176, &self.body_blake3),
        ] {
            b[at..at + 32].copy_from_slice(h);
        }
        b[216..232].copy_from_slice(&self.json_xxh3);
        b[232..248].copy_from_slice(&self.body_xxh3);
        let seal = blake3::hash(&b[..SEAL_AT]);
        b[SEAL_AT..].copy_from_slice(seal.as_bytes());
        b
    }

    /// Where the manifest's entry list lies, checked against the file's
    /// size `json_len` (which must be the one recorded).
    pub fn entries_span(
        &self,
        json_len: u64,
    ) -> std::result::Result<std::ops::Range<usize>, String> {
        if json_len != self.json_len {
            return Err(format!(
                "{json_len} bytes, its index says {}: the manifest was truncated, appended to, edited or damaged",
                self.json_len
            ));
        }
        if !(self.entries_at + 2 <= self.entries_end && self.entries_end <= json_len) {
            return Err("its index does not point at the manifest's entries".into());
        }
        Ok(self.entries_at as usize..self.entries_end as usize)
    }

    /// Whether `json` is, to the checksum, the manifest this head was
    /// written for: its size and the XXH3-128 of all its bytes.
    pub fn check_whole_json(&self, json: &[u8]) -> std::result::Result<(), String> {
        if json.len() as u64 != self.json_len {
            return Err(format!(
                "{} bytes, its index says {}: the manifest was truncated, appended to, edited or damaged",
                json.len(),
                self.json_len
            ));
        }
        if xxh3(json) != self.json_xxh3 {
            return Err(
                "its bytes do not have the checksum its index records: the manifest was edited or damaged"
                    .into(),
            );
        }
        Ok(())
    }

    /// Whether this head describes the manifest whose bytes before its
    /// entries are `prefix` (through the entries' `[`) and from the end of
    /// its entries on are `suffix`, and whose size is `json_len`: the size,
    /// the hash of those bytes, and the `manifest_blake3` they hold.
    pub fn check_json(
        &self,
        prefix: &[u8],
        suffix: &[u8],
        json_len: u64,
    ) -> std::result::Result<(), String> {
        let span = self.entries_span(json_len)?;
        let at = span.start;
        if prefix.len() <= at || prefix[at] != b'[' || suffix.len() != json_len as usize - span.end
        {
            return Err("its index does not point at the manifest's entries".into());
        }
        let mut outside = blake3::Hasher::new();
        outside.update(&prefix[..at]);
        outside.update(suffix);
        if outside.finalize().as_bytes() != &self.prefix_blake3 {
            return Err(
                "its bytes outside the entries do not hash to what its index says: the manifest was edited or damaged"
                    .into(),
            );
        }
        let stored = match manifest::seal_digits(&prefix[..at]) {
            Some(d) => &prefix[d],
            None => manifest::seal_digits(suffix)
                .map(|d| &suffix[d])
                .ok_or("no manifest_blake3 outside its entries")?,
        };
        if stored != hex(&self.manifest_blake3).as_bytes() {
            return Err("its manifest_blake3 is not the one its index records".into());
        }
        Ok(())
    }
}

/// The index of `json` (a sealed manifest's exact bytes) and of `m` (the
/// manifest those bytes hold). The entries array must be the manifest's
/// last field, as every writer of this crate and the Python package puts it.
pub fn build(json: &[u8], m: &Manifest) -> std::result::Result<Vec<u8>, String> {
    const KEY: &[u8] = b"\"entries\":[";
    let entries_at =
        memchr::memmem::rfind(json, KEY).ok_or("no \"entries\":[ in the manifest")? + KEY.len() - 1;
    let mut array = serde_json::Deserializer::from_slice(&json[entries_at..])
        .into_iter::<serde::de::IgnoredAny>();
    array
        .next()
        .ok_or("no entry list")?
        .map_err(|e| format!("the entry list: {e}"))?;
    let entries_end = entries_at + array.byte_offset();
    let digits = manifest::seal_digits(json).ok_or("the manifest has no manifest_blake3")?;
    let seal = std::str::from_utf8(&json[digits]).ok().and_then(hex32);
    let seal = seal.ok_or("the manifest's manifest_blake3 is not 64 lowercase hex digits")?;
    let root = hex32(&m.root).ok_or("the root is not 64 lowercase hex digits")?;
    let major_minor = manifest::parse_version(&m.format_version).ok_or("bad format_version")?;

    let mut strings = Strings::default();
    let mut records = Vec::with_capacity(m.entries.len() * RECORD_LEN);
    let mut dims: Vec<u8> = Vec::new();
    for e in &m.entries {
        let bad = |what: &str| format!("{}: {what}", e.key);
        let blake = hex32(&e.blake3).ok_or_else(|| bad("blake3 is not 64 lowercase hex digits"))?;
        let header = match &e.header_blake3 {
            Some(h) => Some(hex32(h).ok_or_else(|| bad("header_blake3 is not hex"))?),
            None => None,
        };
        let ndim = u8::try_from(e.shape.len()).map_err(|_| bad("more than 255 dimensions"))?;
        let dims_at = u32::try_from(dims.len() / 8).map_err(|_| bad("too many dimensions"))?;
        for &d in &e.shape {
            dims.extend_from_slice(&(d as u64).to_le_bytes());
        }
        let stage = strings.intern(&e.key.stage);
        let path = if e.path == manifest::path_of(&e.key) {
            NONE
        } else {
            strings.intern(&e.path)
        };
        let mut r = [0u8; RECORD_LEN];
        for (at, v) in [
            (0, stage),
            (4, e.key.layer.unwrap_or(0)),
            (8, e.key.pos.start),
            (12, e.key.pos.end),
            (16, e.key.slot.unwrap_or(0)),
            (24, dims_at),
            (28, path),
        ] {
            r[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        r[20] = dtype_code(e.dtype);
        r[21] = ndim;
        let flags = [
            (header.is_some(), HAS_HEADER_HASH),
            (e.key.layer.is_some(), HAS_LAYER),
            (e.key.slot.is_some(), HAS_SLOT),
        ]
        .iter()
        .filter(|(has, _)| *has)
        .fold(0, |f, (_, bit)| f | bit);
        r[22..24].copy_from_slice(&flags.to_le_bytes());
        r[32..40].copy_from_slice(&e.bytes.to_le_bytes());
        r[40..72].copy_from_slice(&blake);
        r[72..104].copy_from_slice(&header.unwrap_or([0; 32]));
        records.extend_from_slice(&r);
    }
    let mut body = records;
    body.extend_from_slice(&dims);
    for s in &strings.list {
        body.extend_from_slice(&(s.len() as u32).to_le_bytes());
        body.extend_from_slice(s.as_bytes());
    }
    let head = IndexHead {
        major: major_minor.0,
        minor: major_minor.1,
        taps: m.entries.len() as u64,
        bytes: m.bytes_of_entries(),
        json_len: json.len() as u64,
        entries_at: entries_at as u64,
        entries_end: entries_end as u64,
        body_len: body.len() as u64,
        dims: (dims.len() / 8) as u64,
        strings: strings.list.len() as u64,
        root,
        manifest_blake3: seal,
        prefix_blake3: *blake3::Hasher::new()
            .update(&json[..entries_at])
            .update(&json[entries_end..])
            .finalize()
            .as_bytes(),
        body_blake3: *blake3::hash(&body).as_bytes(),
        json_xxh3: xxh3(json),
        body_xxh3: xxh3(&body),
    };
    let mut out = head.write().to_vec();
    out.extend_from_slice(&body);
    Ok(out)
}

/// The body's strings (stage names, and paths a writer spelt its own way),
/// each once, numbered in order of first use.
#[derive(Default)]
struct Strings<'a> {
    list: Vec<&'a str>,
    ids: HashMap<&'a str, u32>,
}

impl<'a> Strings<'a> {
    fn intern(&mut self, s: &'a str) -> u32 {
        let list = &mut self.list;
        *self.ids.entry(s).or_insert_with(|| {
            list.push(s);
            (list.len() - 1) as u32
        })
    }
}

fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F64 => 3,
        DType::I8 => 4,
        DType::I32 => 5,
    }
}

fn dtype_of(code: u8) -> Option<DType> {
    use DType::*;
    [F32, F16, BF16, F64, I8, I32].get(code as usize).copied()
}

/// The entries of a whole index whose head is `head`: checks its size and
/// body hash, then every record's references. Nothing is allocated by a
/// count read from the file before the file is known to hold that much.
pub fn decode(index: &[u8], head: &IndexHead) -> std::result::Result<Vec<Entry>, String> {
    let body = &index[HEAD_LEN.min(index.len())..];
    if body.len() as u64 != head.body_len {
        return Err(format!(
            "{} bytes after its head, its head says {}: the index was truncated, appended to, edited or damaged",
            body.len(),
            head.body_len
        ));
    }
    if xxh3(body) != head.body_xxh3 || blake3::hash(body).as_bytes() != &head.body_blake3 {
        return Err("its records do not hash to what its head says: the index was damaged".into());
    }
    let records_len = head
        .taps
        .checked_mul(RECORD_LEN as u64)
        .filter(|&n| n <= head.body_len)
        .ok_or("its head counts more records than it holds")?;
    let dims_len = head
        .dims
        .checked_mul(8)
        .filter(|&n| n <= head.body_len - records_len)
        .ok_or("its head counts more dimensions than it holds")?;
    let (records, rest) = body.split_at(records_len as usize);
    let (dims, mut rest) = rest.split_at(dims_len as usize);
    let mut strings: Vec<&str> = Vec::new();
    while !rest.is_empty() {
        let len = rest
            .get(..4)
            .map(|b| u32_at(b, 0) as usize)
            .filter(|&n| n <= rest.len() - 4)
            .ok_or("a string runs past its end")?;
        let s = std::str::from_utf8(&rest[4..4 + len]).map_err(|_| "a string is not UTF-8")?;
        strings.push(s);
        rest = &rest[4 + len..];
    }
    if strings.len() as u64 != head.strings {
        return Err("its head counts another number of strings than it holds".into());
    }
    let string = |i: u32| strings.get(i as usize).copied();
    let mut out = Vec::with_capacity(head.taps as usize);
    for (n, r) in records.chunks_exact(RECORD_LEN).enumerate() {
        let bad = |what: &str| format!("record {n}: {what}");
        let stage = string(u32_at(r, 0)).ok_or_else(|| bad("no such stage string"))?;
        if !manifest::valid_stage_name(stage) {
            return Err(bad("not a valid stage name"));
        }
        let flags = u16::from_le_bytes([r[22], r[23]]);
        if flags & !(HAS_HEADER_HASH | HAS_LAYER | HAS_SLOT) != 0 {
            return Err(bad("unknown flags"));
        }
        // What a flag says is absent is written as zeros, and read so.
        if (flags & HAS_LAYER == 0 && u32_at(r, 4) != 0)
            || (flags & HAS_SLOT == 0 && u32_at(r, 16) != 0)
            || (flags & HAS_HEADER_HASH == 0 && r[72..104].iter().any(|&c| c != 0))
        {
            return Err(bad("a field its flags say is absent is not zero"));
        }
        let opt = |bit: u16, at: usize| (flags & bit != 0).then(|| u32_at(r, at));
        let key = Key::new(stage, opt(HAS_LAYER, 4), u32_at(r, 8)..u32_at(r, 12))
            .with_slot(opt(HAS_SLOT, 16));
        let dtype = dtype_of(r[20]).ok_or_else(|| bad("unknown dtype code"))?;
        let (dims_at, ndim) = (u32_at(r, 24) as usize, r[21] as usize);
        let shape: Vec<usize> = dims
            .get(dims_at * 8..(dims_at + ndim) * 8)
            .ok_or_else(|| bad("its shape runs past the dimensions"))?
            .chunks_exact(8)
            .map(|d| usize::try_from(u64_at(d, 0)).unwrap_or(usize::MAX))
            .collect();
        let path = match u32_at(r, 28) {
            NONE => manifest::path_of(&key),
            i => string(i)
                .ok_or_else(|| bad("no such path string"))?
                .to_string(),
        };
        out.push(Entry {
            path,
            key,
            dtype,
            shape,
            blake3: hex(&hash_at(r, 40)),
            bytes: u64_at(r, 32),
            header_blake3: (flags & HAS_HEADER_HASH != 0).then(|| hex(&hash_at(r, 72))),
        });
    }
    Ok(out)
}

/// Whether a manifest of this version has an index beside it. A ranked
/// tree (format 2.2, tensor parallel) has none: its records hold no rank
/// or shard, so its entries are read from the JSON.
pub fn has_index(version: &str) -> bool {
    manifest::parse_version(version).is_some_and(|v| v >= (2, 1))
        && version != manifest::FORMAT_VERSION_RANKED
}

fn bad_index(tree: &Path, reason: impl Into<String>) -> Error {
    Error::BadManifest {
        path: tree.join(INDEX_FILE),
        reason: reason.into(),
    }
}

/// Opens the index of the tree at `tree`: a regular file inside the tree.
fn open_index(tree: &Path) -> Result<std::fs::File> {
    let path = tree.join(INDEX_FILE);
    crate::manifest_file::check_manifest_link(tree, &path)?;
    open_regular(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            bad_index(
                tree,
                "missing: a format 2.1 manifest must have its index beside it",
            )
        } else {
            Error::io(&path, e)
        }
    })
}

/// Trusted `verify A B`'s check of a format 2.1 tree, given the first
/// bytes of its manifest and the head fields found there: the index's head
/// is sealed, both files have the sizes it records, the manifest's bytes
/// outside its entries are the ones it hashed, and every byte of both files
/// has the XXH3-128 checksum it records. Returns the index head.
pub(crate) fn check_trusted(tree: &Path, version: &str, root: &str) -> Result<IndexHead> {
    let index_path = tree.join(INDEX_FILE);
    let mut file = open_index(tree)?;
    let mut buf = [0u8; HEAD_LEN];
    let n = read_up_to(&mut file, &mut buf).map_err(|e| Error::io(&index_path, e))?;
    let head = IndexHead::parse(&buf[..n]).map_err(|r| bad_index(tree, r))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(&index_path, e))?
        .len();
    if Some(len) != head.body_len.checked_add(HEAD_LEN as u64) {
        return Err(bad_index(
            tree,
            format!(
                "{len} bytes, its head says {}: the index was truncated, appended to, edited or damaged",
                head.body_len.saturating_add(HEAD_LEN as u64)
            ),
        ));
    }
    check_version_and_root(tree, &head, version, root)?;
    let json_path = tree.join(MANIFEST_FILE);
    let json = open_regular(&json_path).map_err(|e| Error::io(&json_path, e))?;
    let json_len = json.metadata().map_err(|e| Error::io(&json_path, e))?.len();
    let bad = |reason: String| Error::BadManifest {
        path: json_path.clone(),
        reason,
    };
    // The files are mapped only once their sizes are the ones recorded.
    let span = head.entries_span(json_len).map_err(bad)?;
    let index = map_or_read(&file, len).map_err(|e| Error::io(&index_path, e))?;
    let json = map_or_read(&json, json_len).map_err(|e| Error::io(&json_path, e))?;
    // The two checksums side by side: the manifest's is three quarters of
    // the work.
    let (body_ok, json_ok) = std::thread::scope(|s| {
        let body = s.spawn(|| index.get(HEAD_LEN..).map(xxh3) == Some(head.body_xxh3));
        let json_ok = head.check_whole_json(&json);
        (body.join().unwrap_or(false), json_ok)
    });
    if !body_ok {
        return Err(bad_index(
            tree,
            "its records do not have the checksum its head records: the index was edited or damaged",
        ));
    }
    json_ok.map_err(bad)?;
    head.check_json(&json, &json[span.end.min(json.len())..], json_len)
        .map_err(bad)?;
    Ok(head)
}

/// A regular file's `len` bytes, mapped (a copy of many megabytes costs
/// more than the checksum over them), or read where mapping fails.
fn map_or_read(
    file: &std::fs::File,
    len: u64,
) -> std::io::Result<crate::manifest_file::ManifestBytes> {
    use crate::manifest_file::ManifestBytes;
    // SAFETY: read-only; a tree's manifest and index are renamed into
    // place whole and never written again.
    // Populated: the kernel maps every page at once rather than one fault
    // at a time as the checksum walks them.
    if let Ok(map) = unsafe { memmap2::MmapOptions::new().populate().map(file) } {
        return Ok(ManifestBytes::Mapped(map));
    }
    let mut bytes = Vec::new();
    let f = file;
    f.take(len).read_to_end(&mut bytes)?;
    Ok(ManifestBytes::Read(bytes))
}

fn check_version_and_root(tree: &Path, head: &IndexHead, version: &str, root: &str) -> Result<()> {
    if manifest::parse_version(version) != Some((head.major, head.minor)) {
        return Err(bad_index(
            tree,
            format!(
                "format {}.{}, its manifest says {version}",
                head.major, head.minor
            ),
        ));
    }
    if hex(&head.root) != root {
        return Err(bad_index(
            tree,
            format!("root {}, its manifest says {root}", hex(&head.root)),
        ));
    }
    Ok(())
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The manifest of a format 2.1 tree whose manifest's bytes are `json`
/// (already checked whole against its own seal): the index is read whole
/// and checked against its seal and against `json`, the manifest's fields
/// before its entries are parsed from `json`, and the entries are decoded
/// from the index.
pub(crate) fn open_manifest(tree: &Path, json: &[u8]) -> Result<Manifest> {
    let json_path = tree.join(MANIFEST_FILE);
    let bad_json = |reason: String| Error::BadManifest {
        path: json_path.clone(),
        reason,
    };
    let mut file = open_index(tree)?;
    let mut index = Vec::new();
    // An index holds less than a third of its manifest's bytes.
    read_all(&mut file, &mut index, json.len() / 3 + HEAD_LEN)
        .map_err(|e| Error::io(tree.join(INDEX_FILE), e))
        .map(|n| index.truncate(n))?;
    let head = IndexHead::parse(&index).map_err(|r| bad_index(tree, r))?;
    let span = head.entries_span(json.len() as u64).map_err(bad_json)?;
    head.check_whole_json(json).map_err(bad_json)?;
    head.check_json(json, &json[span.end..], json.len() as u64)
        .map_err(bad_json)?;
    let mut text = json[..span.start].to_vec();
    text.extend_from_slice(b"[]");
    text.extend_from_slice(&json[span.end..]);
    let mut m: Manifest = serde_json::from_slice(&text)
        .map_err(|e| bad_json(format!("its fields before the entries: {e}")))?;
    check_version_and_root(tree, &head, &m.format_version, &m.root)?;
    m.entries = decode(&index, &head).map_err(|r| bad_index(tree, r))?;
    Ok(m)
}

/// Writes `manifest.idx` for the tree at `tree` from its `manifest.json`
/// as it is now (parsed whole; nothing checked against its root): for tools
/// and tests that edit a manifest and seal it again.
pub fn rewrite(tree: &Path) -> Result<()> {
    let json_path = tree.join(MANIFEST_FILE);
    let json = std::fs::read(&json_path).map_err(|e| Error::io(&json_path, e))?;
    let m: Manifest = serde_json::from_slice(&json).map_err(|e| Error::BadManifest {
        path: json_path.clone(),
        reason: e.to_string(),
    })?;
    let index = build(&json, &m).map_err(|reason| Error::BadManifest {
        path: json_path,
        reason,
    })?;
    let path = tree.join(INDEX_FILE);
    std::fs::write(&path, index).map_err(|e| Error::io(&path, e))
}

/// Redoes an index's body hash and head seal after an edit of its bytes
/// (for tests and the fuzz harness, so that what is tested is the edit).
/// An index shorter than its head is left alone.
pub fn reseal(index: &mut [u8]) {
    if index.len() < HEAD_LEN {
        return;
    }
    let body = *blake3::hash(&index[HEAD_LEN..]).as_bytes();
    index[176..208].copy_from_slice(&body);
    let body = xxh3(&index[HEAD_LEN..]);
    index[232..248].copy_from_slice(&body);
    let seal = *blake3::hash(&index[..SEAL_AT]).as_bytes();
    index[SEAL_AT..HEAD_LEN].copy_from_slice(&seal);
}
