//! Each stage of the stage contract recomputed alone, from the tree's own
//! input taps and the model's weights, with the CPU forward's ops.
//!
//! No op is written twice: the norms, matmuls, RoPE, attention, gating,
//! embedding and residual add are `kernels::cpu`'s, called one at a time on
//! captured inputs instead of on the forward's own running values. The
//! arithmetic is [`Arith`] (`kernels::Precision`): `f64` recomputes every op
//! exactly from the dequantized weights (the local error of the tree's op);
//! `f32`, `q8` and `llamacpp` recompute it as that forward would have
//! (conformance: how far the tree's op is from that arithmetic), with the
//! tree's recorded switches, and for `llamacpp` its F16 K/V cache and its
//! flash-attention setting.

use crate::taps::{self, Taps};
use crate::Error;
use capture::RunInfo;
use kernels::cpu::attention::{attention_windowed, Heads};
use kernels::cpu::embedding::{embed, scale_embedding};
use kernels::cpu::ffn::gated;
use kernels::cpu::forward::Acts;
use kernels::cpu::llamacpp::{self, GgmlSimd};
use kernels::cpu::llamacpp_gemma;
use kernels::cpu::norm::rms_norm;
use kernels::cpu::residual::add_residual;
use kernels::cpu::rope::rope_styled;
use kernels::cpu::weights::DenseWeights;
use kernels::cpu::Real;
use kernels::ggml_build::EngineBuild;
use kernels::stages as st;
use kernels::switches::{Switches, SIMD_VAR};
use model::LlamaConfig;
use model::{FfnActivation, ModelFamily, RopeStyle};
use std::ops::Range;
use std::path::PathBuf;

/// The arithmetic of a recomputation: `F64` (the truth) or a forward's own.
pub use kernels::Precision as Arith;

/// The recomputation of a tree's ops under one arithmetic.
pub struct Ops<'a> {
    cfg: &'a LlamaConfig,
    w: &'a DenseWeights,
    arith: Arith,
    acts: Acts,
    flash_attn: bool,
    /// The llama.cpp build whose arithmetic `LlamaCpp` recomputes.
    simd: GgmlSimd,
    run: RunInfo,
    tree: PathBuf,
}

fn family_name(f: &ModelFamily) -> &'static str {
    if *f == ModelFamily::llama() {
        "llama"
    } else if f.qk_norm && f.post_norms {
        "gemma3"
    } else {
        "custom"
    }
}

/// The llama.cpp build a run's arithmetic is recomputed as: what a
/// llama.cpp capture's `engine_versions` says it was compiled for, else the
/// run's `TAPTREE_LLAMACPP_SIMD` switch (taptree's own `--precision
/// llamacpp` records it), else AVX2 (what that forward computed before it
/// recorded the switch). A switch that contradicts the engine's own
/// account is an error, not a choice; so is flash attention on a build
/// whose flash attention is not modelled.
fn llamacpp_build(
    run: &RunInfo,
    switches: &Switches,
    flash_attn: bool,
) -> Result<GgmlSimd, String> {
    let versions = run.extra.get("engine_versions");
    let info = versions
        .and_then(|v| v.get("system_info"))
        .and_then(|v| v.as_str());
    let Some(info) = info else {
        return Ok(switches.llamacpp_simd().unwrap_or(GgmlSimd::Avx2));
    };
    let flags = versions
        .and_then(|v| v.get("cpu_avx512_flags"))
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str());
    let build = EngineBuild::from_account(info, flags)?;
    if let Some(asked) = switches.llamacpp_simd().filter(|a| *a != build.simd) {
        return Err(format!(
            "run.switches says {SIMD_VAR}={asked}, but llama.cpp's system_info says it was built for {} ({info:?})",
            build.simd
        ));
    }
    match build.flash_attn_unmodelled() {
        Some(why) if flash_attn => Err(why.to_string()),
        _ => Ok(build.simd),
    }
}

