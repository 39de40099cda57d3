//! The index's head: its fixed layout, its seal, and the checks that bind
//! it to the exact bytes of `manifest.json`.

use super::{HEAD_LEN, MAGIC, SEAL_AT};
use crate::manifest;

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
    /// The checksum of the whole `manifest.json` ([`checksum`]: XXH3-128 of
    /// its 1 MiB chunks' digests from format 2.3, of its bytes in 2.1):
    /// trusted `verify A B`'s damage check of every byte.
    pub json_xxh3: [u8; 16],
    /// The checksum of the whole body, by the same rule.
    pub body_xxh3: [u8; 16],
}

/// XXH3-128 of `b`, in its canonical (big-endian) byte order. twox-hash
/// picks its AVX2 loop at run time where the CPU has it (twice the speed of
/// the SSE2 one a default build is limited to), with the same digest.
pub fn xxh3(b: &[u8]) -> [u8; 16] {
    twox_hash::XxHash3_128::oneshot(b).to_be_bytes()
}

/// The size of the chunks a format 2.3 checksum is made of.
pub const CHUNK: usize = 1 << 20;

/// The format 2.3 checksum of `b`: XXH3-128 (canonical) of the
/// concatenated XXH3-128 digests of its [`CHUNK`]-byte chunks (the last
/// one shorter; none for empty `b`), so that several cores can share it.
/// The chunks are hashed on every core (rayon) when there are several.
pub fn xxh3_chunked(b: &[u8]) -> [u8; 16] {
    use rayon::prelude::*;
    let digests: Vec<[u8; 16]> = if b.len() > CHUNK {
        b.par_chunks(CHUNK).map(xxh3).collect()
    } else {
        b.chunks(CHUNK).map(xxh3).collect()
    };
    fold_chunks(&digests)
}

/// The last step of [`xxh3_chunked`]: the checksum of the digests of a
/// file's chunks, in order, however they were computed.
pub(super) fn fold_chunks(digests: &[[u8; 16]]) -> [u8; 16] {
    xxh3(digests.as_flattened())
}

/// Whether a tree of format `major.minor` checksums its manifest and
/// index body by chunks ([`xxh3_chunked`], 2.3 on) or whole ([`xxh3`], 2.1).
pub fn chunked_rule(major: u32, minor: u32) -> bool {
    (major, minor) >= (2, 3)
}

/// The checksum of `b` under the rule of format `major.minor`.
pub fn checksum(major: u32, minor: u32, b: &[u8]) -> [u8; 16] {
    if chunked_rule(major, minor) {
        xxh3_chunked(b)
    } else {
        xxh3(b)
    }
}

#[inline]
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline]
pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[inline]
pub(super) fn hash_at(b: &[u8], at: usize) -> [u8; 32] {
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
    let mut out = [0u8; 64];
    hex_into(&mut out, h);
    std::str::from_utf8(&out).expect("hex digits").to_owned()
}

/// `h`'s 64 lowercase hex digits into `out`.
pub(crate) fn hex_into(out: &mut [u8; 64], h: &[u8; 32]) {
    // By table, a byte's two digits at once: decoding an index writes two
    // of these per entry, and going through `blake3::Hash::to_hex` cost
    // twice a digit-at-a-time table.
    const PAIRS: [[u8; 2]; 256] = {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut b = 0;
        while b < 256 {
            t[b] = [DIGITS[b >> 4], DIGITS[b & 15]];
            b += 1;
        }
        t
    };
    for (pair, &b) in out.chunks_exact_mut(2).zip(h) {
        pair.copy_from_slice(&PAIRS[usize::from(b)]);
    }
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

    pub(super) fn write(&self) -> [u8; HEAD_LEN] {
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

#[cfg(test)]
mod tests {
    /// The table's hex is blake3's, and a changed byte changes it.
    #[test]
    fn hex_is_blake3s_hex() {
        for seed in 0u8..=255 {
            let h: [u8; 32] =
                std::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8 * 7));
            assert_eq!(
                super::hex(&h),
                blake3::Hash::from_bytes(h).to_hex().as_str()
            );
            let mut other = h;
            other[31] ^= 1;
            assert_ne!(super::hex(&h), super::hex(&other));
        }
    }

    /// The chunks hashed on every core give the digest of the definition:
    /// XXH3-128 of the chunks' digests in order, for one chunk, a few, and
    /// a last one shorter; a swap of two chunks changes it.
    #[test]
    fn chunks_hashed_on_every_core_are_taken_in_order() {
        use super::{xxh3, xxh3_chunked, CHUNK};
        let bytes: Vec<u8> = (0..5 * CHUNK + 123)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        for len in [0, 10, CHUNK, CHUNK + 1, 3 * CHUNK, bytes.len()] {
            let b = &bytes[..len];
            let mut digests = Vec::new();
            for c in b.chunks(CHUNK) {
                digests.extend_from_slice(&xxh3(c));
            }
            assert_eq!(xxh3_chunked(b), xxh3(&digests), "{len} bytes");
        }
        let mut swapped = bytes.clone();
        let (first, rest) = swapped.split_at_mut(CHUNK);
        first.swap_with_slice(&mut rest[..CHUNK]);
        assert_ne!(xxh3_chunked(&swapped), xxh3_chunked(&bytes));
    }
}
