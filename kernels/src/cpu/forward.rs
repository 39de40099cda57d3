//! [`CpuForward`]: the instrumented reference forward of a decoder (llama, or
//! the family its [`model::ModelFamily`] describes), in f32, q8 (int8 activations
//! before quantized matmuls) or f64.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use super::attention::{attention_windowed, Heads};
use super::embedding::{embed, scale_embedding};
use super::fused::{add_norm_quantize, gated_quantize, Prepared};
use super::llamacpp::{self, GgmlSimd};
use super::llamacpp_gemma;
use super::matmul::{apply_group_quantized, quant_blocks, quantize_for, Act, Linear};
use super::norm::rms_norm;
use super::rope::{rope_pair_with, RopeTable};
use super::weights::{DenseLayer, DenseWeights};
use super::{profile, tap, tap_owned, Real};
use crate::forward::{Forward, ForwardError, Precision};
use crate::stages as st;
use crate::switches::{ActPrecision, Family, Switches};
use model::{LlamaConfig, ModelWeights};

/// The activation handling of each matmul family, resolved once at open.
#[derive(Debug, Clone, Copy)]
pub struct Acts {
    /// The q, k, v and o projections.
    pub attn: Act,
    /// The gate and up projections.
    pub ffn_up: Act,
    /// The down projection.
    pub ffn_down: Act,
    /// The output (logits) matmul.
    pub logits: Act,
}

impl Acts {
    /// What `precision` and the `switches` overriding it give each family.
    pub fn resolve(precision: Precision, switches: &Switches) -> Acts {
        let act = |f| match switches.resolve(f, precision) {
            ActPrecision::F32 => Act::Float,
            ActPrecision::Q8 if precision == Precision::LlamaCpp => Act::LlamaCpp,
            ActPrecision::Q8 => Act::Q8,
        };
        Acts {
            attn: act(Family::Attn),
            ffn_up: act(Family::FfnUp),
            ffn_down: act(Family::FfnDown),
            logits: act(Family::Logits),
        }
    }
}

/// Keys and values of every cached position of one sequence, per layer,
/// `[len, n_head_kv * head_dim]`.
#[derive(Debug)]
struct KvCache<T> {
    len: usize,
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: Real> KvCache<T> {
    fn new(n_layer: usize) -> KvCache<T> {
        KvCache {
            len: 0,
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
        }
    }

    /// Drops positions `len..` so a sequence can be re-run from `len`.
    fn truncate(&mut self, len: usize, kv_width: usize) {
        self.len = len;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.truncate(len * kv_width);
        }
    }
}

/// How RoPE, the K/V cache and attention are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ops {
    Reference,
    /// `--precision llamacpp`: as llama.cpp computes them
    /// (`super::llamacpp`), with its flash attention or without.
    LlamaCpp {
        flash_attn: bool,
        /// The llama.cpp build modelled (`TAPTREE_LLAMACPP_SIMD`, or this
        /// CPU's).
        simd: GgmlSimd,
    },
}

/// The forward in one activation type, with a KV cache per slot.
struct Engine<T> {
    caches: BTreeMap<Option<u32>, KvCache<T>>,
    ops: Ops,
}

/// The CPU forward. Weights are prepared once at [`CpuForward::new`]
/// (quantized ones kept in their blocks, see [`super::qmatrix`]);
/// several forwards (say, one per precision) may share them through
/// [`CpuForward::with_weights`].
pub struct CpuForward {
    config: LlamaConfig,
    precision: Precision,
    weights: Arc<DenseWeights>,
    acts: Acts,
    engine: EngineOf,
}

enum EngineOf {
    F32(Engine<f32>),
    F64(Engine<f64>),
}

impl CpuForward {
    /// Prepares `weights` and opens a forward at `precision`, with
    /// `switches` overriding the activation precision of op families.
    pub fn new(
        weights: &ModelWeights,
        precision: Precision,
        switches: &Switches,
    ) -> Result<CpuForward, ForwardError> {
        let dense = Arc::new(DenseWeights::new(weights)?);
        CpuForward::with_weights(weights.config.clone(), dense, precision, switches)
    }

