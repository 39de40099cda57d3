//! Activation rows quantized to int8 per block of the weight's block size,
//! as llama.cpp quantizes a matmul's input (the `q8` mode; see
//! [`super::matmul`] for the dot product that reads them).

use super::Real;
use std::any::Any;
use std::cell::RefCell;

/// An activation row quantized per block: integer values (held as `T`, so the
/// block dot reuses [`super::rows::dot`] exactly), one scale per block, and for 32-blocks
/// the rounding of `block_q8_1`'s f16 sum `s = d * sum(q)` against
/// `f16(d) * sum(q)` (what a Q4_1 dot's min term sees).
#[derive(Debug, Clone)]
pub struct QuantRow<T> {
    /// The quantized values, held as `T` (integers).
    pub q: Vec<T>,
    /// One scale per block: a value is `q * d`.
    pub d: Vec<T>,
    /// Per block: `block_q8_1`'s f16 sum `s` minus `f16(d) * sum(q)` for
    /// 32-blocks, 0 for other block sizes.
    pub s_err: Vec<T>,
}

/// Quantizes `x` to int8 per block of `block` elements, in f32 as llama.cpp
/// does for the weight's dot product: `quantize_row_q8_0`/`q8_1` for 32-blocks
/// (`d = amax / 127` stored as f16, `q = round(x / d)`), and for 256-blocks
/// (K-quant weights) `quantize_row_q8_K` through
/// [`model::quant::quantize_row_q8_k`] (`d = -max / 127` in f32, round half
/// to even).
pub fn quantize_row<T: Real>(x: &[T], block: usize) -> QuantRow<T> {
    let mut out = QuantRow::default();
    quantize_row_into(x, block, &mut out);
    out
}

/// [`quantize_row`] written into `out`, whose vectors are reused (their
/// old values replaced; no allocation once they are large enough).
pub fn quantize_row_into<T: Real>(x: &[T], block: usize, out: &mut QuantRow<T>) {
    assert!(
        block > 0 && x.len().is_multiple_of(block),
        "row of {} is not a multiple of block {block}",
        x.len()
    );
    if block == 256 {
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let blocks = model::quant::quantize_row_q8_k(&xf).expect("whole blocks, checked above");
        out.clear();
        let values = blocks.iter().flat_map(|b| b.qs.iter());
        out.q.extend(values.map(|&v| T::from_f32(v as f32)));
        out.d.extend(blocks.iter().map(|b| T::from_f32(b.d)));
        out.s_err.resize(blocks.len(), T::ZERO);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::rows_avx::block_loops() {
        // SAFETY: the CPU has AVX2 (checked by `block_loops`).
        return unsafe { quantize_blocks_avx2(x, block, out) };
    }
    quantize_blocks(x, block, out)
}

impl<T> Default for QuantRow<T> {
    fn default() -> Self {
        QuantRow {
            q: Vec::new(),
            d: Vec::new(),
            s_err: Vec::new(),
        }
    }
}

impl<T> QuantRow<T> {
    /// Empties the vectors, keeping their memory.
    pub(crate) fn clear(&mut self) {
        self.q.clear();
        self.d.clear();
        self.s_err.clear();
    }
}

thread_local! {
    /// Quantized rows whose matmuls are done, kept by the thread that runs
    /// the forward for its next row pass to write into (one list per
    /// element type): a prefill's rows are then allocated once, not once a
    /// layer, and none is freed until the forward ends ([`release_spare`]).
    static SPARE: RefCell<Vec<Box<dyn Any + Send>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's spare rows of `T`.
fn with_spare<T: Send + 'static, R>(f: impl FnOnce(&mut Vec<QuantRow<T>>) -> R) -> R {
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let i = match s.iter().position(|b| b.is::<Vec<QuantRow<T>>>()) {
            Some(i) => i,
            None => {
                s.push(Box::new(Vec::<QuantRow<T>>::new()));
                s.len() - 1
            }
        };
        f(s[i].downcast_mut().expect("the list of this type"))
    })
}

/// `n` rows to quantize into: spare ones (their old values to be
/// overwritten) where this thread has them, empty ones for the rest.
pub(crate) fn take_rows<T: Send + 'static>(n: usize) -> Vec<QuantRow<T>> {
    let mut rows = with_spare::<T, _>(|s| s.split_off(s.len().saturating_sub(n)));
    rows.resize_with(n, QuantRow::default);
    rows
}

/// Keeps `rows` (their matmuls done) for [`take_rows`] on this thread.
pub(crate) fn give_back<T: Send + 'static>(mut rows: Vec<QuantRow<T>>) {
    with_spare::<T, _>(|s| s.append(&mut rows));
}

