//! A rank's attention: per KV head it holds, over the query heads of the
//! rank that read it (an uneven split does not group a rank's heads evenly:
//! SmolLM2's rank 0 of 2 holds heads 0..4, three reading KV head 0 and one
//! KV head 1), each group gathered into buffers of its own so the one-GPU
//! attention kernel runs on it unchanged, as the CPU tensor-parallel
//! forward calls its attention per KV head.

use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::buffers::{RankCache, Scratch};
use super::Half;
use crate::cpu::tp::plan::RankPlan;
use crate::cuda::device::Device;
use crate::cuda::ops::{self, AttentionShape};
use crate::cuda::CudaError;
use model::LlamaConfig;

/// Copies columns `cols` of `rows` rows of `src` (`width` wide) to `dst`
/// (`cols.len()` wide), or back with `scatter`: a row at a time.
fn columns(
    dev: &Device,
    src: &CudaSlice<f32>,
    dst: &mut CudaSlice<f32>,
    rows: usize,
    width: usize,
    cols: Range<usize>,
    scatter: bool,
) -> Result<(), CudaError> {
    let (s, n) = (dev.stream(), cols.len());
    let e = |e| CudaError::driver("attention gather", e);
    if n == width {
        return s
            .memcpy_dtod(&src.slice(..rows * n), &mut dst.slice_mut(..rows * n))
            .map_err(e);
    }
    for r in 0..rows {
        let wide = r * width + cols.start..r * width + cols.end;
        let narrow = r * n..(r + 1) * n;
        if scatter {
            s.memcpy_dtod(&src.slice(narrow), &mut dst.slice_mut(wide))
                .map_err(e)?;
        } else {
            s.memcpy_dtod(&src.slice(wide), &mut dst.slice_mut(narrow))
                .map_err(e)?;
        }
    }
    Ok(())
}

/// Writes the run's keys and values to `cache` and attends every query
/// head of the rank over them, into `sc.att`.
pub(super) fn attend(
    dev: &Device,
    c: &LlamaConfig,
    p: &RankPlan,
    half: &Half,
    sc: &mut Scratch,
    cache: &mut RankCache,
    window: Option<usize>,
) -> Result<(), CudaError> {
    let (hd, rows, g) = (c.head_dim, half.at.rows, half.group);
    let (qw, kvw, held) = (p.heads.len() * hd, p.kv_held.len() * hd, p.kv_held.len());
    let cap = cache.capacity;
    for (j, kvh) in p.kv_held.clone().enumerate() {
        let head = (half.l * held + j) * cap * hd..(half.l * held + j + 1) * cap * hd;
        columns(
            dev,
            &sc.k,
            &mut sc.kj,
            rows,
            kvw,
            j * hd..(j + 1) * hd,
            false,
        )?;
        columns(
            dev,
            &sc.v,
            &mut sc.vj,
            rows,
            kvw,
            j * hd..(j + 1) * hd,
            false,
        )?;
        let pos = sc.pos.slice(..rows);
        ops::kv_write(
            dev,
            &sc.kj.slice(..rows * hd),
            &sc.vj.slice(..rows * hd),
            &mut cache.k.slice_mut(head.clone()),
            &mut cache.v.slice_mut(head.clone()),
            &pos,
            hd,
        )?;
        let hs = p.heads.start.max(kvh * g)..p.heads.end.min((kvh + 1) * g);
        let local = (hs.start - p.heads.start) * hd..(hs.end - p.heads.start) * hd;
        let n = local.len();
        columns(dev, &sc.q, &mut sc.qg, rows, qw, local.clone(), false)?;
        ops::attention_at(
            dev,
            &sc.qg.slice(..rows * n),
            &cache.k.slice(head.clone()),
            &cache.v.slice(head),
            &mut sc.ag.slice_mut(..rows * n),
            &pos,
            AttentionShape {
                rows,
                pos0: half.start,
                n_head: hs.len(),
                n_kv: 1,
                head_dim: hd,
            },
            window,
            half.start + rows,
        )?;
        columns(dev, &sc.ag, &mut sc.att, rows, qw, local, true)?;
    }
    Ok(())
}

/// A rank's cache of `capacity` positions, holding the first `keep.0`
/// positions of the old cache `keep.1`.
pub(super) fn grow_cache(
    dev: &Device,
    c: &LlamaConfig,
    p: &RankPlan,
    capacity: usize,
    keep: Option<(usize, &RankCache)>,
) -> Result<RankCache, CudaError> {
    let (hd, heads) = (c.head_dim, c.n_layer * p.kv_held.len());
    let s = dev.stream();
    let alloc = || {
        s.alloc_zeros::<f32>(heads * capacity * hd)
            .map_err(|e| CudaError::driver("alloc KV cache", e))
    };
    let (mut k, mut v) = (alloc()?, alloc()?);
    if let Some((len, old)) = keep {
        let n = len * hd;
        let e = |e| CudaError::driver("grow KV cache", e);
        for h in 0..heads {
            let (src, dst) = (h * old.capacity * hd, h * capacity * hd);
            s.memcpy_dtod(&old.k.slice(src..src + n), &mut k.slice_mut(dst..dst + n))
                .map_err(e)?;
            s.memcpy_dtod(&old.v.slice(src..src + n), &mut v.slice_mut(dst..dst + n))
                .map_err(e)?;
        }
    }
    Ok(RankCache { capacity, k, v })
}
