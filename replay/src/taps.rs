//! A tree's taps in memory, by (stage, layer, slot), one row per position,
//! widened to f64 (exactly, for every float dtype) and in the model's own
//! rotary order.
//!
//! Replay reads an op's inputs by position, wherever they were captured: a
//! decode step's attention reads the keys of the prefill tap and of every
//! earlier decode tap. A stage declared `rotary: half_split` (Hugging
//! Face's layout) is put in interleaved order as it is read, as the diff
//! reconciles it ([`diff::layout`]), when the model's RoPE is interleaved
//! (llama's GGUF, whose Q/K rows the converter permuted); for a model whose
//! RoPE pairs halves (Gemma 3) half-split is its own order.

use crate::Error;
use diff::layout::Rotary;
use diff::Tree;
use kernels::cpu::Real;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Which stage, layer and slot a row belongs to.
pub type Id = (String, Option<u32>, Option<u32>);

/// One (stage, layer, slot): `width` values per position, for the
/// positions its taps hold: runs of positions sorted by their first, each
/// with where its rows start in `rows`. The rows are the taps' own, not
/// one per position up to the last: a tree whose only tap holds position
/// 16,777,215 costs that tap's rows, not sixteen million before them.
#[derive(Debug, Clone)]
pub struct Plane {
    /// Values per position (per row).
    pub width: usize,
    rows: Vec<f64>,
    /// Disjoint, sorted by first position: the positions and the index in
    /// `rows` of their first value.
    runs: Vec<(Range<u32>, usize)>,
}

impl Plane {
    /// Where the rows of `pos` lie in `rows`, a run at a time (first value
    /// and number of values), or the first position no tap holds.
    fn spans(&self, pos: &Range<u32>) -> Result<Vec<Range<usize>>, u32> {
        let mut out = Vec::new();
        let mut p = pos.start;
        // The run that holds `p`, if any, is the last to start at or before it.
        let mut k = self.runs.partition_point(|(r, _)| r.start <= p);
        while p < pos.end {
            let Some((r, at)) = k.checked_sub(1).and_then(|k| self.runs.get(k)) else {
                return Err(p);
            };
            if !r.contains(&p) {
                return Err(p);
            }
            let n = r.end.min(pos.end) - p;
            let first = at + (p - r.start) as usize * self.width;
            out.push(first..first + n as usize * self.width);
            p += n;
            k += 1;
        }
        Ok(out)
    }
}

/// Every tap of a tree, by [`Id`].
#[derive(Debug, Clone, Default)]
pub struct Taps {
    tree: PathBuf,
    planes: HashMap<Id, Plane>,
    /// Stages whose taps were put in interleaved rotary order.
    pub reconciled: Vec<String>,
}

/// The name of a tap, as the diff writes keys: `L3/attn@0..7`, `logits@7..8`,
/// with `#s` for a slot.
pub fn name(stage: &str, layer: Option<u32>, slot: Option<u32>, pos: &Range<u32>) -> String {
    let layer = layer.map(|l| format!("L{l}/")).unwrap_or_default();
    let slot = slot.map(|s| format!("#{s}")).unwrap_or_default();
    let at = if pos.len() == 1 {
        format!("@{}", pos.start)
    } else {
        format!("@{}..{}", pos.start, pos.end)
    };
    format!("{layer}{stage}{at}{slot}")
}

/// Within each head, element `j * head_dim/2 + i` moves to `2i + j`.
fn interleave(row: &mut [f64], head_dim: usize, scratch: &mut Vec<f64>) {
    let half = head_dim / 2;
    for head in row.chunks_exact_mut(head_dim) {
        scratch.clear();
        scratch.extend_from_slice(head);
        for i in 0..half {
            head[2 * i] = scratch[i];
            head[2 * i + 1] = scratch[half + i];
        }
    }
}

