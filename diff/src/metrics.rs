//! Comparison metrics of two tensors (or two rows of them), accumulated in f64.
//!
//! One pass over the elements fills an [`Acc`]; accumulators of several
//! positions merge, and [`Acc::metrics`] derives the reported [`Metrics`].
//! A is the reference: NMSE and SQNR divide by A's energy.
//!
//! Definitions (documented in docs/GUIDE.md):
//! - cosine: `a·b / (|a| |b|)`; 1 when both norms are zero, 0 when one is.
//! - max abs: `max |a - b|`; max rel: `max |a - b| / max(|a|, |b|)` (0 where
//!   both are 0, so it lies in [0, 2]).
//! - RMSE `sqrt(mean (a-b)^2)`; NMSE `sum (a-b)^2 / sum a^2` (0 when both sums
//!   are 0, infinite when only A is zero); SQNR dB `-10 log10(NMSE)`.
//! - max ULP: the distance between the two values' positions in the ordered
//!   set of representable values of the stored dtype (`-0.0` and `0.0` are
//!   the same point); for integer dtypes, the absolute difference. Undefined
//!   (None) when the dtypes differ.
//! - Only pairs where both values are finite enter the sums above. A pair
//!   where one side is NaN/Inf and the other is not, or both are nonfinite of
//!   different kinds, is a nonfinite mismatch: always red.

use capture::DType;
use serde::{Deserialize, Serialize};

mod pass;
use pass::run;

/// An element type the comparator reads straight from little-endian bytes.
pub(crate) trait Elem: Copy {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> Self;
    fn to_f64(self) -> f64;
    /// Raw bits, for bitwise equality.
    fn bits(self) -> u64;
    /// Distance between two values, given as [`Elem::bits`] of this type,
    /// in the ordered set of representable values (`-0.0` and `0.0` are one
    /// point).
    fn ulp(a: u64, b: u64) -> u64;
}

macro_rules! float_elem {
    ($t:ty, $bits:ty, $signed:ty, $wide:ty, $size:expr, $from:expr, $tof64:expr) => {
        impl Elem for $t {
            const SIZE: usize = $size;
            #[inline(always)]
            fn read(bytes: &[u8]) -> Self {
                let raw = <$bits>::from_le_bytes(bytes[..$size].try_into().unwrap());
                $from(raw)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $tof64(self)
            }
            #[inline(always)]
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
            #[inline(always)]
            fn ulp(a: u64, b: u64) -> u64 {
                // Sign-magnitude to two's complement: negative floats count
                // down from zero, so adjacent values differ by one.
                let ord = |bits: u64| {
                    let i = bits as $bits as $signed;
                    (if i < 0 {
                        <$signed>::MIN.wrapping_sub(i)
                    } else {
                        i
                    }) as $wide
                };
                (ord(a) - ord(b)).unsigned_abs().min(u64::MAX as _) as u64
            }
        }
    };
}

float_elem!(f32, u32, i32, i64, 4, f32::from_bits, |x: f32| x as f64);
float_elem!(f64, u64, i64, i128, 8, f64::from_bits, |x: f64| x);
float_elem!(
    half::f16,
    u16,
    i16,
    i64,
    2,
    half::f16::from_bits,
    |x: half::f16| f16_to_f64(x.to_bits())
);
float_elem!(
    half::bf16,
    u16,
    i16,
    i64,
    2,
    half::bf16::from_bits,
    // bf16 is the top half of an f32: a shift, exact for every value.
    |x: half::bf16| f32::from_bits((x.to_bits() as u32) << 16) as f64
);

/// f16 bits to f64, exactly, with selects the compiler can vectorize (the
/// `half` conversion is a per-element call). Checked against `half` for all
/// 65,536 values in the tests below.
#[inline(always)]
fn f16_to_f64(h: u16) -> f64 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = h & 0x3ff;
    let normal = f32::from_bits(sign | ((exp + 112) << 23) | (man << 13));
    let special = f32::from_bits(sign | 0x7f80_0000 | (man << 13));
    // Subnormals (and zeros) are man * 2^-24.
    let small = man as f32 * (1.0 / 16_777_216.0);
    let small = if sign != 0 { -small } else { small };
    let v = if exp == 0 {
        small
    } else if exp == 0x1f {
        special
    } else {
        normal
    };
    v as f64
}

