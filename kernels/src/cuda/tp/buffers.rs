//! A rank's device buffers: its activations and its KV cache of a slot.

use cudarc::driver::CudaSlice;

use crate::cpu::tp::plan::RankPlan;
use crate::cuda::device::Device;
use crate::cuda::ops::QuantizedActs;
use crate::cuda::CudaError;
use model::LlamaConfig;

/// One rank's keys and values of one slot: `[n_layer, kv_held, capacity,
/// head_dim]` each, a KV head's positions contiguous.
pub(super) struct RankCache {
    pub capacity: usize,
    pub k: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
}

/// One rank's activations for up to `rows` rows; widths are the rank's.
pub(super) struct Scratch {
    pub rows: usize,
    pub x: CudaSlice<f32>,
    pub x2: CudaSlice<f32>,
    pub h: CudaSlice<f32>,
    pub q: CudaSlice<f32>,
    pub q2: CudaSlice<f32>,
    pub k: CudaSlice<f32>,
    pub k2: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    pub att: CudaSlice<f32>,
    /// o_proj's partial sum, then (after the all-reduce) the sum.
    pub o: CudaSlice<f32>,
    pub g: CudaSlice<f32>,
    pub u: CudaSlice<f32>,
    pub s: CudaSlice<f32>,
    /// ffn_down's partial sum, then the sum.
    pub dn: CudaSlice<f32>,
    pub logits: CudaSlice<f32>,
    pub qa: QuantizedActs,
    pub pos: CudaSlice<u32>,
    pub tok: CudaSlice<u32>,
    /// Attention's gathers: a group's queries and outputs, one KV head's
    /// keys and values.
    pub qg: CudaSlice<f32>,
    pub ag: CudaSlice<f32>,
    pub kj: CudaSlice<f32>,
    pub vj: CudaSlice<f32>,
}

impl Scratch {
    pub fn alloc(
        dev: &Device,
        c: &LlamaConfig,
        p: &RankPlan,
        rows: usize,
        rank: usize,
    ) -> Result<Scratch, CudaError> {
        let s = dev.stream();
        let a = |n: usize| {
            s.alloc_zeros::<f32>(rows * n.max(1))
                .map_err(|e| CudaError::driver("alloc activations", e))
        };
        let u = || {
            s.alloc_zeros::<u32>(rows)
                .map_err(|e| CudaError::driver("alloc tokens", e))
        };
        let (d, hd) = (c.n_embd, c.head_dim);
        let (qw, kvw, ff) = (p.heads.len() * hd, p.kv_held.len() * hd, p.ffn.len());
        let widest = d.max(qw).max(ff);
        Ok(Scratch {
            rows,
            x: a(d)?,
            x2: a(d)?,
            h: a(d)?,
            q: a(qw)?,
            q2: a(qw)?,
            k: a(kvw)?,
            k2: a(kvw)?,
            v: a(kvw)?,
            att: a(qw)?,
            o: a(d)?,
            g: a(ff)?,
            u: a(ff)?,
            s: a(ff)?,
            dn: a(d)?,
            logits: a(if rank == 0 { c.vocab_size } else { 1 })?,
            qa: QuantizedActs::alloc(dev, rows * widest.div_ceil(32) * 32)?,
            pos: u()?,
            tok: u()?,
            qg: a(qw)?,
            ag: a(qw)?,
            kj: a(hd)?,
            vj: a(hd)?,
        })
    }
}