impl Taps {
    /// Reads every tap of `tree`. `halves`: the model's RoPE pairs halves, so
    /// a half-split declaration is its own order.
    pub fn load(tree: &dyn Tree, halves: bool) -> Result<Taps, Error> {
        let m = tree.manifest();
        let mut permute: HashMap<&str, usize> = HashMap::new();
        let mut reconciled = Vec::new();
        for spec in &m.stages {
            if let Rotary::HalfSplit { head_dim } = diff::layout::rotary(spec, tree.path())? {
                if !halves {
                    permute.insert(spec.name.as_str(), head_dim);
                    reconciled.push(spec.name.clone());
                }
            }
        }
        let mut taps = Taps {
            tree: tree.path().to_path_buf(),
            planes: HashMap::new(),
            reconciled,
        };
        let mut scratch = Vec::new();
        for (i, e) in m.entries.iter().enumerate() {
            let k = &e.key;
            let width: usize = e.shape.iter().skip(1).product();
            let mut values = diff::metrics::decode(tree.read(i)?.bytes(), e.dtype);
            if let Some(&head_dim) = permute.get(k.stage.as_str()) {
                if !width.is_multiple_of(head_dim) {
                    return Err(Error::Shape {
                        tree: taps.tree.clone(),
                        tap: name(&k.stage, k.layer, k.slot, &(k.pos.start..k.pos.end)),
                        width,
                        want: head_dim,
                        why: "not whole heads of its declared head_dim".into(),
                    });
                }
                // A tap of no width has no rows to reorder.
                for row in values.chunks_exact_mut(width.max(1)) {
                    interleave(row, head_dim, &mut scratch);
                }
            }
            taps.insert(
                (k.stage.clone(), k.layer, k.slot),
                k.pos.start..k.pos.end,
                width,
                &values,
            )?;
        }
        Ok(taps)
    }

    /// Stores `values` (`[pos.len(), width]`) at `pos` of `id`.
    fn insert(
        &mut self,
        id: Id,
        pos: Range<u32>,
        width: usize,
        values: &[f64],
    ) -> Result<(), Error> {
        let tap = name(&id.0, id.1, id.2, &pos);
        let plane = self.planes.entry(id).or_insert_with(|| Plane {
            width,
            rows: Vec::new(),
            runs: Vec::new(),
        });
        if plane.width != width {
            return Err(Error::Shape {
                tree: self.tree.clone(),
                tap,
                width,
                want: plane.width,
                why: "its other taps have that width".into(),
            });
        }
        // The runs before `k` start before `pos`: the last of them, or the
        // one at `k`, is the only one that can share a position with it.
        let k = plane.runs.partition_point(|(r, _)| r.start < pos.start);
        let before = k.checked_sub(1).map(|k| &plane.runs[k].0);
        let held = match (before, plane.runs.get(k)) {
            (Some(b), _) if b.end > pos.start => Some(pos.start),
            (_, Some((a, _))) if a.start < pos.end => Some(a.start),
            _ => None,
        };
        if let Some(p) = held {
            return Err(Error::DuplicatePosition {
                tree: self.tree.clone(),
                tap,
                pos: p,
            });
        }
        let at = plane.rows.len();
        plane.rows.extend_from_slice(&values[..pos.len() * width]);
        plane.runs.insert(k, (pos, at));
        Ok(())
    }

    /// Replaces the rows of `id` at `pos` (which it holds) with `values`:
    /// how a test plants a change and carries it downstream.
    pub fn overwrite(&mut self, id: &Id, pos: Range<u32>, values: &[f64]) {
        let plane = self
            .planes
            .get_mut(id)
            .expect("overwrite of a tap the tree holds");
        let spans = plane
            .spans(&pos)
            .expect("overwrite of positions the tree holds");
        let mut from = 0;
        for span in spans {
            let n = span.len();
            plane.rows[span].copy_from_slice(&values[from..from + n]);
            from += n;
        }
    }

    /// The rows of `id` at `pos`, as `T`, checked to be `want` wide.
    /// `for_tap` names the op that reads them, for the error.
    pub fn get<T: Real>(
        &self,
        id: (&str, Option<u32>, Option<u32>),
        pos: Range<u32>,
        want: usize,
        for_tap: &str,
    ) -> Result<Vec<T>, Error> {
        let (stage, layer, slot) = id;
        let missing = |p: u32| Error::MissingInput {
            tree: self.tree.clone(),
            tap: for_tap.to_string(),
            input: name(stage, layer, slot, &(p..p + 1)),
        };
        let plane = self
            .planes
            .get(&(stage.to_string(), layer, slot))
            .ok_or_else(|| missing(pos.start))?;
        let spans = plane.spans(&pos).map_err(missing)?;
        if plane.width != want {
            return Err(Error::Shape {
                tree: self.tree.clone(),
                tap: name(stage, layer, slot, &pos),
                width: plane.width,
                want,
                why: format!("as {for_tap} reads it"),
            });
        }
        Ok(spans
            .into_iter()
            .flat_map(|span| &plane.rows[span])
            .map(|v| T::from_f64(*v))
            .collect())
    }

    /// The tree these taps were read from.
    pub fn path(&self) -> &Path {
        &self.tree
    }
}