    /// Opens a forward over weights already prepared.
    pub fn with_weights(
        config: LlamaConfig,
        weights: Arc<DenseWeights>,
        precision: Precision,
        switches: &Switches,
    ) -> Result<CpuForward, ForwardError> {
        crate::forward::check_config(&config)?;
        switches.check(precision)?;
        // The regions' threads, started before the first forward needs them.
        super::par::start();
        if precision == Precision::LlamaCpp && !llamacpp_gemma::modelled(&config) {
            return Err(ForwardError::Unsupported(format!(
                "--precision llamacpp models llama.cpp's arithmetic for the llama family and gemma3 only, not {}",
                config.arch
            )));
        }
        let engine = match precision {
            Precision::F64 => EngineOf::F64(Engine {
                caches: BTreeMap::new(),
                ops: Ops::Reference,
            }),
            Precision::F32 | Precision::Q8 | Precision::LlamaCpp => EngineOf::F32(Engine {
                caches: BTreeMap::new(),
                ops: if precision == Precision::LlamaCpp {
                    Ops::LlamaCpp {
                        flash_attn: switches.flash_attn(),
                        simd: switches.llamacpp_simd().unwrap_or_else(GgmlSimd::host),
                    }
                } else {
                    Ops::Reference
                },
            }),
        };
        Ok(CpuForward {
            config,
            precision,
            weights,
            acts: Acts::resolve(precision, switches),
            engine,
        })
    }

    /// The prepared weights, to share with another forward.
    pub fn weights(&self) -> Arc<DenseWeights> {
        Arc::clone(&self.weights)
    }

    fn cached_len(&self, slot: Option<u32>) -> usize {
        match &self.engine {
            EngineOf::F32(e) => e.caches.get(&slot).map_or(0, |c| c.len),
            EngineOf::F64(e) => e.caches.get(&slot).map_or(0, |c| c.len),
        }
    }

    /// Rejects a run before anything is computed or tapped.
    fn check(
        &self,
        slot: Option<u32>,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<(), ForwardError> {
        crate::forward::check_tokens(&self.config, tokens)?;
        if let EngineOf::F32(Engine {
            ops: Ops::LlamaCpp {
                flash_attn: true, ..
            },
            ..
        }) = &self.engine
        {
            if tokens.len() >= llamacpp::FLASH_ATTN_TILE_ROWS {
                return Err(ForwardError::Unsupported(format!(
                    "{} rows in one forward: llama.cpp runs {} or more through its tiled flash \
                     attention kernel, which --precision llamacpp does not model",
                    tokens.len(),
                    llamacpp::FLASH_ATTN_TILE_ROWS
                )));
            }
        }
        crate::forward::check_positions(
            &self.config,
            slot,
            tokens.len(),
            start_pos,
            self.cached_len(slot),
        )
    }
}

/// What the ops of one forward call share: the model, the activation
/// handling, and where the rows are.
struct Step<'a> {
    cfg: &'a LlamaConfig,
    acts: Acts,
    ops: Ops,
    slot: Option<u32>,
    /// Position of the first row.
    start: usize,
    /// Positions of the rows, `start..start + n`.
    pos: Range<u32>,
}

