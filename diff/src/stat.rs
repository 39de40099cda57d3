//! Statistics of one tree's taps: the evidence for quantization crushing.
//!
//! Per tap and position: min, max, mean, std, nonfinite and zero counts, the
//! dimensions of largest |x|, and per block (256 and 32 elements, the
//! activation-quantization block sizes) the ratio of the largest |x| to the
//! second largest. **Crushed rule**: a block is crushed when that ratio is at
//! least [`CRUSHED_RATIO`] (8): with 8-bit per-block quantization (scale =
//! max/127) every other value of the block then gets at most 127/8 ≈ 16
//! levels, 4 bits or less, and the small ones round to zero.

use crate::controls::At;
use crate::tree::Tree;
use crate::Error;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Largest-to-second-largest |x| ratio at which a block counts as crushed.
pub const CRUSHED_RATIO: f64 = 8.0;
/// Block sizes reported.
pub const BLOCKS: [usize; 2] = [256, 32];
/// Dimensions of largest |x| listed per position.
pub const TOP: usize = 4;

/// The statistics of a tree's taps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatReport {
    /// The tree's directory.
    pub path: String,
    /// The tree's root hash.
    pub root: String,
    /// The crushed rule in words.
    pub crushed_rule: String,
    /// One per tap, in forward order.
    pub taps: Vec<TapStat>,
}

/// One tap's statistics, one per position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TapStat {
    /// The tap's key (`L3/ffn_down@0..7`).
    pub key: String,
    /// Its dtype as safetensors spells it.
    pub dtype: String,
    /// Its shape; axis 0 the positions.
    pub shape: Vec<usize>,
    /// One per row (position).
    pub positions: Vec<PosStat>,
}

/// One position's statistics over its finite values.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PosStat {
    /// The token position.
    pub pos: u32,
    /// Finite values counted.
    pub n: usize,
    /// The smallest finite value (+∞ when there is none).
    pub min: f64,
    /// The largest finite value (−∞ when there is none).
    pub max: f64,
    /// Mean of the finite values.
    pub mean: f64,
    /// Standard deviation (population) of the finite values.
    pub std: f64,
    /// Values that are NaN or infinite.
    pub nonfinite: usize,
    /// Values that are exactly zero.
    pub zeros: usize,
    /// `(dimension, value)`, largest |value| first.
    pub top: Vec<(usize, f64)>,
    /// One per size of [`BLOCKS`].
    pub blocks: Vec<BlockStat>,
}

/// Per-block max/second-max statistics for one block size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlockStat {
    /// Elements per block.
    pub block: usize,
    /// Blocks in the row (a short last block counts).
    pub count: usize,
    /// Blocks that are crushed ([`CRUSHED_RATIO`]).
    pub crushed: usize,
    /// The largest ratio, its block index and the dimension holding the max.
    pub worst_ratio: f64,
    /// The index of the block with the largest ratio.
    pub worst_block: usize,
    /// The dimension holding that block's largest |x|.
    pub worst_dim: usize,
}

