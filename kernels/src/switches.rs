//! Precision switches per op family: which matmuls see int8-quantized
//! activations, overriding `--precision` for that family.
//!
//! | variable               | matmuls                     |
//! |------------------------|-----------------------------|
//! | `TAPTREE_ACT_ATTN`     | q, k, v and o projections   |
//! | `TAPTREE_ACT_FFN_UP`   | FFN gate and up             |
//! | `TAPTREE_ACT_FFN_DOWN` | FFN down                    |
//! | `TAPTREE_ACT_LOGITS`   | the output (logits) matmul  |
//!
//! Each takes `f32` (activations as they are: f32, or f64 in the f64 mode)
//! or `q8` (quantized per block of the weight's block size). Unset means
//! "as `--precision` says".
//!
//! `TAPTREE_LLAMACPP_FLASH_ATTN` (`0` or `1`) selects, under `--precision
//! llamacpp`, llama.cpp's flash attention instead of its plain attention (the
//! same variable switches it in the llama.cpp adapter's captures).
//! `TAPTREE_LLAMACPP_SIMD` (`avx2` or `avx512`) says, under `--precision
//! llamacpp`, which build of llama.cpp's CPU backend to model: its vector
//! width fixes the lane order of attention's sums
//! ([`crate::ggml_build::GgmlSimd`]). Unset, it is what `-march=native`
//! gives on this CPU, and a capture records that value.
//!
//! `TAPTREE_FAULT_TP_SKIP_ALLREDUCE=RANK@LAYER/STAGE` (`STAGE` `o_proj` or
//! `ffn_down`) is a **fault-injection** switch for testing the diff, not a
//! precision: under `--tp N` it leaves that rank's partial sum out of that
//! layer's all-reduce (`1@5/o_proj`). Other forwards refuse it.
//!
//! The switches that are set are recorded in the manifest's `run.switches`,
//! so `taptree bisect switches` can flip them.

use std::collections::BTreeMap;

use crate::forward::Precision;
use crate::ggml_build::GgmlSimd;

/// A family of matmuls that one switch controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// The q, k, v and o projections (`TAPTREE_ACT_ATTN`).
    Attn,
    /// The gate and up projections (`TAPTREE_ACT_FFN_UP`).
    FfnUp,
    /// The down projection (`TAPTREE_ACT_FFN_DOWN`).
    FfnDown,
    /// The output matmul (`TAPTREE_ACT_LOGITS`).
    Logits,
}

impl Family {
    /// Every family, in the order switches are listed.
    pub const ALL: [Family; 4] = [Family::Attn, Family::FfnUp, Family::FfnDown, Family::Logits];

    /// The environment variable that switches this family.
    pub fn var(self) -> &'static str {
        match self {
            Family::Attn => "TAPTREE_ACT_ATTN",
            Family::FfnUp => "TAPTREE_ACT_FFN_UP",
            Family::FfnDown => "TAPTREE_ACT_FFN_DOWN",
            Family::Logits => "TAPTREE_ACT_LOGITS",
        }
    }
}

/// Activation precision of one family's matmuls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActPrecision {
    /// Unquantized activations (the forward's float type).
    F32,
    /// Int8 per block, as llama.cpp's quantized dot products.
    Q8,
}

impl ActPrecision {
    /// The value a switch variable takes (`f32`, `q8`).
    pub fn name(self) -> &'static str {
        match self {
            ActPrecision::F32 => "f32",
            ActPrecision::Q8 => "q8",
        }
    }
}

/// A switch variable that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// A precision switch holds something other than `f32` or `q8`.
    #[error("{var}: bad value {value:?}: expected f32 or q8")]
    BadValue {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
    },
    /// A `TAPTREE_ACT_*` variable that names no matmul family.
    #[error("{var}: unknown precision switch (known: TAPTREE_ACT_ATTN, TAPTREE_ACT_FFN_UP, TAPTREE_ACT_FFN_DOWN, TAPTREE_ACT_LOGITS)")]
    Unknown {
        /// The variable.
        var: String,
    },
    /// `TAPTREE_LLAMACPP_FLASH_ATTN` holds something other than `0` or `1`.
    #[error("TAPTREE_LLAMACPP_FLASH_ATTN: bad value {value:?}: expected 0 or 1")]
    BadFlashAttn {
        /// The value given.
        value: String,
    },
    /// `TAPTREE_LLAMACPP_SIMD` holds something other than `avx2` or `avx512`.
    #[error("TAPTREE_LLAMACPP_SIMD: bad value {value:?}: expected avx2 or avx512")]
    BadSimd {
        /// The value given.
        value: String,
    },
    /// A fault switch that does not parse.
    #[error("TAPTREE_FAULT_TP_SKIP_ALLREDUCE: bad value {value:?}: expected RANK@LAYER/STAGE with STAGE o_proj or ffn_down, e.g. 1@5/o_proj")]
    BadTpSkip {
        /// The value given.
        value: String,
    },
}