/// Frees this thread's spare rows, on rayon's pool (a prefill's: hundreds
/// of vectors, allocated on the team's threads): called when a forward of
/// several rows ends, so that what its row passes needed is not held after.
pub(crate) fn release_spare() {
    let lists = SPARE.with(|s| std::mem::take(&mut *s.borrow_mut()));
    if !lists.is_empty() {
        rayon::spawn(move || drop(lists));
    }
}

/// [`quantize_blocks`] compiled for AVX2: `round` becomes a few vector
/// instructions instead of a call to the C library's `roundf` per value
/// (both round half away from zero, exactly), and the rest the same
/// operations in the same order: the same values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_blocks_avx2<T: Real>(x: &[T], block: usize, out: &mut QuantRow<T>) {
    quantize_blocks(x, block, out)
}

/// [`quantize_row`] for blocks other than 256.
#[inline(always)]
fn quantize_blocks<T: Real>(x: &[T], block: usize, out: &mut QuantRow<T>) {
    out.clear();
    let QuantRow { q, d, s_err } = out;
    q.reserve(x.len());
    d.reserve(x.len() / block);
    s_err.reserve(x.len() / block);
    for b in x.chunks_exact(block) {
        // A 32-block in vector registers where there is a loop for it.
        let at = q.len();
        q.resize(at + block, T::ZERO);
        let fast = if block == 32 {
            T::quant_block32_fast(b, &mut q[at..])
        } else {
            None
        };
        let (scale, sum) = fast.unwrap_or_else(|| quantize_block(b, &mut q[at..]));
        // block_q8_0/q8_1 store the scale as f16, block_q8_K as f32; the
        // quantized values above use the unrounded scale, as llama.cpp does.
        if block == 32 {
            let stored = half::f16::from_f32(scale).to_f32();
            let s = half::f16::from_f32(sum as f32 * scale).to_f32();
            d.push(T::from_f32(stored));
            s_err.push(T::from_f64(s as f64 - stored as f64 * sum as f64));
        } else {
            d.push(T::from_f32(scale));
            s_err.push(T::ZERO);
        }
    }
}