impl Step<'_> {
    fn n(&self) -> usize {
        self.pos.len()
    }

    /// Taps `data` (`[n, width]`) as `stage` of layer `layer`.
    fn tap<T: Real>(&self, stage: &str, layer: Option<u32>, width: usize, data: &[T]) {
        tap(stage, layer, self.pos.clone(), self.slot, width, data);
    }

    /// The logits of the final normed rows `h`, tapped; returns the last
    /// row's. Only the rows the logits tap keeps and the last are computed
    /// (nothing else reads them): a capture that selects the last position's
    /// logits, or none, does the output matmul of one row, as an engine
    /// does. Each row is one dot product per output in one order whichever
    /// rows share the matmul, so the rows computed have the same bits.
    fn logits<T: Real>(&self, w: &DenseWeights, h: &[T], act: Act) -> Vec<f32> {
        let (n, vocab, d) = (self.n(), self.cfg.vocab_size, self.cfg.n_embd);
        let mut runs: Vec<Range<usize>> =
            capture::selected_runs(st::LOGITS, None, self.pos.clone(), self.slot)
                .into_iter()
                .map(|r| (r.start - self.pos.start) as usize..(r.end - self.pos.start) as usize)
                .collect();
        if runs.last().is_none_or(|r| r.end < n) {
            runs.push(n - 1..n);
        }
        let all = runs.len() == 1 && runs[0] == (0..n);
        let rows: Vec<T> = if all {
            Vec::new()
        } else {
            runs.iter()
                .flat_map(|r| &h[r.start * d..r.end * d])
                .copied()
                .collect()
        };
        let logits = {
            let _p = profile::op(profile::Op::Logits);
            if all {
                w.logits(h, n, act)
            } else {
                w.logits(&rows, rows.len() / d, act)
            }
        };
        // No region follows soon: the team's threads leave the cores to the
        // capture's writers (and to the copies of a logits tap that keeps
        // some of its runs; a decode step's are small, and its next step
        // comes sooner than the team's spin ends).
        if n > 1 {
            super::par::rest();
            super::quant_row::release_spare();
        }
        let last = logits[logits.len() - vocab..]
            .iter()
            .map(|v| v.to_f32())
            .collect();
        let at = |r: &Range<usize>| self.pos.start + r.start as u32..self.pos.start + r.end as u32;
        if let [r] = &runs[..] {
            // One run, the whole buffer: the capture keeps it, uncopied.
            tap_owned(st::LOGITS, None, at(r), self.slot, vocab, logits);
            return last;
        }
        let mut from = 0;
        for r in &runs {
            let len = r.len() * vocab;
            tap(
                st::LOGITS,
                None,
                at(r),
                self.slot,
                vocab,
                &logits[from..from + len],
            );
            from += len;
        }
        last
    }

    /// `x += add` (tapped as its stage and layer) when given, then the norm
    /// of `x` by `w` (tapped as `norm`), quantized for the matmuls `next`
    /// under `act`: one row pass ([`add_norm_quantize`]).
    fn residual_norm<T: Real>(
        &self,
        x: &mut [T],
        add: Option<(&[T], &str, Option<u32>)>,
        w: &[f32],
        norm: (&str, Option<u32>),
        next: &[&Linear],
        act: Act,
    ) -> Prepared<T> {
        let d = self.cfg.n_embd;
        let blocks = quant_blocks(next, act);
        let p = add_norm_quantize(x, add.map(|a| a.0), w, self.cfg.rms_eps, &blocks, act);
        if let Some((_, stage, layer)) = add {
            self.tap(stage, layer, d, x);
        }
        self.tap(norm.0, norm.1, d, &p.h);
        p
    }
}

impl<T: Real> Engine<T> {
    /// One forward of `tokens` at `start..start + n`; returns the last row's
    /// logits. Taps every stage of `stages::for_config(cfg)` in its order:
    /// the llama skeleton, with what `cfg.family` adds (extra norms, the
    /// gate's nonlinearity, RoPE layout, windows, embedding scale).
    fn run(
        &mut self,
        cfg: &LlamaConfig,
        w: &DenseWeights,
        acts: Acts,
        slot: Option<u32>,
        tokens: &[u32],
        start: usize,
    ) -> Vec<f32> {
        let (n, d) = (tokens.len(), cfg.n_embd);
        let _pin = super::par::pin_caller();
        let account = profile::Forward::start(n, super::par::team_threads);
        let s = Step {
            cfg,
            acts,
            ops: self.ops,
            slot,
            start,
            pos: start as u32..(start + n) as u32,
        };
        let cache = self
            .caches
            .entry(slot)
            .or_insert_with(|| KvCache::new(cfg.n_layer));
        cache.truncate(start, cfg.n_head_kv * cfg.head_dim);

        // One table per RoPE base (Gemma 3's local and global layers differ).
        let mut rope_tables: Vec<RopeTable<T>> = Vec::new();
        let mut x: Vec<T> = embed(&w.token_embd, tokens);
        if cfg.family.embed_scale {
            scale_embedding(&mut x, d);
        }
        s.tap(st::EMBEDDING, None, d, &x);

        // Each residual add runs in the row pass of the norm after it: the
        // FFN's output waits here for the next layer's attention norm (or
        // the final norm).
        let mut pending: Option<(Vec<T>, Option<u32>)> = None;
        for (l, lw) in w.layers.iter().enumerate() {
            let li = Some(l as u32);
            let attn = [&lw.wq, &lw.wk, &lw.wv];
            let add = pending.take();
            let add = ffn_residual(&add);
            let h = s.residual_norm(
                &mut x,
                add,
                &lw.attn_norm,
                (st::ATTN_NORM, li),
                &attn,
                acts.attn,
            );
            let o = attention_block(&s, l, lw, h, cache, &mut rope_tables);
            let ffn = [&lw.w_gate, &lw.w_up];
            let add = Some((&o[..], st::POST_ATTN_RESIDUAL, li));
            let h = s.residual_norm(
                &mut x,
                add,
                &lw.ffn_norm,
                (st::FFN_NORM, li),
                &ffn,
                acts.ffn_up,
            );
            pending = Some((ffn_block(&s, l, lw, h), li));
        }
        cache.len = start + n;

        let add = ffn_residual(&pending);
        let norm = (st::FINAL_NORM, None);
        let h = s
            .residual_norm(&mut x, add, &w.output_norm, norm, &[], acts.logits)
            .h;
        let last = s.logits(w, &h, acts.logits);
        account.done();
        last
    }
}

