//! [`TensorBytes`]: a tensor's raw bytes, shared rather than copied.
//!
//! A GGUF loader hands out slices of one memory map of the file, so the
//! weights exist once in memory (the file's pages) however many holders —
//! the loaded [`crate::ModelWeights`], a CPU forward's prepared matrices —
//! keep them. Bytes built in memory (a converted safetensors tensor, a test
//! fixture) are held the same way behind an `Arc`. Cloning is cheap;
//! writing through [`std::ops::DerefMut`] copies the bytes first unless
//! they are owned and unshared (copy on write), so a map is never written.

use std::fmt;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

use memmap2::Mmap;

/// Immutable, cheaply cloned bytes of one tensor: a range of a shared memory
/// map or of a shared buffer.
#[derive(Clone)]
pub struct TensorBytes {
    owner: Owner,
    range: Range<usize>,
}

#[derive(Clone)]
enum Owner {
    Map(Arc<Mmap>),
    Vec(Arc<Vec<u8>>),
}

impl TensorBytes {
    /// The bytes `range` of `map`, which stays mapped while any slice of it lives.
    ///
    /// # Panics
    /// When `range` is not within the map.
    pub fn mapped(map: Arc<Mmap>, range: Range<usize>) -> TensorBytes {
        assert!(
            range.start <= range.end && range.end <= map.len(),
            "{range:?} is outside a map of {} bytes",
            map.len()
        );
        TensorBytes {
            owner: Owner::Map(map),
            range,
        }
    }

    /// Bytes `range` of these (relative to their start), sharing the same
    /// map or buffer: no copy.
    ///
    /// # Panics
    /// When `range` is not within these bytes.
    pub fn slice(&self, range: Range<usize>) -> TensorBytes {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "{range:?} is outside {} bytes",
            self.len()
        );
        let start = self.range.start;
        TensorBytes {
            owner: self.owner.clone(),
            range: start + range.start..start + range.end,
        }
    }

    /// Whether these bytes are a slice of a file's map (not a copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.owner, Owner::Map(_))
    }
}

impl From<Vec<u8>> for TensorBytes {
    fn from(v: Vec<u8>) -> TensorBytes {
        TensorBytes {
            range: 0..v.len(),
            owner: Owner::Vec(Arc::new(v)),
        }
    }
}

impl Deref for TensorBytes {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.owner {
            Owner::Map(m) => &m[self.range.clone()],
            Owner::Vec(v) => &v[self.range.clone()],
        }
    }
}

impl DerefMut for TensorBytes {
    /// Copies the bytes out of a map or a shared buffer first.
    fn deref_mut(&mut self) -> &mut [u8] {
        let whole_vec = matches!(&self.owner, Owner::Vec(v) if self.range == (0..v.len()));
        if !whole_vec {
            *self = TensorBytes::from(self.to_vec());
        }
        match &mut self.owner {
            Owner::Vec(v) => Arc::make_mut(v).as_mut_slice(),
            Owner::Map(_) => unreachable!("replaced by an owned copy above"),
        }
    }
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "TensorBytes({} bytes, {kind})", self.len())
    }
}

impl PartialEq for TensorBytes {
    fn eq(&self, other: &TensorBytes) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writing_copies_shared_bytes_and_leaves_the_other_holder_alone() {
        let a = TensorBytes::from(vec![1u8, 2, 3]);
        let mut b = a.clone();
        b[1] = 9;
        assert_eq!(&a[..], &[1, 2, 3]);
        assert_eq!(&b[..], &[1, 9, 3]);
    }

    #[test]
    fn a_mapped_slice_reads_the_file_and_writes_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes");
        std::fs::write(&path, [10u8, 11, 12, 13, 14]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private file of this test, not modified while mapped.
        let map = Arc::new(unsafe { Mmap::map(&file) }.unwrap());
        let s = TensorBytes::mapped(map, 1..4);
        assert!(s.is_mapped());
        assert_eq!(&s[..], &[11, 12, 13]);
        let sub = s.slice(1..3);
        assert!(sub.is_mapped());
        assert_eq!(&sub[..], &[12, 13]);
        let mut w = s.clone();
        w[0] = 0;
        assert!(!w.is_mapped());
        assert_eq!((&s[..], &w[..]), (&[11u8, 12, 13][..], &[0u8, 12, 13][..]));
        assert_eq!(std::fs::read(&path).unwrap(), [10, 11, 12, 13, 14]);
    }
}
