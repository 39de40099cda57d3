//! One forward over the simulated ranks: the replicated ops once, the
//! column-parallel ops per rank, each row-parallel matmul's per-rank
//! partial sums added by [`all_reduce`].

use super::plan::TpPlan;
use super::shard::RankLayer;
use super::{Reduce, TpSkip};
use crate::cpu::attention::{attention_windowed, Heads};
use crate::cpu::embedding::{embed, scale_embedding};
use crate::cpu::ffn::gated;
use crate::cpu::matmul::apply_group;
use crate::cpu::norm::rms_norm;
use crate::cpu::residual::add_residual;
use crate::cpu::rope::{rope_with, RopeTable};
use crate::cpu::weights::DenseWeights;
use crate::cpu::{forward::Acts, tap, Real};
use crate::stages as st;
use capture::{Shard, TapId};
use model::LlamaConfig;
use std::ops::Range;

/// The keys and values of one slot: per layer, per rank, per KV head it
/// holds, `[len, head_dim]`.
#[derive(Debug)]
pub(super) struct RankCache<T> {
    pub(super) len: usize,
    k: Vec<Vec<Vec<Vec<T>>>>,
    v: Vec<Vec<Vec<Vec<T>>>>,
}

impl<T: Real> RankCache<T> {
    pub(super) fn new(n_layer: usize, plan: &TpPlan) -> RankCache<T> {
        let per_rank = || {
            plan.ranks
                .iter()
                .map(|r| vec![Vec::new(); r.kv_held.len()])
                .collect::<Vec<_>>()
        };
        RankCache {
            len: 0,
            k: (0..n_layer).map(|_| per_rank()).collect(),
            v: (0..n_layer).map(|_| per_rank()).collect(),
        }
    }

    fn truncate(&mut self, len: usize, head_dim: usize) {
        self.len = len;
        for head in self
            .k
            .iter_mut()
            .chain(self.v.iter_mut())
            .flatten()
            .flatten()
        {
            head.truncate(len * head_dim);
        }
    }
}

/// What one forward call reads.
pub(super) struct Step<'a> {
    pub cfg: &'a LlamaConfig,
    pub w: &'a DenseWeights,
    pub ranks: &'a [Vec<RankLayer>],
    pub plan: &'a TpPlan,
    pub acts: Acts,
    pub skip: Option<TpSkip>,
    pub slot: Option<u32>,
    pub start: usize,
}

/// Columns `c` of `x` (`[n, width]`), as `[n, c.len()]`.
fn columns<T: Copy>(x: &[T], width: usize, c: Range<usize>) -> Vec<T> {
    x.chunks_exact(width)
        .flat_map(|row| row[c.clone()].iter().copied())
        .collect()
}

/// Adds the ranks' partial sums in rank order, `((p0 + p1) + p2) + ...`,
/// element by element: the all-reduce's declared order. `skip` leaves one
/// rank's contribution out (the planted fault).
pub fn all_reduce<T: Real>(partials: &[Vec<T>], skip: Option<usize>) -> Vec<T> {
    let mut taken = partials
        .iter()
        .enumerate()
        .filter(|(r, _)| Some(*r) != skip)
        .map(|(_, p)| p);
    let mut sum = taken.next().cloned().unwrap_or_default();
    for p in taken {
        for (s, x) in sum.iter_mut().zip(p) {
            *s += *x;
        }
    }
    sum
}

