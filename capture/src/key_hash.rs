//! The hash of a tap's key for the checks that no key appears twice.

/// The duplicate-key check's hash (`manifest_file::check_entries`, and the
/// records' own check in `index::view`): keys are short,
/// and SipHash was a good part of opening a tree. A word at a time
/// (FxHash's step: rotate, xor, multiply), integers without going through
/// their bytes; byte-at-a-time FNV-1a was still 4% of opening one.
/// Collisions only cost time.
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    /// The hash of `words`, a word at a time, then mixed once more so that
    /// its high bits see every word (for hashes compared whole, not
    /// bucketed).
    pub(crate) fn of_words(words: &[u64]) -> u64 {
        let mut k = KeyHasher::default();
        words.iter().for_each(|&w| k.add(w));
        (k.0 ^ (k.0 >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9)
    }
}

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let mut last = [0u8; 8];
        let rest = words.remainder();
        last[..rest.len()].copy_from_slice(rest);
        // The length is mixed in with the last word: "ab" and "ab\0" differ.
        self.add(u64::from_le_bytes(last) ^ ((bytes.len() as u64) << 56));
    }

    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }

    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher::default()
    }
}
