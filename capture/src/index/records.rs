//! The index's body: one fixed-size record per entry, then the shapes'
//! dimensions, then the strings the records name; written from a manifest
//! and decoded back into its entries.

use super::head::{checksum, hash_at, hex, hex32, u32_at, u64_at};
use super::{IndexHead, HAS_HEADER_HASH, HAS_LAYER, HAS_SLOT, HEAD_LEN, NONE, RECORD_LEN};
use crate::dtype::DType;
use crate::key::Key;
use crate::manifest::{self, Entry, Manifest};
use std::collections::HashMap;

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
        json_xxh3: checksum(major_minor.0, major_minor.1, json),
        body_xxh3: checksum(major_minor.0, major_minor.1, &body),
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

pub(super) fn dtype_of(code: u8) -> Option<DType> {
    use DType::*;
    [F32, F16, BF16, F64, I8, I32].get(code as usize).copied()
}

/// An index body's parts: its records, the shapes' dimensions, and its
/// strings.
pub(super) struct Body<'a> {
    pub(super) records: &'a [u8],
    pub(super) dims: &'a [u8],
    pub(super) strings: Vec<&'a str>,
}

/// The parts of a whole index whose head is `head`: checks its size and
/// body hash, and that its counts fit what it holds. Nothing is allocated
/// by a count read from the file before the file is known to hold that much.
pub(super) fn body<'a>(index: &'a [u8], head: &IndexHead) -> std::result::Result<Body<'a>, String> {
    let body = &index[HEAD_LEN.min(index.len())..];
    if body.len() as u64 != head.body_len {
        return Err(format!(
            "{} bytes after its head, its head says {}: the index was truncated, appended to, edited or damaged",
            body.len(),
            head.body_len
        ));
    }
    // XXH3-128 alone: the head that records it is sealed with blake3, and
    // the body's blake3 (kept in the head for other readers) would check
    // the same bytes again at a fifth of the speed.
    if checksum(head.major, head.minor, body) != head.body_xxh3 {
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
    Ok(Body {
        records,
        dims,
        strings,
    })
}

/// The entries of a whole index whose head is `head`: checks its size and
/// body hash (`body`), then every record's references.
pub fn decode(index: &[u8], head: &IndexHead) -> std::result::Result<Vec<Entry>, String> {
    let Body {
        records,
        dims,
        strings,
    } = body(index, head)?;
    let one = |(n, r): (usize, &[u8])| record(n, r, dims, &strings);
    // Records are independent: decoded on every core, in order, each
    // straight into its place in the vector (a collect of results would
    // gather pieces and copy them into place on one thread). A bad record
    // leaves an empty entry in its place and its error, where its number is
    // the lowest yet, in `first_bad`: the error is the first bad record's,
    // as on one thread.
    if records.len() >= PARALLEL_FROM * RECORD_LEN {
        use rayon::prelude::*;
        let first_bad: std::sync::Mutex<Option<(usize, String)>> = Default::default();
        let mut all: Vec<Entry> = Vec::new();
        records
            .par_chunks_exact(RECORD_LEN)
            .enumerate()
            .map(|(n, r)| {
                one((n, r)).unwrap_or_else(|why| {
                    let mut first = first_bad.lock().unwrap_or_else(|p| p.into_inner());
                    if first.as_ref().is_none_or(|(m, _)| n < *m) {
                        *first = Some((n, why));
                    }
                    Entry {
                        key: Key::new(String::new(), None, 0..0),
                        path: String::new(),
                        dtype: DType::F32,
                        shape: Vec::new(),
                        blake3: String::new(),
                        bytes: 0,
                        header_blake3: None,
                    }
                })
            })
            .collect_into_vec(&mut all);
        let first_bad = first_bad.into_inner().unwrap_or_else(|p| p.into_inner());
        return match first_bad {
            None => Ok(all),
            Some((_, why)) => Err(why),
        };
    }
    let mut out = Vec::with_capacity(head.taps as usize);
    for r in records.chunks_exact(RECORD_LEN).enumerate() {
        out.push(one(r)?);
    }
    Ok(out)
}

/// Below this many records an index is decoded on one thread.
const PARALLEL_FROM: usize = 2048;

/// A record whose references were checked, read in place.
pub(super) struct Rec<'a> {
    pub(super) stage: &'a str,
    pub(super) layer: Option<u32>,
    pub(super) pos: std::ops::Range<u32>,
    pub(super) slot: Option<u32>,
    pub(super) dtype: DType,
    /// The shape's dimensions, 8 bytes each (little-endian).
    pub(super) dims: &'a [u8],
    /// A path the writer spelt its own way; `None`: `path_of(key)`.
    pub(super) path: Option<&'a str>,
    pub(super) bytes: u64,
    pub(super) blake3: [u8; 32],
    pub(super) header: Option<[u8; 32]>,
}

/// Record `n`, `r`, whose shape is in `dims` and whose strings are
/// `strings`, with its references checked: what [`record`] decodes.
pub(super) fn check_record<'a>(
    n: usize,
    r: &[u8],
    dims: &'a [u8],
    strings: &[&'a str],
) -> std::result::Result<Rec<'a>, String> {
    let string = |i: u32| strings.get(i as usize).copied();
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
    let dtype = dtype_of(r[20]).ok_or_else(|| bad("unknown dtype code"))?;
    let (dims_at, ndim) = (u32_at(r, 24) as usize, r[21] as usize);
    let dims = dims
        .get(dims_at * 8..(dims_at + ndim) * 8)
        .ok_or_else(|| bad("its shape runs past the dimensions"))?;
    let path = match u32_at(r, 28) {
        NONE => None,
        i => Some(string(i).ok_or_else(|| bad("no such path string"))?),
    };
    Ok(Rec {
        stage,
        layer: opt(HAS_LAYER, 4),
        pos: u32_at(r, 8)..u32_at(r, 12),
        slot: opt(HAS_SLOT, 16),
        dtype,
        dims,
        path,
        bytes: u64_at(r, 32),
        blake3: hash_at(r, 40),
        header: (flags & HAS_HEADER_HASH != 0).then(|| hash_at(r, 72)),
    })
}

/// A record's shape, one dimension per 8 bytes of `dims`.
pub(super) fn shape_of(dims: &[u8]) -> impl Iterator<Item = u64> + '_ {
    dims.chunks_exact(8).map(|d| u64_at(d, 0))
}

impl Rec<'_> {
    /// The owned entry this record describes.
    pub(super) fn entry(&self) -> Entry {
        let key = Key::new(self.stage, self.layer, self.pos.clone()).with_slot(self.slot);
        let shape: Vec<usize> = shape_of(self.dims)
            .map(|d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect();
        let path = match self.path {
            None => manifest::path_of(&key),
            Some(p) => p.to_string(),
        };
        Entry {
            path,
            key,
            dtype: self.dtype,
            shape,
            blake3: hex(&self.blake3),
            bytes: self.bytes,
            header_blake3: self.header.as_ref().map(hex),
        }
    }
}

/// The entry of record `n`, `r`, whose shape is in `dims` and whose
/// strings are `strings`.
fn record(n: usize, r: &[u8], dims: &[u8], strings: &[&str]) -> std::result::Result<Entry, String> {
    check_record(n, r, dims, strings).map(|rec| rec.entry())
}
