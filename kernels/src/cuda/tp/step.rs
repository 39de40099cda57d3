//! One forward call over every rank, in the CPU tensor-parallel forward's
//! order: embedding, then per layer each rank's attention half, the
//! all-reduce of o_proj, the residual, each rank's FFN half, the
//! all-reduce of ffn_down, the residual; then rank 0's final norm and
//! logits. The taps go through [`At`].

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::buffers::{RankCache, Scratch};
use super::taps::At;
use super::weights::{RankLayer, RankWeights};
use super::{CudaTpForward, Half};
use crate::cpu::tp::plan::RankPlan;
use crate::cpu::tp::{FFN_DOWN_PARTIAL, O_PROJ_PARTIAL};
use crate::cuda::device::Device;
use crate::cuda::forward::encode::{gate_op, matmuls};
use crate::cuda::ops;
use crate::cuda::CudaError;
use crate::stages as st;
use crate::switches::Reduce;
use model::LlamaConfig;

/// One rank: its device, its share, its buffers.
pub(super) struct Rank {
    pub dev: Arc<Device>,
    pub plan: RankPlan,
    pub w: RankWeights,
    pub scratch: Option<Scratch>,
}

impl Half<'_> {
    fn norm(
        &self,
        dev: &Device,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        ops::rms_norm(
            dev,
            &x.as_view(),
            &w.as_view(),
            &mut y.slice_mut(..),
            self.at.rows,
            self.c.rms_eps,
        )
    }

    /// The residual add `out = x + y` (`[rows, n_embd]`), with the post norm
    /// of `y` first where the family has one (into `h`), tapped by rank 0.
    #[allow(clippy::too_many_arguments)]
    fn residual(
        &self,
        dev: &Device,
        post: (&Option<CudaSlice<f32>>, &str),
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        h: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        stage: &str,
    ) -> Result<(), CudaError> {
        let (d, rows, li) = (self.c.n_embd, self.at.rows, Some(self.l as u32));
        let tap = self.rank == 0;
        let y = match post.0 {
            Some(pn) => {
                self.norm(dev, y, pn, h)?;
                if tap {
                    self.at.full(dev, post.1, li, h, d)?;
                }
                &*h
            }
            None => y,
        };
        ops::add(
            dev,
            &x.as_view(),
            &y.as_view(),
            &mut out.slice_mut(..),
            rows * d,
        )?;
        if tap {
            self.at.full(dev, stage, li, out, d)?;
        }
        Ok(())
    }

    /// attn_norm, this rank's q/k/v, q/k norms, RoPE, attention and its
    /// o_proj partial sum (into `sc.o`).
    pub fn attention(
        &self,
        r: &mut Rank,
        cache: &mut RankCache,
        rope_base: f32,
        window: Option<usize>,
    ) -> Result<(), CudaError> {
        let (c, at, rows) = (self.c, self.at, self.at.rows);
        let (dev, p, lw) = (r.dev.clone(), &r.plan, &r.w.layers[self.l]);
        let sc = r.scratch.as_mut().expect("scratch allocated before a run");
        let (l, li, rank, hd) = (self.l, Some(self.l as u32), self.rank, c.head_dim);
        let (nq, nkv) = (p.heads.len(), p.kv_held.len());
        let (qw, kvw) = (nq * hd, nkv * hd);
        let q_place = || Some((p.heads.start * hd..p.heads.end * hd, c.n_head * hd));
        self.norm(&dev, &sc.x, &lw.attn_norm, &mut sc.h)?;
        if rank == 0 {
            at.full(&dev, st::ATTN_NORM, li, &sc.h, c.n_embd)?;
        }
        matmuls(
            &dev,
            &[&lw.wq, &lw.wk, &lw.wv],
            &sc.h,
            &mut [sc.q.slice_mut(..), sc.k.slice_mut(..), sc.v.slice_mut(..)],
            &mut sc.qa,
            rows,
            self.acts.attn,
        )?;
        let owned =
            (p.kv_owned.start - p.kv_held.start) * hd..(p.kv_owned.end - p.kv_held.start) * hd;
        let kv_place = || Some((p.kv_owned.start * hd..p.kv_owned.end * hd, c.n_head_kv * hd));
        at.ranked(&dev, st::Q_PROJ, l, rank, &sc.q, qw, 0..qw, q_place())?;
        at.ranked(
            &dev,
            st::K_PROJ,
            l,
            rank,
            &sc.k,
            kvw,
            owned.clone(),
            kv_place(),
        )?;
        at.ranked(
            &dev,
            st::V_PROJ,
            l,
            rank,
            &sc.v,
            kvw,
            owned.clone(),
            kv_place(),
        )?;
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            // One norm per head: rows of head_dim.
            ops::rms_norm(
                &dev,
                &sc.q.slice(..rows * qw),
                &qn.as_view(),
                &mut sc.q2.slice_mut(..rows * qw),
                rows * nq,
                c.rms_eps,
            )?;
            std::mem::swap(&mut sc.q, &mut sc.q2);
            at.ranked(&dev, st::Q_NORM, l, rank, &sc.q, qw, 0..qw, q_place())?;
            ops::rms_norm(
                &dev,
                &sc.k.slice(..rows * kvw),
                &kn.as_view(),
                &mut sc.k2.slice_mut(..rows * kvw),
                rows * nkv,
                c.rms_eps,
            )?;
            std::mem::swap(&mut sc.k, &mut sc.k2);
            at.ranked(
                &dev,
                st::K_NORM,
                l,
                rank,
                &sc.k,
                kvw,
                owned.clone(),
                kv_place(),
            )?;
        }
        ops::rope_qk_styled(
            &dev,
            c.family.rope,
            &mut sc.q.slice_mut(..rows * qw),
            &mut sc.k.slice_mut(..rows * kvw),
            &sc.pos.slice(..rows),
            nq,
            nkv,
            hd,
            rope_base,
        )?;
        at.ranked(&dev, st::Q_ROPE, l, rank, &sc.q, qw, 0..qw, q_place())?;
        at.ranked(&dev, st::K_ROPE, l, rank, &sc.k, kvw, owned, kv_place())?;
        super::attend::attend(&dev, c, p, self, sc, cache, window)?;
        at.ranked(&dev, st::ATTN, l, rank, &sc.att, qw, 0..qw, q_place())?;
        matmuls(
            &dev,
            &[&lw.wo],
            &sc.att,
            &mut [sc.o.slice_mut(..)],
            &mut sc.qa,
            rows,
            self.acts.attn,
        )?;
        at.ranked(
            &dev,
            O_PROJ_PARTIAL,
            l,
            rank,
            &sc.o,
            c.n_embd,
            0..c.n_embd,
            None,
        )
    }

    /// After the all-reduce: the post-attention norm and residual (`x2`).
    pub fn attention_residual(&self, r: &mut Rank) -> Result<(), CudaError> {
        let lw = &r.w.layers[self.l];
        let sc = r.scratch.as_mut().expect("allocated");
        let post = (&lw.post_attn_norm, st::POST_ATTN_NORM);
        self.residual(
            &r.dev,
            post,
            &sc.x,
            &sc.o,
            &mut sc.h,
            &mut sc.x2,
            st::POST_ATTN_RESIDUAL,
        )
    }

    /// ffn_norm, this rank's gate/up, the gated product and its ffn_down
    /// partial sum (into `sc.dn`).
    pub fn ffn(&self, r: &mut Rank) -> Result<(), CudaError> {
        let (c, at, rows) = (self.c, self.at, self.at.rows);
        let (dev, p, lw): (&Device, &RankPlan, &RankLayer) = (&r.dev, &r.plan, &r.w.layers[self.l]);
        let sc = r.scratch.as_mut().expect("allocated");
        let (l, li, rank, ff) = (self.l, Some(self.l as u32), self.rank, p.ffn.len());
        let place = || Some((p.ffn.clone(), c.n_ff));
        self.norm(dev, &sc.x2, &lw.ffn_norm, &mut sc.h)?;
        if rank == 0 {
            at.full(dev, st::FFN_NORM, li, &sc.h, c.n_embd)?;
        }
        matmuls(
            dev,
            &[&lw.w_gate, &lw.w_up],
            &sc.h,
            &mut [sc.g.slice_mut(..), sc.u.slice_mut(..)],
            &mut sc.qa,
            rows,
            self.acts.ffn_up,
        )?;
        at.ranked(dev, st::FFN_GATE, l, rank, &sc.g, ff, 0..ff, place())?;
        at.ranked(dev, st::FFN_UP, l, rank, &sc.u, ff, 0..ff, place())?;
        let (gate, stage) = gate_op(c.family.ffn);
        gate(
            dev,
            &sc.g.as_view(),
            &sc.u.as_view(),
            &mut sc.s.slice_mut(..),
            rows * ff,
        )?;
        at.ranked(dev, stage, l, rank, &sc.s, ff, 0..ff, place())?;
        matmuls(
            dev,
            &[&lw.w_down],
            &sc.s,
            &mut [sc.dn.slice_mut(..)],
            &mut sc.qa,
            rows,
            self.acts.ffn_down,
        )?;
        at.ranked(
            dev,
            FFN_DOWN_PARTIAL,
            l,
            rank,
            &sc.dn,
            c.n_embd,
            0..c.n_embd,
            None,
        )
    }

    /// After the all-reduce: the post-FFN norm and residual (back into `x`).
    pub fn ffn_residual(&self, r: &mut Rank) -> Result<(), CudaError> {
        let lw = &r.w.layers[self.l];
        let sc = r.scratch.as_mut().expect("allocated");
        let post = (&lw.post_ffn_norm, st::POST_FFN_NORM);
        self.residual(
            &r.dev,
            post,
            &sc.x2,
            &sc.dn,
            &mut sc.h,
            &mut sc.x,
            st::POST_FFN_RESIDUAL,
        )
    }
}