impl<'a> Ops<'a> {
    /// The recomputation of `run`'s ops (a tree at `tree`) in `arith`.
    pub fn new(
        cfg: &'a LlamaConfig,
        w: &'a DenseWeights,
        run: &RunInfo,
        tree: PathBuf,
        arith: Arith,
    ) -> Result<Ops<'a>, Error> {
        let unsupported = |reason: String| Error::Unsupported {
            tree: tree.clone(),
            reason,
        };
        let switches = Switches::from_vars(&run.switches)
            .map_err(|e| unsupported(format!("run.switches: {e}")))?;
        let extra = |k: &str| run.extra.get(k);
        let flash_attn =
            switches.flash_attn() || extra("flash_attn").and_then(|v| v.as_bool()) == Some(true);
        // Only llama.cpp's arithmetic depends on its build.
        let mut simd = GgmlSimd::Avx2;
        if arith == Arith::LlamaCpp {
            simd = llamacpp_build(run, &switches, flash_attn).map_err(unsupported)?;
            if !llamacpp_gemma::modelled(cfg) {
                return Err(unsupported(format!(
                    "--precision llamacpp models llama.cpp's arithmetic for llama and gemma3, not {}",
                    cfg.arch
                )));
            }
            if let Some(kv) = extra("kv_cache_type").and_then(|v| v.as_str()) {
                if kv != "f16" {
                    return Err(unsupported(format!(
                        "--precision llamacpp models llama.cpp's F16 K/V cache; this run's is {kv}"
                    )));
                }
            }
        }
        Ok(Ops {
            cfg,
            w,
            arith,
            // The truth takes every activation as it is, whatever the
            // tree's switches quantized.
            acts: if arith == Arith::F64 {
                Acts::resolve(Arith::F32, &Switches::none())
            } else {
                Acts::resolve(arith, &switches)
            },
            flash_attn: arith == Arith::LlamaCpp && flash_attn,
            simd,
            run: run.clone(),
            tree,
        })
    }

    /// Whether the model's RoPE pairs halves of each head.
    pub fn halves(&self) -> bool {
        self.cfg.family.rope == RopeStyle::Halves
    }

    /// The width of `stage`'s rows, if the stage contract defines it for
    /// this model at this scope (`layer` or global).
    pub fn width(&self, stage: &str, layered: bool) -> Option<usize> {
        let c = self.cfg;
        let f = &c.family;
        let (q, kv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let gated = match f.ffn {
            FfnActivation::Silu => st::FFN_SWIGLU,
            FfnActivation::GeluTanh => st::FFN_GEGLU,
        };
        let w = match stage {
            st::EMBEDDING | st::FINAL_NORM if !layered => c.n_embd,
            st::LOGITS if !layered => c.vocab_size,
            _ if !layered => return None,
            st::Q_NORM | st::K_NORM if !f.qk_norm => return None,
            st::POST_ATTN_NORM | st::POST_FFN_NORM if !f.post_norms => return None,
            st::FFN_SWIGLU | st::FFN_GEGLU if stage != gated => return None,
            st::ATTN_NORM
            | st::O_PROJ
            | st::POST_ATTN_NORM
            | st::POST_ATTN_RESIDUAL
            | st::FFN_NORM
            | st::FFN_DOWN
            | st::POST_FFN_NORM
            | st::POST_FFN_RESIDUAL => c.n_embd,
            st::Q_PROJ | st::Q_NORM | st::Q_ROPE | st::ATTN => q,
            st::K_PROJ | st::V_PROJ | st::K_NORM | st::K_ROPE => kv,
            st::FFN_GATE | st::FFN_UP | st::FFN_SWIGLU | st::FFN_GEGLU => c.n_ff,
            _ => return None,
        };
        Some(w)
    }

    /// Refuses a stage the stage contract does not define for this model,
    /// and a layer the model does not have.
    pub fn check(&self, stage: &str, layer: Option<u32>) -> Result<(), Error> {
        if self.width(stage, layer.is_some()).is_none() {
            return Err(Error::UnknownStage {
                tree: self.tree.clone(),
                stage: format!(
                    "{stage}{}",
                    if layer.is_some() {
                        " (per layer)"
                    } else {
                        " (global)"
                    }
                ),
                family: family_name(&self.cfg.family).into(),
            });
        }
        match layer {
            Some(l) if l as usize >= self.cfg.n_layer => Err(Error::Unsupported {
                tree: self.tree.clone(),
                reason: format!(
                    "{}: layer {l}, the model has {} layers",
                    taps::name(stage, layer, None, &(0..1)),
                    self.cfg.n_layer
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The input tokens of `slot` at `pos`, as the run recorded them.
    fn tokens(&self, slot: Option<u32>, pos: &Range<u32>, tap: &str) -> Result<Vec<u32>, Error> {
        let all = diff::inputs::tokens(&self.run, slot).unwrap_or_default();
        let Some(t) = all.get(pos.start as usize..pos.end as usize) else {
            return Err(Error::MissingInput {
                tree: self.tree.clone(),
                tap: tap.into(),
                input: format!(
                    "the input token of position {} (run.prompt_tokens, extra.slots, extra.generated_tokens)",
                    pos.start.max(all.len() as u32)
                ),
            });
        };
        if let Some(&id) = t.iter().find(|&&id| id as usize >= self.cfg.vocab_size) {
            return Err(Error::Unsupported {
                tree: self.tree.clone(),
                reason: format!(
                    "{tap}: token id {id} is outside the model's vocabulary ({})",
                    self.cfg.vocab_size
                ),
            });
        }
        Ok(t.to_vec())
    }

    /// Recomputes the tap `stage` of `layer` and `slot` at `pos` from its
    /// inputs in `taps`, in this arithmetic; widened to f64.
    pub fn recompute(
        &self,
        taps: &Taps,
        stage: &str,
        layer: Option<u32>,
        slot: Option<u32>,
        pos: Range<u32>,
    ) -> Result<Vec<f64>, Error> {
        fn wide<T: Real>(v: Vec<T>) -> Vec<f64> {
            v.into_iter().map(Real::to_f64).collect()
        }
        Ok(match self.arith {
            Arith::F64 => wide(self.op::<f64>(taps, stage, layer, slot, pos)?),
            _ => wide(self.op::<f32>(taps, stage, layer, slot, pos)?),
        })
    }

    fn op<T: Real>(
        &self,
        taps: &Taps,
        stage: &str,
        layer: Option<u32>,
        slot: Option<u32>,
        pos: Range<u32>,
    ) -> Result<Vec<T>, Error> {
        self.check(stage, layer)?;
        let tap = taps::name(stage, layer, slot, &pos);
        let (c, w, n) = (self.cfg, self.w, pos.len());
        let get = |s: &str, l: Option<u32>, p: Range<u32>| {
            let want = self
                .width(s, l.is_some())
                .expect("inputs are stages of the contract");
            taps.get::<T>((s, l, slot), p, want, &tap)
        };
        let Some(layer) = layer else {
            return Ok(match stage {
                st::EMBEDDING => {
                    let tokens = self.tokens(slot, &pos, &tap)?;
                    let mut x = embed(&w.token_embd, &tokens);
                    if c.family.embed_scale {
                        scale_embedding(&mut x, c.n_embd);
                    }
                    x
                }
                st::FINAL_NORM => {
                    let last = Some(c.n_layer as u32 - 1);
                    rms_norm(
                        &get(st::POST_FFN_RESIDUAL, last, pos)?,
                        &w.output_norm,
                        c.rms_eps,
                    )
                }
                _ => w.logits(&get(st::FINAL_NORM, None, pos)?, n, self.acts.logits),
            });
        };
        let (l, li) = (layer as usize, Some(layer));
        let lw = &w.layers[l];
        let f = &c.family;
        let at = |s| get(s, li, pos.clone());
        let layer_input = || match layer {
            0 => get(st::EMBEDDING, None, pos.clone()),
            _ => get(st::POST_FFN_RESIDUAL, Some(layer - 1), pos.clone()),
        };
        let norm =
            |x: Vec<T>, g: &Option<Vec<f32>>| rms_norm(&x, g.as_ref().expect("checked"), c.rms_eps);
        let gated_stage = if f.ffn == FfnActivation::Silu {
            st::FFN_SWIGLU
        } else {
            st::FFN_GEGLU
        };
        let acts = self.acts;
        Ok(match stage {
            st::ATTN_NORM => rms_norm(&layer_input()?, &lw.attn_norm, c.rms_eps),
            st::Q_PROJ => lw.wq.apply(&at(st::ATTN_NORM)?, n, acts.attn),
            st::K_PROJ => lw.wk.apply(&at(st::ATTN_NORM)?, n, acts.attn),
            st::V_PROJ => lw.wv.apply(&at(st::ATTN_NORM)?, n, acts.attn),
            st::Q_NORM => norm(at(st::Q_PROJ)?, &lw.q_norm),
            st::K_NORM => norm(at(st::K_PROJ)?, &lw.k_norm),
            st::Q_ROPE | st::K_ROPE => {
                let (q, input) = match (stage == st::Q_ROPE, f.qk_norm) {
                    (true, true) => (true, st::Q_NORM),
                    (true, false) => (true, st::Q_PROJ),
                    (false, true) => (false, st::K_NORM),
                    (false, false) => (false, st::K_PROJ),
                };
                let mut x = at(input)?;
                self.rope(&mut x, q, l, pos.start as usize);
                x
            }
            st::ATTN => {
                let q = at(st::Q_ROPE)?;
                let k = get(st::K_ROPE, li, 0..pos.end)?;
                let v = get(st::V_PROJ, li, 0..pos.end)?;
                self.attention(&q, k, v, l, pos, &tap)?
            }
            st::O_PROJ => lw.wo.apply(&at(st::ATTN)?, n, acts.attn),
            st::POST_ATTN_NORM => norm(at(st::O_PROJ)?, &lw.post_attn_norm),
            st::POST_ATTN_RESIDUAL => {
                let mut x = layer_input()?;
                let out = if f.post_norms {
                    st::POST_ATTN_NORM
                } else {
                    st::O_PROJ
                };
                add_residual(&mut x, &at(out)?);
                x
            }
            st::FFN_NORM => rms_norm(&at(st::POST_ATTN_RESIDUAL)?, &lw.ffn_norm, c.rms_eps),
            st::FFN_GATE => lw.w_gate.apply(&at(st::FFN_NORM)?, n, acts.ffn_up),
            st::FFN_UP => lw.w_up.apply(&at(st::FFN_NORM)?, n, acts.ffn_up),
            st::FFN_SWIGLU | st::FFN_GEGLU => {
                let (g, u) = (at(st::FFN_GATE)?, at(st::FFN_UP)?);
                match self.arith {
                    Arith::LlamaCpp => llamacpp_gemma::gated(f.ffn, &g, &u),
                    _ => gated(f.ffn, &g, &u),
                }
            }
            st::FFN_DOWN => lw.w_down.apply(&at(gated_stage)?, n, acts.ffn_down),
            st::POST_FFN_NORM => norm(at(st::FFN_DOWN)?, &lw.post_ffn_norm),
            _ => {
                let mut x = at(st::POST_ATTN_RESIDUAL)?;
                let out = if f.post_norms {
                    st::POST_FFN_NORM
                } else {
                    st::FFN_DOWN
                };
                add_residual(&mut x, &at(out)?);
                x
            }
        })
    }

    /// RoPE of query (`q`) or key rows of layer `l` starting at `start`.
    fn rope<T: Real>(&self, x: &mut [T], q: bool, l: usize, start: usize) {
        let c = self.cfg;
        let width = if q { c.n_head } else { c.n_head_kv } * c.head_dim;
        let base = c.family.attention(l, c.rope_base).rope_base;
        match self.arith {
            Arith::LlamaCpp => {
                llamacpp_gemma::rope_styled(c.family.rope, x, width, start, c.head_dim, base)
            }
            _ => rope_styled(c.family.rope, x, width, start, c.head_dim, base),
        }
    }

    /// Attention of the query rows at `pos` over the keys and values of
    /// positions `0..pos.end`.
    fn attention<T: Real>(
        &self,
        q: &[T],
        k: Vec<T>,
        v: Vec<T>,
        l: usize,
        pos: Range<u32>,
        tap: &str,
    ) -> Result<Vec<T>, Error> {
        let c = self.cfg;
        let heads = Heads {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
        };
        let (n, start) = (pos.len(), pos.start as usize);
        if self.arith != Arith::LlamaCpp {
            let window = c.family.attention(l, c.rope_base).window;
            return Ok(attention_windowed(q, n, start, &k, &v, heads, window));
        }
        // llama.cpp's K/V cache holds f16 values.
        let f16 = |x: Vec<T>| x.into_iter().map(llamacpp::f16_round).collect::<Vec<T>>();
        let (k, v) = (f16(k), f16(v));
        let graph = llamacpp_gemma::graph_of(c, l, self.simd).expect("family checked at open");
        if !self.flash_attn {
            return Ok(llamacpp::attention_in(q, n, start, &k, &v, heads, graph));
        }
        if n >= llamacpp::FLASH_ATTN_TILE_ROWS {
            return Err(Error::Unsupported {
                tree: self.tree.clone(),
                reason: format!(
                    "{tap}: {n} query rows ran llama.cpp's tiled flash attention kernel, which --precision llamacpp does not model"
                ),
            });
        }
        Ok(llamacpp::flash_attention_in(
            q, n, start, &k, &v, heads, graph,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(info: Option<&str>, switch: Option<&str>) -> (RunInfo, Switches) {
        let mut r = RunInfo::default();
        if let Some(info) = info {
            r.extra.insert(
                "engine_versions".into(),
                serde_json::json!({ "system_info": info }),
            );
        }
        let vars: Vec<(&str, &str)> = switch.map(|v| (SIMD_VAR, v)).into_iter().collect();
        let s = Switches::from_vars(vars).unwrap();
        (r, s)
    }

    #[test]
    fn the_build_is_the_engines_account_then_the_switch_then_avx2() {
        const AVX512: &str = "CPU : AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | ";
        const AVX2: &str = "CPU : AVX2 = 1 | F16C = 1 | FMA = 1 | ";
        let build = |info, switch| {
            let (r, s) = run(info, switch);
            llamacpp_build(&r, &s, false)
        };
        assert_eq!(build(Some(AVX512), None), Ok(GgmlSimd::Avx512));
        assert_eq!(build(Some(AVX2), None), Ok(GgmlSimd::Avx2));
        assert_eq!(build(Some(AVX512), Some("avx512")), Ok(GgmlSimd::Avx512));
        assert_eq!(build(None, Some("avx512")), Ok(GgmlSimd::Avx512));
        // A tree from before the switch: summed in the AVX2 order.
        assert_eq!(build(None, None), Ok(GgmlSimd::Avx2));
        // A switch that contradicts the engine, and a build not modelled:
        // errors, never a guess.
        let e = build(Some(AVX2), Some("avx512")).unwrap_err();
        assert!(e.contains("TAPTREE_LLAMACPP_SIMD=avx512"), "{e}");
        let e = build(Some("CPU : NEON = 1 | ARM_FMA = 1 | "), None).unwrap_err();
        assert!(e.contains("without AVX2"), "{e}");
    }
}
