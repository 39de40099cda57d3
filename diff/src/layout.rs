//! Declared layouts, reconciled before the diff compares.
//!
//! Engines may lay out a stage's width differently and both be right: Hugging
//! Face transformers pairs the rotary dimensions of a head half-split
//! (`i`, `i + head_dim/2`), GGUF and llama.cpp interleaved (`2i`, `2i + 1`).
//! A stage of the manifest's vocabulary declares its layout
//! (`{"rotary": "half_split", "head_dim": 64}`; none means the reference,
//! interleaved). Where the trees of one comparison declare different
//! layouts for a stage, [`reconcile`] presents each tree in the reference
//! layout: its taps of that stage are permuted as they are read, and their
//! hashes marked so that no permuted tap is taken for equal by hash to an
//! unpermuted one. A layout the diff does not know is an error, never a
//! silent comparison in two orders.

use crate::tree::{Tensor, Tree};
use crate::Error;
use capture::{Manifest, StageSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The rotary pair order within each head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotary {
    /// Pairs `(2i, 2i + 1)`: GGUF, llama.cpp, taptree's forwards.
    Interleaved,
    /// Pairs `(i, i + head_dim / 2)`: Hugging Face transformers.
    HalfSplit {
        /// Size of one head: a pair's two halves are `head_dim / 2` apart.
        head_dim: usize,
    },
}

/// A stage's declared layout, as far as the diff reconciles it.
pub fn rotary(spec: &StageSpec, path: &Path) -> Result<Rotary, Error> {
    let bad = |reason: String| Error::Layout {
        path: path.to_path_buf(),
        stage: spec.name.clone(),
        reason,
    };
    for key in spec.layout.keys() {
        if key != "rotary" && key != "head_dim" {
            return Err(bad(format!(
                "unknown layout field {key:?} (this diff reconciles rotary and head_dim)"
            )));
        }
    }
    let head_dim = match spec.layout.get("head_dim") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&d| d >= 2 && d % 2 == 0)
                .ok_or_else(|| bad(format!("head_dim {v}: expected an even number >= 2")))?
                as usize,
        ),
    };
    match spec.layout.get("rotary").map(|v| v.as_str()) {
        None | Some(Some("interleaved")) => Ok(Rotary::Interleaved),
        Some(Some("half_split")) => match head_dim {
            Some(head_dim) => Ok(Rotary::HalfSplit { head_dim }),
            None => Err(bad("rotary half_split without head_dim".into())),
        },
        Some(_) => Err(bad(format!(
            "rotary {}: expected \"interleaved\" or \"half_split\"",
            spec.layout["rotary"]
        ))),
    }
}

/// Rewrites one row from half-split to interleaved pair order, in place
/// into `out`: within each head, element `j * head_dim/2 + i` goes to
/// `2i + j`.
pub fn interleave_row(row: &[u8], elem: usize, head_dim: usize, out: &mut Vec<u8>) {
    let half = head_dim / 2;
    let heads = row.len() / elem / head_dim;
    let start = out.len();
    out.resize(start + row.len(), 0);
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = (h * head_dim + j * half + i) * elem;
                let dst = start + (h * head_dim + 2 * i + j) * elem;
                out[dst..dst + elem].copy_from_slice(&row[src..src + elem]);
            }
        }
    }
}

/// A tree presented in the reference layout.
pub struct Reconciled<'t> {
    inner: &'t dyn Tree,
    manifest: Manifest,
    /// Per entry: the head size to interleave with, if it is permuted.
    permute: Vec<Option<usize>>,
}

impl Tree for Reconciled<'_> {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        let t = self.inner.read(index)?;
        let Some(head_dim) = self.permute[index] else {
            return Ok(t);
        };
        let e = &self.manifest.entries[index];
        let width: usize = e.shape.iter().skip(1).product::<usize>() * e.dtype.size();
        let mut out = Vec::with_capacity(t.bytes().len());
        for row in t.bytes().chunks_exact(width.max(1)) {
            interleave_row(row, e.dtype.size(), head_dim, &mut out);
        }
        Ok(Tensor::Owned(out))
    }
}

