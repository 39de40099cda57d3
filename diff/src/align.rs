//! `--align N`: compare position `p` of A with position `p + N` of B.
//!
//! Engines that agree on every op may still be fed one token more: an extra
//! BOS on one side shifts every position by one, and comparing position by
//! position would compare different inputs. [`Shifted`] presents a tree with
//! its first `n` positions dropped and the rest renumbered from 0, input
//! tokens included, so the inputs check and the walk see the two runs
//! aligned. A tap cut by the shift gets a marked hash, so it is never taken
//! for equal by hash to an uncut one.

use crate::tree::{Tensor, Tree};
use capture::Manifest;
use std::path::Path;

/// A tree whose first `n` positions are left out.
pub struct Shifted<'t> {
    inner: &'t dyn Tree,
    manifest: Manifest,
    /// Per entry of the shifted manifest: the inner entry and the rows it skips.
    source: Vec<(usize, usize)>,
}

impl<'t> Shifted<'t> {
    /// `inner` with its first `n` positions dropped and the rest renumbered from 0.
    pub fn new(inner: &'t dyn Tree, n: u32) -> Shifted<'t> {
        let mut manifest = inner.manifest().clone();
        let entries = std::mem::take(&mut manifest.entries);
        let mut source = Vec::with_capacity(entries.len());
        for (i, mut e) in entries.into_iter().enumerate() {
            if e.key.pos.end <= n {
                continue;
            }
            let skip = n.saturating_sub(e.key.pos.start);
            if skip > 0 {
                let per_row = e.bytes / u64::from(e.key.pos.end - e.key.pos.start);
                e.shape[0] = e.shape[0].saturating_sub(skip as usize);
                e.bytes -= per_row * u64::from(skip);
                e.blake3 = format!("{}-{skip}rows", e.blake3);
            }
            e.key.pos = e.key.pos.start + skip - n..e.key.pos.end - n;
            manifest.entries.push(e);
            source.push((i, skip as usize));
        }
        // Keys moved: no directory hash of the original stands for them,
        // nor its root (the first 12 characters, shown, stay the original's).
        manifest.root = format!("{}-aligned{n}", manifest.root);
        for h in manifest.dirs.values_mut() {
            *h = format!("{h}-aligned{n}");
        }
        let run = &mut manifest.run;
        let drop = |v: &mut Vec<u32>| {
            v.drain(..(n as usize).min(v.len()));
        };
        drop(&mut run.prompt_tokens);
        if let Some(slots) = run.extra.get_mut("slots").and_then(|s| s.as_array_mut()) {
            for s in slots.iter_mut() {
                if let Some(a) = s.as_array_mut() {
                    a.drain(..(n as usize).min(a.len()));
                }
            }
        }
        Shifted {
            inner,
            manifest,
            source,
        }
    }
}

impl Tree for Shifted<'_> {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        let (i, skip) = self.source[index];
        let t = self.inner.read(i)?;
        if skip == 0 {
            return Ok(t);
        }
        let e = &self.manifest.entries[index];
        let row = e.bytes as usize / e.shape[0].max(1);
        Ok(Tensor::Owned(t.bytes()[skip * row..].to_vec()))
    }
}