impl CudaTpForward {
    fn ensure(&mut self, slot: Option<u32>, rows: usize, start: usize) -> Result<(), CudaError> {
        let c = &self.config;
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            if rank.scratch.as_ref().is_none_or(|s| s.rows < rows) {
                let n = rows.next_power_of_two();
                rank.scratch = Some(Scratch::alloc(&rank.dev, c, &rank.plan, n, r)?);
            }
        }
        let needed = start + rows;
        let grow = match self.caches.get(&slot) {
            Some((_, caches)) => caches[0].capacity < needed,
            None => true,
        };
        if grow {
            let capacity = crate::cuda::forward::kv_capacity(c, needed);
            let old = self.caches.remove(&slot);
            let mut fresh = Vec::with_capacity(self.ranks.len());
            for (i, rank) in self.ranks.iter().enumerate() {
                let keep = old.as_ref().map(|(len, c)| (start.min(*len), &c[i]));
                fresh.push(super::attend::grow_cache(
                    &rank.dev, c, &rank.plan, capacity, keep,
                )?);
            }
            self.caches.insert(slot, (start, fresh));
        }
        Ok(())
    }

    /// Runs `tokens` of `slot` from `start` on every rank; the last row's logits.
    pub(super) fn run(
        &mut self,
        slot: Option<u32>,
        tokens: &[u32],
        start: usize,
    ) -> Result<Vec<f32>, CudaError> {
        let rows = tokens.len();
        self.ensure(slot, rows, start)?;
        let positions: Vec<u32> = (start as u32..(start + rows) as u32).collect();
        let at = At {
            pos: start as u32..(start + rows) as u32,
            slot,
            rows,
        };
        let c = self.config.clone();
        let d = c.n_embd;
        for rank in &mut self.ranks {
            let sc = rank.scratch.as_mut().expect("allocated");
            let s = rank.dev.stream();
            let up = |e| CudaError::driver("copy tokens to device", e);
            s.memcpy_htod(tokens, &mut sc.tok.slice_mut(..rows))
                .map_err(up)?;
            s.memcpy_htod(&positions, &mut sc.pos.slice_mut(..rows))
                .map_err(up)?;
            ops::embedding(
                &rank.dev,
                &rank.w.token_embd,
                &sc.tok.slice(..rows),
                &mut sc.x.slice_mut(..rows * d),
            )?;
            if c.family.embed_scale {
                let scale = (d as f64).sqrt() as f32;
                ops::scale(&rank.dev, &mut sc.x.slice_mut(..rows * d), scale, rows * d)?;
            }
        }
        at.full(
            &self.ranks[0].dev,
            st::EMBEDDING,
            None,
            &self.ranks[0].scratch.as_ref().expect("allocated").x,
            d,
        )?;
        let devs = self.rank_devices();
        let (acts, group) = (self.acts, self.plan.group);
        for l in 0..c.n_layer {
            let la = c.family.attention(l, c.rope_base);
            let half = |rank| Half {
                c: &c,
                acts,
                l,
                rank,
                group,
                start,
                at: &at,
            };
            let caches = &mut self.caches.get_mut(&slot).expect("ensured above").1;
            for (rank, (r, cache)) in self.ranks.iter_mut().zip(caches.iter_mut()).enumerate() {
                let half = half(rank);
                half.attention(r, cache, la.rope_base, la.window)?;
            }
            self.all_reduce(&devs, l, Reduce::OProj, rows * d, &at)?;
            for (rank, r) in self.ranks.iter_mut().enumerate() {
                let half = half(rank);
                half.attention_residual(r)?;
                half.ffn(r)?;
            }
            self.all_reduce(&devs, l, Reduce::FfnDown, rows * d, &at)?;
            for (rank, r) in self.ranks.iter_mut().enumerate() {
                let half = half(rank);
                half.ffn_residual(r)?;
            }
        }
        if let Some(e) = self.caches.get_mut(&slot) {
            e.0 = start + rows;
        }
        self.logits(&at, &c)
    }

    /// Adds the ranks' partial sums of `stage` in layer `l` and taps the sum.
    fn all_reduce(
        &mut self,
        devs: &[Arc<Device>],
        l: usize,
        stage: Reduce,
        n: usize,
        at: &At,
    ) -> Result<(), CudaError> {
        let skip = self
            .skip
            .filter(|s| s.layer == l && s.stage == stage)
            .map(|s| s.rank);
        let mut bufs: Vec<&mut CudaSlice<f32>> = self
            .ranks
            .iter_mut()
            .map(|r| {
                let sc = r.scratch.as_mut().expect("allocated");
                match stage {
                    Reduce::OProj => &mut sc.o,
                    Reduce::FfnDown => &mut sc.dn,
                }
            })
            .collect();
        self.reducer.all_reduce(devs, &mut bufs, n, skip)?;
        let name = match stage {
            Reduce::OProj => st::O_PROJ,
            Reduce::FfnDown => st::FFN_DOWN,
        };
        at.full(&devs[0], name, Some(l as u32), bufs[0], self.config.n_embd)
    }

    /// Rank 0's final norm and logits; the last row's logits.
    fn logits(&mut self, at: &At, c: &LlamaConfig) -> Result<Vec<f32>, CudaError> {
        let r = &mut self.ranks[0];
        let dev = r.dev.clone();
        let sc = r.scratch.as_mut().expect("allocated");
        let (norm, out) = r.w.output().expect("rank 0 holds the output");
        let rows = at.rows;
        ops::rms_norm(
            &dev,
            &sc.x.as_view(),
            &norm.as_view(),
            &mut sc.h.slice_mut(..),
            rows,
            c.rms_eps,
        )?;
        at.full(&dev, st::FINAL_NORM, None, &sc.h, c.n_embd)?;
        matmuls(
            &dev,
            &[out],
            &sc.h,
            &mut [sc.logits.slice_mut(..)],
            &mut sc.qa,
            rows,
            self.acts.logits,
        )?;
        at.full(&dev, st::LOGITS, None, &sc.logits, c.vocab_size)?;
        let v = c.vocab_size;
        ops::download(&dev, &sc.logits.slice((rows - 1) * v..rows * v))
    }
}