/// A layer's FFN output, waiting for the next norm's row pass, as
/// [`Step::residual_norm`] adds it and taps the sum.
fn ffn_residual<T>(pending: &Option<(Vec<T>, Option<u32>)>) -> Option<(&[T], &str, Option<u32>)> {
    pending
        .as_ref()
        .map(|(v, l)| (&v[..], st::POST_FFN_RESIDUAL, *l))
}

/// Layer `l`'s attention half, from its normed rows (`Step::residual_norm`
/// made them) to `o_proj` (and the family's post-attention norm): what the
/// residual adds. Appends the rows' keys and
/// values to `cache`.
fn attention_block<T: Real>(
    s: &Step,
    l: usize,
    lw: &DenseLayer,
    h: Prepared<T>,
    cache: &mut KvCache<T>,
    rope_tables: &mut Vec<RopeTable<T>>,
) -> Vec<T> {
    let (cfg, n, li, act) = (s.cfg, s.n(), Some(l as u32), s.acts.attn);
    let fam = &cfg.family;
    let q_width = cfg.n_head * cfg.head_dim;
    let kv_width = cfg.n_head_kv * cfg.head_dim;
    let heads = Heads {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
    };
    let la = fam.attention(l, cfg.rope_base);
    let [mut q, mut k, v]: [Vec<T>; 3] =
        apply_group_quantized(&[&lw.wq, &lw.wk, &lw.wv], &h.h, n, act, &h.qs)
            .try_into()
            .expect("three outputs");
    h.release();
    s.tap(st::Q_PROJ, li, q_width, &q);
    s.tap(st::K_PROJ, li, kv_width, &k);
    s.tap(st::V_PROJ, li, kv_width, &v);
    if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
        // One norm per head: `rms_norm` takes rows of the weight's width.
        q = rms_norm(&q, qn, cfg.rms_eps);
        s.tap(st::Q_NORM, li, q_width, &q);
        k = rms_norm(&k, kn, cfg.rms_eps);
        s.tap(st::K_NORM, li, kv_width, &k);
    }
    let (ops, start) = (s.ops, s.start);
    if ops == Ops::Reference && !rope_tables.iter().any(|t| t.fits(start, la.rope_base)) {
        rope_tables.push(RopeTable::new(start, n, cfg.head_dim, la.rope_base));
    }
    let table = rope_tables.iter().find(|t| t.fits(start, la.rope_base));
    match (ops, table) {
        (Ops::Reference, Some(table)) => {
            rope_pair_with(fam.rope, &mut q, q_width, &mut k, kv_width, table);
        }
        _ => {
            let (hd, base) = (cfg.head_dim, la.rope_base);
            llamacpp_gemma::rope_styled(fam.rope, &mut q, q_width, start, hd, base);
            llamacpp_gemma::rope_styled(fam.rope, &mut k, kv_width, start, hd, base);
        }
    }
    s.tap(st::Q_ROPE, li, q_width, &q);
    s.tap(st::K_ROPE, li, kv_width, &k);

    let a = if let Ops::LlamaCpp { flash_attn, simd } = ops {
        cache.k[l].extend(k.iter().map(|x| llamacpp::f16_round(*x)));
        cache.v[l].extend(v.iter().map(|x| llamacpp::f16_round(*x)));
        let attend = if flash_attn {
            llamacpp::flash_attention_in
        } else {
            llamacpp::attention_in
        };
        let graph = llamacpp_gemma::graph_of(cfg, l, simd).expect("checked at open");
        attend(&q, n, start, &cache.k[l], &cache.v[l], heads, graph)
    } else {
        append(&mut cache.k[l], k);
        append(&mut cache.v[l], v);
        attention_windowed(&q, n, start, &cache.k[l], &cache.v[l], heads, la.window)
    };
    s.tap(st::ATTN, li, q_width, &a);
    let mut o = lw.wo.apply(&a, n, act);
    s.tap(st::O_PROJ, li, cfg.n_embd, &o);
    if let Some(pn) = &lw.post_attn_norm {
        o = rms_norm(&o, pn, cfg.rms_eps);
        s.tap(st::POST_ATTN_NORM, li, cfg.n_embd, &o);
    }
    o
}