/// The fault switch that drops one rank's partial sum from one all-reduce.
pub const TP_SKIP_VAR: &str = "TAPTREE_FAULT_TP_SKIP_ALLREDUCE";

/// A row-parallel stage whose partial sums an all-reduce adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduce {
    /// The attention output projection.
    OProj,
    /// The FFN down projection.
    FfnDown,
}

/// A planted tensor-parallel fault: `rank`'s partial sum of `stage` in
/// `layer` is left out of the all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TpSkip {
    /// The rank whose contribution is dropped.
    pub rank: usize,
    /// The layer.
    pub layer: usize,
    /// The all-reduced stage.
    pub stage: Reduce,
}

impl TpSkip {
    /// Parses `RANK@LAYER/STAGE`.
    pub fn parse(v: &str) -> Result<TpSkip, SwitchError> {
        let bad = || SwitchError::BadTpSkip {
            value: v.to_string(),
        };
        let (rank, rest) = v.trim().split_once('@').ok_or_else(bad)?;
        let (layer, stage) = rest.split_once('/').ok_or_else(bad)?;
        Ok(TpSkip {
            rank: rank.parse().map_err(|_| bad())?,
            layer: layer.parse().map_err(|_| bad())?,
            stage: match stage {
                "o_proj" => Reduce::OProj,
                "ffn_down" => Reduce::FfnDown,
                _ => return Err(bad()),
            },
        })
    }
}

impl std::fmt::Display for TpSkip {
    /// `1@5/o_proj`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stage = match self.stage {
            Reduce::OProj => "o_proj",
            Reduce::FfnDown => "ffn_down",
        };
        write!(f, "{}@{}/{stage}", self.rank, self.layer)
    }
}

/// The variable that selects llama.cpp's flash attention under
/// `--precision llamacpp`.
pub const FLASH_ATTN_VAR: &str = "TAPTREE_LLAMACPP_FLASH_ATTN";

/// The variable that names the llama.cpp build `--precision llamacpp`
/// models (`avx2` or `avx512`).
pub const SIMD_VAR: &str = "TAPTREE_LLAMACPP_SIMD";

/// The families whose activation precision is overridden, and whether
/// llama.cpp's flash attention is asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Switches {
    set: BTreeMap<Family, ActPrecision>,
    flash_attn: Option<bool>,
    simd: Option<GgmlSimd>,
    tp_skip: Option<TpSkip>,
}

impl Switches {
    /// No overrides: every family follows `--precision`.
    pub fn none() -> Switches {
        Switches::default()
    }