macro_rules! int_elem {
    ($t:ty, $size:expr) => {
        impl Elem for $t {
            const SIZE: usize = $size;
            #[inline(always)]
            fn read(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes[..$size].try_into().unwrap())
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn bits(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn ulp(a: u64, b: u64) -> u64 {
                (a as $t as i64 - b as $t as i64).unsigned_abs()
            }
        }
    };
}

int_elem!(i8, 1);
int_elem!(i32, 4);

/// Mergeable raw sums of one comparison. Build with [`compare`], combine
/// positions with [`Acc::merge`], read with [`Acc::metrics`].
#[derive(Debug, Clone, PartialEq)]
pub struct Acc {
    /// Element pairs seen (finite or not).
    pub n: u64,
    /// Pairs where both values are finite.
    pub finite: u64,
    /// Σ a·b over finite pairs.
    pub sum_ab: f64,
    /// Σ a² over finite pairs.
    pub sum_aa: f64,
    /// Σ b² over finite pairs.
    pub sum_bb: f64,
    /// Σ (a − b)² over finite pairs.
    pub sum_dd: f64,
    /// The largest |a − b| over finite pairs.
    pub max_abs: f64,
    /// The largest |a − b| / max(|a|, |b|) over finite pairs (0 where both are 0).
    pub max_rel: f64,
    /// None when the two dtypes differ (ULP distance is undefined).
    pub max_ulp: Option<u64>,
    /// Pairs whose bits are equal.
    pub bitwise_equal: u64,
    /// Values of A that are NaN or infinite.
    pub nonfinite_a: u64,
    /// Values of B that are NaN or infinite.
    pub nonfinite_b: u64,
    /// Pairs where one side is nonfinite and the other is not, or both are of
    /// different kinds.
    pub nonfinite_mismatch: u64,
    /// Values of A that are exactly zero.
    pub zero_a: u64,
    /// Values of B that are exactly zero.
    pub zero_b: u64,
    /// Elements equal to the row's first value, per side. Exact only when
    /// all are (the fast path counts whole constant blocks): `same == n`
    /// means constant, which is all it is for.
    pub same_a: u64,
    /// See `same_a`.
    pub same_b: u64,
    /// Argmax of each side over its finite values (index within the row).
    pub argmax_a: Option<u64>,
    /// See `argmax_a`; `None` after a merge.
    pub argmax_b: Option<u64>,
    /// Rows merged in (argmax agreement is counted per row).
    pub rows: u64,
    /// Rows whose argmax agrees.
    pub argmax_agree: u64,
    /// Width of the narrowest row merged in (constant needs width >= 2).
    pub min_width: u64,
}

impl Default for Acc {
    fn default() -> Acc {
        Acc {
            n: 0,
            finite: 0,
            sum_ab: 0.0,
            sum_aa: 0.0,
            sum_bb: 0.0,
            sum_dd: 0.0,
            max_abs: 0.0,
            max_rel: 0.0,
            max_ulp: Some(0),
            bitwise_equal: 0,
            nonfinite_a: 0,
            nonfinite_b: 0,
            nonfinite_mismatch: 0,
            zero_a: 0,
            zero_b: 0,
            same_a: 0,
            same_b: 0,
            argmax_a: None,
            argmax_b: None,
            rows: 0,
            argmax_agree: 0,
            min_width: u64::MAX,
        }
    }
}

/// The derived metrics of a comparison, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Element pairs compared.
    pub n: u64,
    /// Cosine similarity, `a·b / (|a| |b|)`: 1 when both norms are zero, 0 when one is.
    pub cos: f64,
    /// `max |a − b|`.
    pub max_abs: f64,
    /// `max |a − b| / max(|a|, |b|)`, in [0, 2].
    pub max_rel: f64,
    /// `sqrt(mean (a − b)²)` over finite pairs.
    pub rmse: f64,
    /// `Σ (a − b)² / Σ a²`: 0 when both are 0, infinite when only A's energy is.
    pub nmse: f64,
    /// `−10 log10(nmse)` in dB; infinite when NMSE is 0.
    pub sqnr_db: f64,
    /// The largest distance in representable values of the stored dtype; `None`
    /// when the dtypes differ.
    pub max_ulp: Option<u64>,
    /// Pairs whose bits are equal.
    pub bitwise_equal: u64,
    /// Rows whose argmax agrees, out of `rows` (meaningful for logits).
    pub argmax_agree: u64,
    /// Rows compared.
    pub rows: u64,
    /// Values of A that are NaN or infinite.
    pub nonfinite_a: u64,
    /// Values of B that are NaN or infinite.
    pub nonfinite_b: u64,
    /// Pairs nonfinite on one side only, or of different kinds; always red.
    pub nonfinite_mismatch: u64,
    /// Values of A that are exactly zero.
    pub zero_a: u64,
    /// Values of B that are exactly zero.
    pub zero_b: u64,
    /// `sqrt(nmse)`: the error relative to A's magnitude (error growth uses it).
    pub rel_rms: f64,
    /// Why a side is degenerate (all zero, all nonfinite, constant), if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degenerate_a: Option<Degeneracy>,
    /// Why B is degenerate, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degenerate_b: Option<Degeneracy>,
}