/// One block `b` quantized into `q`: `scale = max |x| / 127`, each value
/// `round(x / scale)` (half away from zero) clamped to ±127; returns the
/// scale and the sum of the values.
#[inline(always)]
fn quantize_block<T: Real>(b: &[T], q: &mut [T]) -> (f32, i32) {
    let amax = b.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
    let scale = amax / 127.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (v, qv) in b.iter().zip(q) {
        let r = (v.to_f32() * inv).round().clamp(-127.0, 127.0);
        sum += r as i32;
        *qv = T::from_f32(r);
    }
    (scale, sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::rows::Dots;

    /// The vector block gives the scalar block's values, scale and sum bit
    /// for bit: on halves (away from zero), on values that round to -0, on
    /// signed zeros, subnormals, huge values and blocks of zeros; it leaves
    /// blocks with a NaN or an infinity to the scalar loop. A changed value
    /// moves its quantized value (the comparison can fail).
    #[test]
    fn the_vector_block_gives_the_scalar_blocks_bits() {
        if f32::quant_block32_fast(&[0.0; 32], &mut [0.0; 32]).is_none() {
            eprintln!("skipped: no vector loop for a 32-block on this CPU");
            return;
        }
        let mut s = 0x9E37_79B9u32;
        let mut next = move || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            s
        };
        let mut blocks: Vec<Vec<f32>> = vec![
            vec![0.0; 32],
            (0..32)
                .map(|i| if i % 2 == 0 { -0.0 } else { 0.0 })
                .collect(),
            (0..32).map(|i| i as f32 - 15.5).collect(),
            (0..32)
                .map(|i| (i as f32 - 16.0) * 0.4 / 127.0 * 127.0)
                .collect(),
            (0..32).map(|i| f32::from_bits(i + 1)).collect(),
            (0..32).map(|i| (i as f32 - 16.0) * 1e37).collect(),
        ];
        // Halves and near-halves: amax 127 makes x / scale = x.
        let mut halves: Vec<f32> = (0..31).map(|i| (i as f32 - 15.0) + 0.5).collect();
        halves.push(127.0);
        blocks.push(halves);
        let mut neg: Vec<f32> = (0..31).map(|i| -0.4 - i as f32 * 0.001).collect();
        neg.push(127.0);
        blocks.push(neg);
        for _ in 0..2000 {
            let e = (next() % 40) as i32 - 20;
            blocks.push(
                (0..32)
                    .map(|_| ((next() >> 8) as f32 / (1 << 24) as f32 - 0.5) * 2f32.powi(e))
                    .collect(),
            );
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for (i, b) in blocks.iter().enumerate() {
            let (mut got, mut want) = ([0f32; 32], [0f32; 32]);
            let fast = f32::quant_block32_fast(b, &mut got).expect("no NaN here");
            let slow = quantize_block(b, &mut want);
            assert_eq!(bits(&got), bits(&want), "block {i}: {b:?}");
            assert_eq!(
                (fast.0.to_bits(), fast.1),
                (slow.0.to_bits(), slow.1),
                "block {i}"
            );
        }
        // Halves away from zero; what rounds to zero keeps its sign.
        let (mut h, mut z) = ([0f32; 32], [0f32; 32]);
        f32::quant_block32_fast(&blocks[6], &mut h);
        f32::quant_block32_fast(&blocks[7], &mut z);
        assert_eq!((blocks[6][0], h[0], h[1]), (-14.5, -15.0, -14.0));
        assert_eq!(z[0].to_bits(), (-0f32).to_bits());
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut b = blocks[9].clone();
            b[5] = bad;
            let mut untouched = [1f32; 32];
            assert!(
                f32::quant_block32_fast(&b, &mut untouched).is_none(),
                "{bad}"
            );
            assert_eq!(untouched, [1.0; 32], "{bad}: nothing written");
        }
        let mut b = blocks[9].clone();
        let (mut before, mut after) = ([0f32; 32], [0f32; 32]);
        f32::quant_block32_fast(&b, &mut before);
        b[3] += b.iter().fold(0f32, |m, v| m.max(v.abs())) / 20.0;
        f32::quant_block32_fast(&b, &mut after);
        assert_ne!(before[3], after[3], "a changed value moved nothing");
    }

    /// The AVX2 build of the loop gives the portable build's values, on
    /// rows whose scaled values fall exactly halfway between integers
    /// (where rounding half away from zero and half to even part) and on
    /// others; a changed input moves its block's values.
    #[test]
    fn the_vector_build_rounds_as_the_portable_one() {
        // Block 0: amax 127, so x / d = x: halves round away from zero.
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        x[31] = 127.0;
        x.extend((0..64).map(|i| ((i as f32) * 0.37).sin() * 3.0));
        let got = quantize_row(&x, 32);
        let mut want = QuantRow::default();
        quantize_blocks(&x, 32, &mut want);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.q), bits(&want.q));
        assert_eq!(bits(&got.d), bits(&want.d));
        assert_eq!(bits(&got.s_err), bits(&want.s_err));
        assert_eq!(got.q[0], -16.0, "-15.5 rounds away from zero");
        assert_eq!(got.q[2], -14.0, "-13.5 rounds away from zero");
        let mut y = x.clone();
        y[40] += 0.5;
        let moved = quantize_row(&y, 32);
        assert_ne!(bits(&moved.q[32..64]), bits(&got.q[32..64]));
        assert_eq!(bits(&moved.q[..32]), bits(&got.q[..32]));
    }

    /// A row quantized into a spare row (holding another, longer row's
    /// values) has the bits of one quantized afresh, for 32- and 256-blocks
    /// and llama.cpp's quantizer; and rows given back come out of
    /// `take_rows` again, the others empty.
    #[test]
    fn a_reused_row_holds_only_its_new_values() {
        let x: Vec<f32> = (0..512).map(|i| ((i as f32) * 0.61).sin() * 4.0).collect();
        let long: Vec<f32> = (0..1024).map(|i| ((i as f32) * 0.13).cos() * 9.0).collect();
        let bits = |r: &QuantRow<f32>| {
            let b = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            (b(&r.q), b(&r.d), b(&r.s_err))
        };
        type Into = fn(&[f32], usize, &mut QuantRow<f32>);
        let quantizers: [(Into, &str); 2] = [
            (quantize_row_into, "q8"),
            (crate::cpu::llamacpp::quantize_row_into, "llama.cpp"),
        ];
        for (into, name) in quantizers {
            for block in [32, 256] {
                let mut fresh = QuantRow::default();
                into(&x, block, &mut fresh);
                let mut reused = QuantRow::default();
                into(&long, block, &mut reused);
                into(&x, block, &mut reused);
                assert_eq!(bits(&reused), bits(&fresh), "{name}, block {block}");
                assert_eq!(reused.q.len(), x.len(), "{name}, block {block}");
            }
        }
        let mut row = QuantRow::default();
        quantize_row_into(&long, 32, &mut row);
        let spare: Vec<QuantRow<f32>> = vec![row];
        give_back(spare);
        let rows = take_rows::<f32>(3);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows.iter().filter(|r| r.q.len() == long.len()).count(), 1);
        assert!(take_rows::<f32>(1)[0].q.is_empty(), "the spare was taken");
        release_spare();
    }
}
