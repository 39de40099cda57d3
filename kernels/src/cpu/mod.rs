//! The CPU reference forward: ndarray-free, rayon-parallel, bit-for-bit
//! deterministic, generic over the activation type (`f32` or `f64`).
//!
//! One file per op family — [`norm`], [`matmul`], [`rope`], [`attention`],
//! [`ffn`], [`embedding`], [`residual`] — and [`forward`] strings them together into
//! [`CpuForward`], which implements [`crate::Forward`] and taps every stage of
//! [`crate::stages::llama`] in forward order.
//!
//! Determinism: every reduction runs in a fixed order inside one task; the
//! parallel regions (`par`: a team of `RAYON_NUM_THREADS` threads, or
//! rayon's) only split work over independent outputs (matrix rows,
//! attention heads), so the thread count never changes a bit of the result.

pub mod attention;
pub mod embedding;
pub mod ffn;
pub mod forward;
pub mod fused;
pub mod llamacpp;
pub mod llamacpp_dot;
pub mod llamacpp_gemma;
mod llamacpp_simd;
pub mod matmul;
pub mod norm;
mod par;
pub(crate) mod profile;
pub mod qmatrix;
pub mod quant_row;
pub mod residual;
pub mod rope;
pub mod rows;
mod rows_avx;
mod rows_avx512;
pub mod tp;
pub mod weights;

pub use forward::CpuForward;

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

/// An activation element type: `f32` for the `f32`/`q8` modes, `f64` for the
/// truth. Weights stay `f32` (dequantized once); `from_f32` widens them
/// exactly in f64 mode.
pub trait Real:
    capture::TapElem
    + rows::Dots
    + Copy
    + Default
    + Debug
    + PartialOrd
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// `v` as `Self` (exact: f32 is the narrowest `Real`).
    fn from_f32(v: f32) -> Self;
    /// `v` as `Self`, rounded to nearest when `Self` is f32.
    fn from_f64(v: f64) -> Self;
    /// Widened to f64 (exact).
    fn to_f64(self) -> f64;
    /// `self` as f32, rounded to nearest when `Self` is f64.
    fn to_f32(self) -> f32;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// Nearest integer, halves away from zero (`f32::round`).
    fn round(self) -> Self;
}

macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn round(self) -> Self {
                <$t>::round(self)
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);

/// Runs `f(input row, output row)` over the rows of `x` and `y` (both
/// `width` wide): on rayon's threads when there are enough elements for it
/// to pay (a prefill), else in this thread (a decode step). Each row is one
/// call, so the result is the same either way.
pub(crate) fn par_rows<T: Real, U: Send, F>(y: &mut [U], x: &[T], width: usize, f: F)
where
    F: Fn(&[T], &mut [U]) + Sync,
{
    if width == 0 {
        return;
    }
    let rows = x.len() / width;
    let out_width = y.len() / rows.max(1);
    if par::worth(x.len(), rows) {
        par::chunks_map(y, out_width, |i, o| f(&x[i * width..(i + 1) * width], o));
    } else {
        y.chunks_mut(out_width.max(1))
            .zip(x.chunks(width))
            .for_each(|(o, r)| f(r, o));
    }
}

/// Taps `data` (`[rows, width]`, rows = positions) when capture is armed.
///
/// The disarmed cost is one relaxed load and a branch: every caller passes a
/// buffer the forward computed anyway, so nothing is built for the tap.
#[inline(always)]
pub(crate) fn tap<T: Real>(
    stage: &str,
    layer: Option<u32>,
    pos: std::ops::Range<u32>,
    slot: Option<u32>,
    width: usize,
    data: &[T],
) {
    if capture::is_armed() {
        let _p = profile::op(profile::Op::Tap);
        let shape = tap_shape(stage, &pos, width, data.len());
        capture::tap(stage, layer, pos, slot, &shape, data);
    }
}

/// A tap's shape, `[rows, width]` with a row per position of `pos`, for
/// `len` elements.
#[inline(always)]
fn tap_shape(stage: &str, pos: &std::ops::Range<u32>, width: usize, len: usize) -> [usize; 2] {
    let rows = pos.len();
    debug_assert_eq!(rows * width, len, "{stage}: tap shape");
    [rows, width]
}

/// [`tap`] of a buffer the forward is done with: the capture keeps it
/// rather than copying it when it keeps every row (`capture::tap_owned`).
pub(crate) fn tap_owned<T: Real>(
    stage: &str,
    layer: Option<u32>,
    pos: std::ops::Range<u32>,
    slot: Option<u32>,
    width: usize,
    data: Vec<T>,
) {
    if capture::is_armed() {
        let _p = profile::op(profile::Op::Tap);
        let shape = tap_shape(stage, &pos, width, data.len());
        capture::tap_owned(stage, layer, pos, slot, &shape, data);
    }
}