/// A tensor (row) that carries no information: agreement with it proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Degeneracy {
    /// Every value is exactly zero.
    AllZero,
    /// Every value is NaN or infinite.
    AllNonfinite,
    /// Every value of a row (of width 2 or more) is the same.
    Constant,
}

impl std::fmt::Display for Degeneracy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Degeneracy::AllZero => "all zero",
            Degeneracy::AllNonfinite => "all nonfinite",
            Degeneracy::Constant => "constant",
        })
    }
}

impl Acc {
    /// Identity metrics of `n` elements in `rows` rows known equal by hash,
    /// without reading them.
    pub fn identical(n: u64, rows: u64) -> Acc {
        Acc {
            n,
            finite: n,
            bitwise_equal: n,
            rows,
            argmax_agree: rows,
            // Energies unknown and left at zero: cosine 1 and NMSE 0, which
            // is what identity means, and merging adds nothing false.
            ..Acc::default()
        }
    }

    /// Combines two accumulators (positions of one row, rows of one stage).
    pub fn merge(&mut self, o: &Acc) {
        self.n += o.n;
        self.finite += o.finite;
        self.sum_ab += o.sum_ab;
        self.sum_aa += o.sum_aa;
        self.sum_bb += o.sum_bb;
        self.sum_dd += o.sum_dd;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.max_rel = self.max_rel.max(o.max_rel);
        self.max_ulp = match (self.max_ulp, o.max_ulp) {
            (Some(x), Some(y)) => Some(x.max(y)),
            _ => None,
        };
        self.bitwise_equal += o.bitwise_equal;
        self.nonfinite_a += o.nonfinite_a;
        self.nonfinite_b += o.nonfinite_b;
        self.nonfinite_mismatch += o.nonfinite_mismatch;
        self.zero_a += o.zero_a;
        self.zero_b += o.zero_b;
        self.same_a += o.same_a;
        self.same_b += o.same_b;
        self.rows += o.rows;
        self.argmax_agree += o.argmax_agree;
        self.min_width = self.min_width.min(o.min_width);
        // A merged argmax has no single index; agreement is already counted.
        self.argmax_a = None;
        self.argmax_b = None;
    }

    fn degeneracy(n: u64, nonfinite: u64, zero: u64, same: u64, width: u64) -> Option<Degeneracy> {
        if n == 0 {
            None
        } else if nonfinite == n {
            Some(Degeneracy::AllNonfinite)
        } else if zero == n {
            Some(Degeneracy::AllZero)
        } else if same == n && width >= 2 {
            Some(Degeneracy::Constant)
        } else {
            None
        }
    }