/// Appends a forward's K or V rows to a layer's cache: moved in where the
/// cache is empty (a prefill from position 0), so that the forward's
/// thread neither copies them nor pulls them from the caches of the cores
/// that computed them; copied after the rows already there otherwise.
fn append<T: Copy>(cache: &mut Vec<T>, rows: Vec<T>) {
    if cache.is_empty() {
        *cache = rows;
    } else {
        cache.extend_from_slice(&rows);
    }
}

/// Layer `l`'s feed-forward half, from its normed rows `h`
/// (`Step::residual_norm`) to `ffn_down` (and the family's post-FFN norm):
/// what the residual adds.
fn ffn_block<T: Real>(s: &Step, l: usize, lw: &DenseLayer, h: Prepared<T>) -> Vec<T> {
    let (cfg, n, li, d) = (s.cfg, s.n(), Some(l as u32), s.cfg.n_embd);
    let fam = &cfg.family;
    let up = s.acts.ffn_up;
    let [g, u]: [Vec<T>; 2] = apply_group_quantized(&[&lw.w_gate, &lw.w_up], &h.h, n, up, &h.qs)
        .try_into()
        .expect("two outputs");
    h.release();
    s.tap(st::FFN_GATE, li, cfg.n_ff, &g);
    s.tap(st::FFN_UP, li, cfg.n_ff, &u);
    let (down, act) = ([&lw.w_down], s.acts.ffn_down);
    let gu = match s.ops {
        Ops::LlamaCpp { .. } => {
            let gu = llamacpp_gemma::gated(fam.ffn, &g, &u);
            let qs = quantize_for(&down, &gu, n, act);
            Prepared { h: gu, qs }
        }
        // The gated product and its quantization in one row pass.
        Ops::Reference => gated_quantize(fam.ffn, &g, &u, cfg.n_ff, &quant_blocks(&down, act), act),
    };
    drop((g, u));
    s.tap(st::gated_stage(fam.ffn), li, cfg.n_ff, &gu.h);
    let [mut dn]: [Vec<T>; 1] = apply_group_quantized(&down, &gu.h, n, act, &gu.qs)
        .try_into()
        .expect("one output");
    gu.release();
    s.tap(st::FFN_DOWN, li, d, &dn);
    if let Some(pn) = &lw.post_ffn_norm {
        dn = rms_norm(&dn, pn, cfg.rms_eps);
        s.tap(st::POST_FFN_NORM, li, d, &dn);
    }
    dn
}

impl Forward for CpuForward {
    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn forward(
        &mut self,
        slot: Option<u32>,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        self.check(slot, tokens, start_pos)?;
        let (cfg, w, acts) = (&self.config, &*self.weights, self.acts);
        let engine = &mut self.engine;
        // On one of rayon's threads (`scope` runs its body there; in place
        // when called from one). The regions go to the team of `par` (one
        // of `rayon::current_num_threads()` threads, this one among them);
        // those that go to rayon instead (`TAPTREE_CPU_TEAM=0`, or a region
        // started while the team runs another) then fork and join from a
        // worker, which takes its own share and steals while it waits,
        // rather than handing the region to the pool and sleeping until
        // it is woken.
        Ok(rayon::scope(|_| match engine {
            EngineOf::F32(e) => e.run(cfg, w, acts, slot, tokens, start_pos),
            EngineOf::F64(e) => e.run(cfg, w, acts, slot, tokens, start_pos),
        }))
    }

    /// Runs the slots' decode steps one after another: each slot's taps carry
    /// its slot and position, so the tree matches a GPU's batched step key by
    /// key.
    fn decode_batch(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        // Every slot is checked before any runs, so a bad one changes no cache.
        for (i, (&t, &p)) in tokens.iter().zip(positions).enumerate() {
            self.check(Some(i as u32), &[t], p)?;
        }
        crate::forward::decode_slot_by_slot(self, tokens, positions)
    }

    fn reset(&mut self) {
        match &mut self.engine {
            EngineOf::F32(e) => e.caches.clear(),
            EngineOf::F64(e) => e.caches.clear(),
        }
    }
}