/// Statistics of every tap of `tree`, or only of the one `at` names.
pub fn stat(tree: &dyn Tree, at: Option<&At>) -> Result<StatReport, Error> {
    let m = tree.manifest();
    let selected: Vec<usize> = (0..m.entries.len())
        .filter(|&i| {
            let k = &m.entries[i].key;
            at.is_none_or(|at| at.holds(k))
        })
        .collect();
    if let (Some(at), true) = (at, selected.is_empty()) {
        // Named without its slot, as it was asked for.
        let key = At {
            slot: None,
            ..at.clone()
        };
        return Err(Error::NoSuchTap {
            path: tree.path().to_path_buf(),
            key: key.to_string(),
        });
    }
    let taps = selected
        .par_iter()
        .map(|&i| {
            let e = &m.entries[i];
            let t = tree.read(i)?;
            let values = crate::metrics::decode(t.bytes(), e.dtype);
            let rows = e.key.rows().max(1) as usize;
            let width = values.len() / rows;
            let positions = (0..rows)
                .map(|r| e.key.pos.start + r as u32)
                .filter(|p| at.and_then(|a| a.pos).is_none_or(|want| want == *p))
                .map(|p| {
                    let r = (p - e.key.pos.start) as usize;
                    pos_stat(p, &values[r * width..(r + 1) * width])
                })
                .collect();
            Ok(TapStat {
                key: e.key.to_string(),
                dtype: e.dtype.to_string(),
                shape: e.shape.clone(),
                positions,
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(StatReport {
        path: tree.path().display().to_string(),
        root: m.root.clone(),
        crushed_rule: format!(
            "a block is crushed when its largest |x| is at least {CRUSHED_RATIO} times its second largest"
        ),
        taps,
    })
}

/// Statistics of one row.
pub fn pos_stat(pos: u32, x: &[f64]) -> PosStat {
    let finite: Vec<f64> = x.iter().copied().filter(|v| v.is_finite()).collect();
    let n = finite.len();
    let mean = if n == 0 {
        f64::NAN
    } else {
        finite.iter().sum::<f64>() / n as f64
    };
    let var = if n == 0 {
        f64::NAN
    } else {
        finite.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64
    };
    let mut order: Vec<usize> = (0..x.len()).filter(|&i| x[i].is_finite()).collect();
    order.sort_by(|&i, &j| x[j].abs().total_cmp(&x[i].abs()).then(i.cmp(&j)));
    PosStat {
        pos,
        n: x.len(),
        min: finite.iter().copied().fold(f64::INFINITY, f64::min),
        max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mean,
        std: var.sqrt(),
        nonfinite: x.len() - n,
        zeros: x.iter().filter(|v| **v == 0.0).count(),
        top: order.iter().take(TOP).map(|&i| (i, x[i])).collect(),
        blocks: BLOCKS.iter().map(|&b| blocks(x, b)).collect(),
    }
}

/// Max/second-max ratio of each `block`-sized block (a short last block
/// counts as a block). A block whose second largest |x| is 0 while its
/// largest is not has an infinite ratio: it is crushed.
pub fn blocks(x: &[f64], block: usize) -> BlockStat {
    let mut s = BlockStat {
        block,
        count: 0,
        crushed: 0,
        worst_ratio: 0.0,
        worst_block: 0,
        worst_dim: 0,
    };
    for (bi, chunk) in x.chunks(block).enumerate() {
        s.count += 1;
        let (mut first, mut second, mut at) = (0.0f64, 0.0f64, 0usize);
        for (i, v) in chunk.iter().enumerate() {
            let a = if v.is_finite() { v.abs() } else { 0.0 };
            if a > first {
                second = first;
                first = a;
                at = i;
            } else if a > second {
                second = a;
            }
        }
        let ratio = if first == 0.0 {
            1.0
        } else if second == 0.0 {
            f64::INFINITY
        } else {
            first / second
        };
        if ratio >= CRUSHED_RATIO {
            s.crushed += 1;
        }
        if ratio > s.worst_ratio {
            s.worst_ratio = ratio;
            s.worst_block = bi;
            s.worst_dim = bi * block + at;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_massive_value_crushes_its_block_and_only_it() {
        let mut x: Vec<f64> = (0..512)
            .map(|i| ((i % 7) as f64 - 3.0) * 0.5 + 0.1)
            .collect();
        x[300] = -3664.0;
        let s = blocks(&x, 256);
        assert_eq!(
            (s.count, s.crushed, s.worst_block, s.worst_dim),
            (2, 1, 1, 300)
        );
        assert!(s.worst_ratio > 1000.0);
        let s32 = blocks(&x, 32);
        assert_eq!((s32.count, s32.crushed, s32.worst_dim), (16, 1, 300));
    }

    #[test]
    fn ratio_just_below_the_rule_is_not_crushed() {
        let mut x = vec![1.0; 256];
        x[5] = 7.99;
        assert_eq!(blocks(&x, 256).crushed, 0);
        x[5] = 8.0;
        assert_eq!(blocks(&x, 256).crushed, 1);
    }

    #[test]
    fn row_statistics() {
        let s = pos_stat(3, &[1.0, -2.0, 3.0, f64::NAN, 0.0]);
        assert_eq!((s.min, s.max, s.nonfinite, s.zeros), (-2.0, 3.0, 1, 1));
        assert_eq!(s.mean, 0.5);
        assert_eq!(s.top[0], (2, 3.0));
        assert_eq!(s.top[1], (1, -2.0));
    }
}
