//! What the diff reads: a manifest and tensor bytes by entry.
//!
//! [`capture::TreeReader`] is the tree on disk; the controls' doubles
//! ([`crate::controls::doubles`]) are trees held in
//! memory for the controls (they never write a copy of the user's tree).

use capture::{Entries, Manifest, TensorView, TreeReader};
use std::path::Path;

/// A tree the diff can walk.
pub trait Tree: Sync {
    /// The tree's directory (for messages and paths of its files).
    fn path(&self) -> &Path;
    /// The manifest: entries in capture (forward) order.
    fn manifest(&self) -> &Manifest;
    /// The manifest's fields besides its entries (which may be left empty
    /// here: read them through [`Tree::listing`]).
    fn head(&self) -> &Manifest {
        self.manifest()
    }
    /// The entries, field by field (a tree opened from its index's records
    /// reads them in place, without building owned entries).
    fn listing(&self) -> Entries<'_> {
        Entries::Owned(&self.manifest().entries)
    }
    /// The tensor bytes of entry `index` (capture order).
    fn read(&self, index: usize) -> Result<Tensor, capture::Error>;
}

/// Tensor bytes: mapped, read from a tap file (with its header), or owned.
pub enum Tensor {
    /// A mapped tap file.
    View(TensorView),
    /// A tap file read into a buffer (reused between reads).
    Read {
        /// The file's bytes.
        bytes: Vec<u8>,
        /// Where the tensor starts.
        start: usize,
        /// The tensor's length in bytes.
        len: usize,
    },
    /// Bytes built in memory (a control's double).
    Owned(Vec<u8>),
}

thread_local! {
    /// Read buffers to reuse: allocating one per tap had the kernel zero
    /// fresh pages for every file (a fifth of a mostly-equal diff's time).
    static BUFFERS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if let Tensor::Read { bytes, .. } = self {
            let buf = std::mem::take(bytes);
            BUFFERS.with(|b| {
                let mut b = b.borrow_mut();
                if b.len() < 4 {
                    b.push(buf);
                }
            });
        }
    }
}

impl Tensor {
    /// The tensor's raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Tensor::View(v) => v.bytes(),
            Tensor::Read { bytes, start, len } => &bytes[*start..*start + *len],
            Tensor::Owned(b) => b,
        }
    }
}

impl Tree for TreeReader {
    fn path(&self) -> &Path {
        TreeReader::path(self)
    }

    fn manifest(&self) -> &Manifest {
        TreeReader::manifest(self)
    }

    fn head(&self) -> &Manifest {
        TreeReader::head_fields(self)
    }

    fn listing(&self) -> Entries<'_> {
        TreeReader::listing(self)
    }

    /// One `read` into a buffer, not a map: a diff touches every byte once,
    /// and in a multi-threaded process each unmap of touched pages makes the
    /// kernel interrupt the other cores to flush their TLBs. The checks are
    /// the reader's ([`TreeReader::read_into`]).
    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        let entry = self.listing().entry(index);
        let mut bytes = BUFFERS.with(|b| b.borrow_mut().pop()).unwrap_or_default();
        let data = self.read_into(&entry, &mut bytes)?;
        Ok(Tensor::Read {
            bytes,
            start: data.start,
            len: data.len(),
        })
    }
}