    /// Derives the reported metrics.
    pub fn metrics(&self) -> Metrics {
        let (aa, bb) = (self.sum_aa, self.sum_bb);
        let cos = if aa == 0.0 && bb == 0.0 {
            1.0
        } else if aa == 0.0 || bb == 0.0 {
            0.0
        } else {
            (self.sum_ab / (aa.sqrt() * bb.sqrt())).clamp(-1.0, 1.0)
        };
        let nmse = if self.sum_dd == 0.0 {
            0.0
        } else if aa == 0.0 {
            f64::INFINITY
        } else {
            self.sum_dd / aa
        };
        let rmse = if self.finite == 0 {
            0.0
        } else {
            (self.sum_dd / self.finite as f64).sqrt()
        };
        let sqnr_db = if nmse == 0.0 {
            f64::INFINITY
        } else {
            -10.0 * nmse.log10()
        };
        // Constant detection only means something within one row.
        let width = if self.rows <= 1 { self.min_width } else { 0 };
        Metrics {
            n: self.n,
            cos,
            max_abs: self.max_abs,
            max_rel: self.max_rel,
            rmse,
            nmse,
            sqnr_db,
            max_ulp: self.max_ulp,
            bitwise_equal: self.bitwise_equal,
            argmax_agree: self.argmax_agree,
            rows: self.rows,
            nonfinite_a: self.nonfinite_a,
            nonfinite_b: self.nonfinite_b,
            nonfinite_mismatch: self.nonfinite_mismatch,
            zero_a: self.zero_a,
            zero_b: self.zero_b,
            rel_rms: nmse.sqrt(),
            degenerate_a: Self::degeneracy(
                self.n,
                self.nonfinite_a,
                self.zero_a,
                self.same_a,
                width,
            ),
            degenerate_b: Self::degeneracy(
                self.n,
                self.nonfinite_b,
                self.zero_b,
                self.same_b,
                width,
            ),
        }
    }
}

impl Metrics {
    /// Every element pair bitwise equal.
    pub fn bitwise(&self) -> bool {
        self.bitwise_equal == self.n
    }
}

/// Compares one row of A with one row of B, both raw little-endian bytes of
/// their dtypes. The element counts must match (the caller checks shapes).
pub fn compare(a: &[u8], da: DType, b: &[u8], db: DType) -> Acc {
    use DType::*;
    match (da, db) {
        (F32, F32) => run::<f32, f32, true>(a, b),
        (F16, F16) => run::<half::f16, half::f16, true>(a, b),
        (BF16, BF16) => run::<half::bf16, half::bf16, true>(a, b),
        (F64, F64) => run::<f64, f64, true>(a, b),
        (I8, I8) => run::<i8, i8, true>(a, b),
        (I32, I32) => run::<i32, i32, true>(a, b),
        // The truth is usually F64 against F32 captures.
        (F64, F32) => run::<f64, f32, false>(a, b),
        (F32, F64) => run::<f32, f64, false>(a, b),
        _ => {
            let (xa, xb) = (decode(a, da), decode(b, db));
            let (ba, bb) = (f64_bytes(&xa), f64_bytes(&xb));
            // Not `SAME`: bits of different dtypes are never counted equal.
            run::<f64, f64, false>(&ba, &bb)
        }
    }
}

/// Decodes raw bytes of `dtype` into f64 (used off the hot path).
pub fn decode(bytes: &[u8], dtype: DType) -> Vec<f64> {
    fn go<T: Elem>(bytes: &[u8]) -> Vec<f64> {
        bytes
            .chunks_exact(T::SIZE)
            .map(|c| T::read(c).to_f64())
            .collect()
    }
    match dtype {
        DType::F32 => go::<f32>(bytes),
        DType::F16 => go::<half::f16>(bytes),
        DType::BF16 => go::<half::bf16>(bytes),
        DType::F64 => go::<f64>(bytes),
        DType::I8 => go::<i8>(bytes),
        DType::I32 => go::<i32>(bytes),
    }
}

fn f64_bytes(x: &[f64]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f64();
            let got = f16_to_f64(bits);
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{bits:#06x}: {got} vs {want}"
                );
            }
        }
    }
}