    /// Reads the `TAPTREE_ACT_*` variables of this process.
    pub fn from_env() -> Result<Switches, SwitchError> {
        Switches::from_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// Reads switches from `(name, value)` pairs; names outside the
    /// `TAPTREE_ACT_` prefix are ignored, a misspelt one is an error (a typo
    /// must not silently leave a family unswitched).
    pub fn from_vars<I, K, V>(vars: I) -> Result<Switches, SwitchError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut s = Switches::none();
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref());
            if k == FLASH_ATTN_VAR {
                s.flash_attn = Some(match v.trim() {
                    "0" => false,
                    "1" => true,
                    _ => {
                        return Err(SwitchError::BadFlashAttn {
                            value: v.to_string(),
                        })
                    }
                });
                continue;
            }
            if k == SIMD_VAR {
                s.simd = Some(GgmlSimd::parse(v).ok_or_else(|| SwitchError::BadSimd {
                    value: v.to_string(),
                })?);
                continue;
            }
            if k == TP_SKIP_VAR {
                s.tp_skip = Some(TpSkip::parse(v)?);
                continue;
            }
            if !k.starts_with("TAPTREE_ACT_") {
                continue;
            }
            let family = Family::ALL
                .into_iter()
                .find(|f| f.var() == k)
                .ok_or_else(|| SwitchError::Unknown { var: k.to_string() })?;
            let act = match v.trim() {
                "f32" => ActPrecision::F32,
                "q8" => ActPrecision::Q8,
                _ => {
                    return Err(SwitchError::BadValue {
                        var: k.to_string(),
                        value: v.to_string(),
                    })
                }
            };
            s.set.insert(family, act);
        }
        Ok(s)
    }

    /// Overrides one family.
    pub fn with(mut self, family: Family, act: ActPrecision) -> Switches {
        self.set.insert(family, act);
        self
    }

    /// Asks for llama.cpp's flash attention (or not) under `--precision llamacpp`.
    pub fn with_flash_attn(mut self, on: bool) -> Switches {
        self.flash_attn = Some(on);
        self
    }

    /// Names the llama.cpp build `--precision llamacpp` models.
    pub fn with_llamacpp_simd(mut self, simd: GgmlSimd) -> Switches {
        self.simd = Some(simd);
        self
    }

    /// The llama.cpp build asked for, if `TAPTREE_LLAMACPP_SIMD` is set.
    pub fn llamacpp_simd(&self) -> Option<GgmlSimd> {
        self.simd
    }

    /// These switches with what `precision` leaves to this machine made
    /// explicit, so a capture records what its forward ran: under
    /// `--precision llamacpp`, an unset `TAPTREE_LLAMACPP_SIMD` becomes this
    /// CPU's ([`GgmlSimd::host`]).
    pub fn resolved_for(mut self, precision: Precision) -> Switches {
        if precision == Precision::LlamaCpp && self.simd.is_none() {
            self.simd = Some(GgmlSimd::host());
        }
        self
    }

    /// Plants a tensor-parallel fault (see [`TpSkip`]).
    pub fn with_tp_skip(mut self, skip: TpSkip) -> Switches {
        self.tp_skip = Some(skip);
        self
    }

    /// The planted tensor-parallel fault, if any.
    pub fn tp_skip(&self) -> Option<TpSkip> {
        self.tp_skip
    }

    /// Whether llama.cpp's flash attention is asked for.
    pub fn flash_attn(&self) -> bool {
        self.flash_attn == Some(true)
    }

    /// Refuses switches that `precision` cannot honour (every backend asks):
    /// flash attention is llama.cpp's, modelled by `--precision llamacpp` only.
    pub fn check(&self, precision: Precision) -> Result<(), crate::forward::ForwardError> {
        if self.flash_attn() && precision != Precision::LlamaCpp {
            return Err(crate::forward::ForwardError::Unsupported(format!(
                "{FLASH_ATTN_VAR}=1: only --precision llamacpp models llama.cpp's flash attention (got {precision})"
            )));
        }
        if let (Some(simd), false) = (self.simd, precision == Precision::LlamaCpp) {
            return Err(crate::forward::ForwardError::Unsupported(format!(
                "{SIMD_VAR}={simd}: only --precision llamacpp models a llama.cpp build (got {precision})"
            )));
        }
        Ok(())
    }

    /// The override of `family`, if any.
    pub fn get(&self, family: Family) -> Option<ActPrecision> {
        self.set.get(&family).copied()
    }

    /// The activation precision `family` runs at under `precision`.
    pub fn resolve(&self, family: Family, precision: Precision) -> ActPrecision {
        self.get(family).unwrap_or(match precision {
            Precision::Q8 | Precision::LlamaCpp => ActPrecision::Q8,
            Precision::F32 | Precision::F64 => ActPrecision::F32,
        })
    }

    /// `{"TAPTREE_ACT_ATTN": "q8", ...}` for the manifest's `run.switches`.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m: BTreeMap<String, String> = self
            .set
            .iter()
            .map(|(f, a)| (f.var().to_string(), a.name().to_string()))
            .collect();
        if let Some(on) = self.flash_attn {
            m.insert(
                FLASH_ATTN_VAR.to_string(),
                if on { "1" } else { "0" }.into(),
            );
        }
        if let Some(simd) = self.simd {
            m.insert(SIMD_VAR.to_string(), simd.name().to_string());
        }
        if let Some(skip) = self.tp_skip {
            m.insert(TP_SKIP_VAR.to_string(), skip.to_string());
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_follows_precision() {
        let s = Switches::none();
        assert_eq!(s.resolve(Family::Attn, Precision::Q8), ActPrecision::Q8);
        assert_eq!(s.resolve(Family::Logits, Precision::F32), ActPrecision::F32);
        assert_eq!(
            s.resolve(Family::FfnDown, Precision::F64),
            ActPrecision::F32
        );
        assert!(s.to_map().is_empty());
    }

    #[test]
    fn overrides_and_records() {
        let s = Switches::from_vars([
            ("TAPTREE_ACT_FFN_DOWN", "q8"),
            ("TAPTREE_ACT_ATTN", "f32"),
            ("PATH", "/bin"),
        ])
        .unwrap();
        assert_eq!(s.resolve(Family::FfnDown, Precision::F32), ActPrecision::Q8);
        assert_eq!(s.resolve(Family::Attn, Precision::Q8), ActPrecision::F32);
        assert_eq!(s.resolve(Family::FfnUp, Precision::Q8), ActPrecision::Q8);
        let m = s.to_map();
        assert_eq!(m.len(), 2);
        assert_eq!(m["TAPTREE_ACT_FFN_DOWN"], "q8");
        assert_eq!(m["TAPTREE_ACT_ATTN"], "f32");
    }

    #[test]
    fn bad_value_names_the_variable() {
        let e = Switches::from_vars([("TAPTREE_ACT_LOGITS", "int4")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TAPTREE_ACT_LOGITS: bad value \"int4\": expected f32 or q8"
        );
    }

    #[test]
    fn flash_attention_is_a_recorded_switch() {
        let s = Switches::from_vars([("TAPTREE_LLAMACPP_FLASH_ATTN", "1")]).unwrap();
        assert!(s.flash_attn());
        assert_eq!(s.to_map()["TAPTREE_LLAMACPP_FLASH_ATTN"], "1");
        assert!(!Switches::none().flash_attn());
        let e = Switches::from_vars([("TAPTREE_LLAMACPP_FLASH_ATTN", "on")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TAPTREE_LLAMACPP_FLASH_ATTN: bad value \"on\": expected 0 or 1"
        );
    }

    #[test]
    fn the_llamacpp_build_is_a_recorded_switch_resolved_for_llamacpp_only() {
        let s = Switches::from_vars([(SIMD_VAR, "avx512")]).unwrap();
        assert_eq!(s.llamacpp_simd(), Some(GgmlSimd::Avx512));
        assert_eq!(s.to_map()[SIMD_VAR], "avx512");
        assert!(s.check(Precision::LlamaCpp).is_ok());
        let e = s.check(Precision::Q8).unwrap_err().to_string();
        assert!(e.contains("TAPTREE_LLAMACPP_SIMD=avx512"), "{e}");
        let e = Switches::from_vars([(SIMD_VAR, "avx-512")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TAPTREE_LLAMACPP_SIMD: bad value \"avx-512\": expected avx2 or avx512"
        );
        // Unset: recorded as this CPU's under llamacpp, absent otherwise.
        let host = Switches::none().resolved_for(Precision::LlamaCpp);
        assert_eq!(host.llamacpp_simd(), Some(GgmlSimd::host()));
        assert!(Switches::none()
            .resolved_for(Precision::F32)
            .to_map()
            .is_empty());
        // Set: kept as given.
        let kept = Switches::none()
            .with_llamacpp_simd(GgmlSimd::Avx2)
            .resolved_for(Precision::LlamaCpp);
        assert_eq!(kept.llamacpp_simd(), Some(GgmlSimd::Avx2));
    }

    #[test]
    fn the_tp_fault_is_a_recorded_switch() {
        let s = Switches::from_vars([(TP_SKIP_VAR, "1@5/o_proj")]).unwrap();
        let skip = s.tp_skip().unwrap();
        assert_eq!((skip.rank, skip.layer, skip.stage), (1, 5, Reduce::OProj));
        assert_eq!(s.to_map()[TP_SKIP_VAR], "1@5/o_proj");
        for bad in ["1@5", "1/o_proj", "a@5/o_proj", "1@5/attn", ""] {
            let e = Switches::from_vars([(TP_SKIP_VAR, bad)]).unwrap_err();
            assert!(e.to_string().starts_with(TP_SKIP_VAR), "{e}");
        }
    }

    #[test]
    fn misspelt_switch_is_an_error() {
        let e = Switches::from_vars([("TAPTREE_ACT_FFN_GATE", "q8")]).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("TAPTREE_ACT_FFN_GATE: unknown precision switch"));
    }
}