/// Each tree in the reference layout where the trees disagree on a stage's
/// declared layout (`None`: the tree is compared as it is).
pub fn reconcile<'t>(trees: &[&'t dyn Tree]) -> Result<Vec<Option<Reconciled<'t>>>, Error> {
    // Declared layouts, per tree, by stage.
    let mut declared: Vec<BTreeMap<String, Rotary>> = Vec::new();
    for t in trees {
        let mut m = BTreeMap::new();
        for spec in &t.head().stages {
            m.insert(spec.name.clone(), rotary(spec, t.path())?);
        }
        declared.push(m);
    }
    let stages: BTreeSet<&String> = declared.iter().flat_map(|m| m.keys()).collect();
    // A stage whose trees declare different layouts, a half-split of
    // another head size included: each tree's half-split taps of it are
    // put in interleaved order, each with its own head size.
    let differ: BTreeSet<String> = stages
        .into_iter()
        .filter(|s| {
            let kinds: BTreeSet<Option<usize>> = declared
                .iter()
                .map(|m| match m.get(*s) {
                    Some(Rotary::HalfSplit { head_dim }) => Some(*head_dim),
                    _ => None,
                })
                .collect();
            kinds.len() > 1
        })
        .cloned()
        .collect();
    let mut out = Vec::new();
    for (t, layouts) in trees.iter().zip(&declared) {
        let to_fix: BTreeMap<&String, usize> = layouts
            .iter()
            .filter(|(s, _)| differ.contains(*s))
            .filter_map(|(s, r)| match r {
                Rotary::HalfSplit { head_dim } => Some((s, *head_dim)),
                Rotary::Interleaved => None,
            })
            .collect();
        if to_fix.is_empty() {
            out.push(None);
            continue;
        }
        let mut manifest = t.manifest().clone();
        let mut permute = vec![None; manifest.entries.len()];
        let mut touched_dirs = BTreeSet::new();
        for (i, e) in manifest.entries.iter_mut().enumerate() {
            let Some(&head_dim) = to_fix.get(&e.key.stage) else {
                continue;
            };
            let width: usize = e.shape.iter().skip(1).product();
            if e.shape.len() < 2 || !width.is_multiple_of(head_dim) {
                return Err(Error::Layout {
                    path: t.path().to_path_buf(),
                    stage: e.key.stage.clone(),
                    reason: format!(
                        "tap {} has shape {:?}: its width is not a multiple of head_dim {head_dim}",
                        e.key, e.shape
                    ),
                });
            }
            permute[i] = Some(head_dim);
            // A permuted tap is equal by hash only to one permuted alike.
            e.blake3.push_str("+interleaved");
            touched_dirs.insert(e.dir());
        }
        // Nor is the whole tree identical to an unpermuted one by its root.
        manifest.root.push_str("+interleaved");
        for d in touched_dirs {
            if let Some(h) = manifest.dirs.get_mut(&d) {
                h.push_str("+interleaved");
            }
        }
        for spec in &mut manifest.stages {
            if to_fix.contains_key(&spec.name) {
                spec.layout.insert("rotary".into(), "interleaved".into());
            }
        }
        out.push(Some(Reconciled {
            inner: *t,
            manifest,
            permute,
        }));
    }
    Ok(out)
}

/// The stages whose declared layouts were reconciled, for the report.
pub fn reconciled_stages(trees: &[Option<Reconciled>]) -> Vec<String> {
    let mut s: BTreeSet<String> = BTreeSet::new();
    for r in trees.iter().flatten() {
        for (i, p) in r.permute.iter().enumerate() {
            if p.is_some() {
                s.insert(r.manifest.entries[i].key.stage.clone());
            }
        }
    }
    s.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_split_rows_interleave_as_llama_cpp_permutes_weights() {
        // Two heads of 4: half-split [a0 a1 b0 b1] pairs (a0,b0), (a1,b1).
        let row: Vec<u8> = (0u8..8).collect();
        let mut out = Vec::new();
        interleave_row(&row, 1, 4, &mut out);
        assert_eq!(out, [0, 2, 1, 3, 4, 6, 5, 7]);
        let wide: Vec<u8> = (0u8..8).collect();
        let mut out = Vec::new();
        interleave_row(&wide, 2, 4, &mut out);
        assert_eq!(out, [0, 1, 4, 5, 2, 3, 6, 7]);
    }
}