impl Step<'_> {
    fn pos(&self, n: usize) -> Range<u32> {
        self.start as u32..(self.start + n) as u32
    }

    /// Taps rank `rank`'s `data` (`[n, width]`); `place` is its column range
    /// in a full tensor `full` wide, or none for a full-shape partial sum.
    fn tap_rank<T: Real>(
        &self,
        stage: &str,
        layer: usize,
        rank: usize,
        place: Option<(Range<usize>, usize)>,
        width: usize,
        data: &[T],
    ) {
        if !capture::is_armed() {
            return;
        }
        let n = data.len() / width.max(1);
        let id = TapId::new(stage, Some(layer as u32), self.pos(n), self.slot);
        let shard = place.map(|(c, full)| Shard {
            axis: 1,
            start: c.start as u32,
            end: c.end as u32,
            full: full as u32,
        });
        capture::tap_ranked(id, rank as u32, shard, &[n, width], data);
    }

    fn skipped(&self, layer: usize, stage: Reduce) -> Option<usize> {
        self.skip
            .filter(|s| s.layer == layer && s.stage == stage)
            .map(|s| s.rank)
    }

    /// Runs `tokens`; returns the last row's logits.
    pub(super) fn run<T: Real>(&self, cache: &mut RankCache<T>, tokens: &[u32]) -> Vec<f32> {
        let (cfg, w) = (self.cfg, self.w);
        let n = tokens.len();
        let d = cfg.n_embd;
        let pos = self.pos(n);
        let slot = self.slot;
        cache.truncate(self.start, cfg.head_dim);
        let fam = &cfg.family;
        let mut x: Vec<T> = embed(&w.token_embd, tokens);
        if fam.embed_scale {
            scale_embedding(&mut x, d);
        }
        tap(st::EMBEDDING, None, pos.clone(), slot, d, &x);
        let mut tables: Vec<RopeTable<T>> = Vec::new();
        for (l, lw) in w.layers.iter().enumerate() {
            let li = Some(l as u32);
            let la = fam.attention(l, cfg.rope_base);
            if !tables.iter().any(|t| t.fits(self.start, la.rope_base)) {
                tables.push(RopeTable::new(self.start, n, cfg.head_dim, la.rope_base));
            }
            let table = tables
                .iter()
                .find(|t| t.fits(self.start, la.rope_base))
                .expect("pushed above");
            let h = rms_norm(&x, &lw.attn_norm, cfg.rms_eps);
            tap(st::ATTN_NORM, li, pos.clone(), slot, d, &h);
            let partials: Vec<Vec<T>> = (0..self.plan.ranks.len())
                .map(|r| self.attention_rank(cache, l, r, &h, table, la.window))
                .collect();
            let mut o = all_reduce(&partials, self.skipped(l, Reduce::OProj));
            tap(st::O_PROJ, li, pos.clone(), slot, d, &o);
            if let Some(pn) = &lw.post_attn_norm {
                o = rms_norm(&o, pn, cfg.rms_eps);
                tap(st::POST_ATTN_NORM, li, pos.clone(), slot, d, &o);
            }
            add_residual(&mut x, &o);
            tap(st::POST_ATTN_RESIDUAL, li, pos.clone(), slot, d, &x);

            let h = rms_norm(&x, &lw.ffn_norm, cfg.rms_eps);
            tap(st::FFN_NORM, li, pos.clone(), slot, d, &h);
            let partials: Vec<Vec<T>> = (0..self.plan.ranks.len())
                .map(|r| self.ffn_rank(l, r, &h))
                .collect();
            let mut dn = all_reduce(&partials, self.skipped(l, Reduce::FfnDown));
            tap(st::FFN_DOWN, li, pos.clone(), slot, d, &dn);
            if let Some(pn) = &lw.post_ffn_norm {
                dn = rms_norm(&dn, pn, cfg.rms_eps);
                tap(st::POST_FFN_NORM, li, pos.clone(), slot, d, &dn);
            }
            add_residual(&mut x, &dn);
            tap(st::POST_FFN_RESIDUAL, li, pos.clone(), slot, d, &x);
        }
        cache.len = self.start + n;
        let h = rms_norm(&x, &w.output_norm, cfg.rms_eps);
        tap(st::FINAL_NORM, None, pos.clone(), slot, d, &h);
        let logits = w.logits(&h, n, self.acts.logits);
        if n > 1 {
            crate::cpu::quant_row::release_spare();
        }
        tap(st::LOGITS, None, pos, slot, cfg.vocab_size, &logits);
        logits[(n - 1) * cfg.vocab_size..]
            .iter()
            .map(|v| v.to_f32())
            .collect()
    }

    /// Rank `r`'s attention block of layer `l`: its q/k/v shards, RoPE,
    /// attention over the KV heads it holds, and its o_proj partial sum.
    fn attention_rank<T: Real>(
        &self,
        cache: &mut RankCache<T>,
        l: usize,
        r: usize,
        h: &[T],
        table: &RopeTable<T>,
        window: Option<usize>,
    ) -> Vec<T> {
        let (cfg, p) = (self.cfg, &self.plan.ranks[r]);
        let (lw, rw) = (&self.w.layers[l], &self.ranks[r][l]);
        let (hd, n) = (cfg.head_dim, h.len() / cfg.n_embd);
        let q_full = cfg.n_head * hd;
        let q_cols = p.heads.start * hd..p.heads.end * hd;
        let (qw, kvw) = (q_cols.len(), p.kv_held.len() * hd);
        let act = self.acts.attn;
        let [mut q, mut k, v]: [Vec<T>; 3] = apply_group(&[&rw.wq, &rw.wk, &rw.wv], h, n, act)
            .try_into()
            .expect("three outputs");
        self.tap_rank(st::Q_PROJ, l, r, Some((q_cols.clone(), q_full)), qw, &q);
        self.tap_owned_kv(st::K_PROJ, l, r, &k);
        self.tap_owned_kv(st::V_PROJ, l, r, &v);
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            q = rms_norm(&q, qn, cfg.rms_eps);
            self.tap_rank(st::Q_NORM, l, r, Some((q_cols.clone(), q_full)), qw, &q);
            k = rms_norm(&k, kn, cfg.rms_eps);
            self.tap_owned_kv(st::K_NORM, l, r, &k);
        }
        rope_with(cfg.family.rope, &mut q, qw, table);
        self.tap_rank(st::Q_ROPE, l, r, Some((q_cols.clone(), q_full)), qw, &q);
        rope_with(cfg.family.rope, &mut k, kvw, table);
        self.tap_owned_kv(st::K_ROPE, l, r, &k);
        for (j, _) in p.kv_held.clone().enumerate() {
            let c = j * hd..(j + 1) * hd;
            cache.k[l][r][j].extend(columns(&k, kvw, c.clone()));
            cache.v[l][r][j].extend(columns(&v, kvw, c));
        }
        // Attention per KV head held, over the rank's query heads reading it
        // (an uneven split does not group heads evenly within a rank).
        let mut a = vec![T::ZERO; n * qw];
        let g = self.plan.group;
        for (j, kvh) in p.kv_held.clone().enumerate() {
            let hs = p.heads.start.max(kvh * g)..p.heads.end.min((kvh + 1) * g);
            let local = (hs.start - p.heads.start) * hd..(hs.end - p.heads.start) * hd;
            let qg = columns(&q, qw, local.clone());
            let heads = Heads {
                n_head: hs.len(),
                n_head_kv: 1,
                head_dim: hd,
            };
            let (kc, vc) = (&cache.k[l][r][j], &cache.v[l][r][j]);
            let out = attention_windowed(&qg, n, self.start, kc, vc, heads, window);
            for (row, o) in a.chunks_exact_mut(qw).zip(out.chunks_exact(local.len())) {
                row[local.clone()].copy_from_slice(o);
            }
        }
        self.tap_rank(st::ATTN, l, r, Some((q_cols, q_full)), qw, &a);
        let o = rw.wo.apply(&a, n, act);
        self.tap_rank(super::O_PROJ_PARTIAL, l, r, None, cfg.n_embd, &o);
        o
    }

    /// Taps the KV heads rank `r` owns of its held `x` (`[n, held * head_dim]`).
    fn tap_owned_kv<T: Real>(&self, stage: &str, l: usize, r: usize, x: &[T]) {
        let (p, hd) = (&self.plan.ranks[r], self.cfg.head_dim);
        if p.kv_owned.is_empty() || !capture::is_armed() {
            return;
        }
        let held = p.kv_held.len() * hd;
        let local =
            (p.kv_owned.start - p.kv_held.start) * hd..(p.kv_owned.end - p.kv_held.start) * hd;
        let full = self.cfg.n_head_kv * hd;
        let place = p.kv_owned.start * hd..p.kv_owned.end * hd;
        let data = if local.len() == held {
            x.to_vec()
        } else {
            columns(x, held, local.clone())
        };
        self.tap_rank(stage, l, r, Some((place, full)), local.len(), &data);
    }

    /// Rank `r`'s FFN block of layer `l`: gate/up shards, the gated product,
    /// and its ffn_down partial sum.
    fn ffn_rank<T: Real>(&self, l: usize, r: usize, h: &[T]) -> Vec<T> {
        let (cfg, p) = (self.cfg, &self.plan.ranks[r]);
        let rw = &self.ranks[r][l];
        let n = h.len() / cfg.n_embd;
        let place = || Some((p.ffn.clone(), cfg.n_ff));
        let width = p.ffn.len();
        let [g, u]: [Vec<T>; 2] = apply_group(&[&rw.w_gate, &rw.w_up], h, n, self.acts.ffn_up)
            .try_into()
            .expect("two outputs");
        self.tap_rank(st::FFN_GATE, l, r, place(), width, &g);
        self.tap_rank(st::FFN_UP, l, r, place(), width, &u);
        let s = gated(cfg.family.ffn, &g, &u);
        self.tap_rank(st::gated_stage(cfg.family.ffn), l, r, place(), width, &s);
        let dn = rw.w_down.apply(&s, n, self.acts.ffn_down);
        self.tap_rank(super::FFN_DOWN_PARTIAL, l, r, None, cfg.n_embd, &dn);
        dn
    }
}
