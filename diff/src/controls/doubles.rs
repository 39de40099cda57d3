//! The controls' doubles: a tree equal to another, held in memory, with
//! its hashes hidden (SELF) or one row of one tap changed (PERTURBED). The
//! controls never write a copy of the user's tree.

use crate::tree::{Tensor, Tree};
use capture::Manifest;
use std::path::Path;

/// A tree equal to `inner`, held in memory, with its hashes hidden (every
/// tensor must then be read: SELF) or with one row of one tap changed so
/// that no sensible tolerance accepts it (PERTURBED): every element `x`
/// becomes `-x - s`, `s` one more than the row's largest magnitude.
pub struct Tweaked<'a> {
    inner: &'a dyn Tree,
    manifest: Manifest,
    planted: Option<(usize, usize)>,
}

impl<'a> Tweaked<'a> {
    /// Every entry's hash replaced, so nothing is skipped as equal.
    pub fn unhashed(inner: &'a dyn Tree) -> Tweaked<'a> {
        let mut manifest = inner.manifest().clone();
        for e in &mut manifest.entries {
            e.blake3 = format!("unhashed:{}", e.blake3);
        }
        manifest.root = format!("unhashed:{}", manifest.root);
        manifest.dirs.clear();
        Tweaked {
            inner,
            manifest,
            planted: None,
        }
    }

    /// Row `row` of entry `entry` changed; only that entry's hash differs.
    pub fn perturbed(inner: &'a dyn Tree, entry: usize, row: usize) -> Tweaked<'a> {
        let mut manifest = inner.manifest().clone();
        let e = &mut manifest.entries[entry];
        e.blake3 = format!("perturbed:{}", e.blake3);
        manifest.root = format!("perturbed:{}", manifest.root);
        manifest.dirs.clear();
        Tweaked {
            inner,
            manifest,
            planted: Some((entry, row)),
        }
    }
}

impl Tree for Tweaked<'_> {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        let t = self.inner.read(index)?;
        let Some((entry, row)) = self.planted.filter(|(e, _)| *e == index) else {
            return Ok(t);
        };
        let e = &self.manifest.entries[entry];
        let mut bytes = t.bytes().to_vec();
        let rows = e.shape.first().copied().unwrap_or(1).max(1);
        let row_len = bytes.len() / rows;
        perturb(&mut bytes[row * row_len..(row + 1) * row_len], e.dtype);
        Ok(Tensor::Owned(bytes))
    }
}

/// Rewrites `row` (raw bytes of `dtype`) as `-x - s`, `s = 1 + max |x|`
/// (nonfinite values become 1, so a NaN row changes too).
fn perturb(row: &mut [u8], dtype: capture::DType) {
    use capture::DType::*;
    let values = crate::metrics::decode(row, dtype);
    let s = 1.0
        + values
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()));
    let size = dtype.size();
    for (chunk, &x) in row.chunks_exact_mut(size).zip(&values) {
        let y = if x.is_finite() { -x - s } else { 1.0 };
        match dtype {
            F32 => chunk.copy_from_slice(&(y as f32).to_le_bytes()),
            F64 => chunk.copy_from_slice(&y.to_le_bytes()),
            F16 => chunk.copy_from_slice(&half::f16::from_f64(y).to_le_bytes()),
            BF16 => chunk.copy_from_slice(&half::bf16::from_f64(y).to_le_bytes()),
            I8 => chunk.copy_from_slice(&((x as i64 as i8).wrapping_add(64)).to_le_bytes()),
            I32 => chunk.copy_from_slice(&((x as i64 as i32).wrapping_add(1 << 20)).to_le_bytes()),
        }
    }
}
