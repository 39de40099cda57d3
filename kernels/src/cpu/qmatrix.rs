//! Weight matrices as the CPU forward holds them: quantized formats stay in
//! their GGUF blocks ([`QMatrix`], 4.5 bits a weight for Q4_1 instead of 32)
//! and are dequantized a few rows at a time where a matmul or the embedding
//! reads them; float formats are held as f32 ([`Matrix`]).
//!
//! A row dequantized here is bit for bit the row [`model::quant::dequantize`]
//! writes (the same expressions in the same order; a test checks every
//! format), so matmuls over a [`QMatrix`] equal those over its dequantized
//! [`Matrix`] exactly.

use model::quant::{self, GgmlType};
use model::TensorBytes;

/// A `[rows, cols]` weight in a block-quantized GGUF format, rows contiguous.
#[derive(Debug, Clone)]
pub struct QMatrix {
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of the type's block size).
    pub cols: usize,
    /// The block format of `bytes`.
    pub ty: GgmlType,
    /// Rows of GGUF blocks, as the file holds them: shared with the loaded
    /// model (a slice of the GGUF file's map when it came from one), so
    /// holding them copies nothing.
    pub bytes: TensorBytes,
}

impl QMatrix {
    /// The raw bytes of rows `r..r + k`, back to back.
    #[inline(always)]
    fn rows_bytes(&self, r: usize, k: usize) -> &[u8] {
        let n = self.ty.row_bytes(self.cols);
        &self.bytes[r * n..(r + k) * n]
    }

    /// Dequantizes row `r` into `out` (`cols` long).
    #[inline(always)]
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize_blocks(self.ty, self.rows_bytes(r, 1), out);
    }
}

/// A weight matrix `[rows, cols]` = `[out_features, in_features]`, dequantized.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Row-major `[rows, cols]` values.
    pub data: Vec<f32>,
    /// Block size of the source format; 1 for float formats, whose matmuls
    /// llama.cpp runs without quantizing the activations.
    pub block: usize,
}

impl Matrix {
    /// Row `r` (`cols` values).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// Something a matmul reads weight rows from.
pub trait WeightRows: Sync {
    /// Output features.
    fn rows(&self) -> usize;
    /// Input features.
    fn cols(&self) -> usize;
    /// Block size of the source format; 1 for float formats.
    fn block(&self) -> usize;
    /// Row `r` as f32: borrowed when held as f32, else dequantized into
    /// `buf` (`cols` long).
    fn row_in<'a>(&'a self, r: usize, buf: &'a mut [f32]) -> &'a [f32];
    /// Row `r`'s raw blocks and their format, when held quantized (for the
    /// loops that dequantize in registers); `None` when held as f32.
    fn blocks(&self, r: usize) -> Option<(GgmlType, &[u8])> {
        self.block_rows(r, 1)
    }
    /// Rows `r..r + k`'s raw blocks, back to back, and their format, when
    /// held quantized; `None` when held as f32.
    fn block_rows(&self, _r: usize, _k: usize) -> Option<(GgmlType, &[u8])> {
        None
    }
}

impl WeightRows for Matrix {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn block(&self) -> usize {
        self.block
    }
    #[inline(always)]
    fn row_in<'a>(&'a self, r: usize, _buf: &'a mut [f32]) -> &'a [f32] {
        self.row(r)
    }
}

impl WeightRows for QMatrix {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn block(&self) -> usize {
        self.ty.block_size()
    }
    #[inline(always)]
    fn row_in<'a>(&'a self, r: usize, buf: &'a mut [f32]) -> &'a [f32] {
        self.dequantize_row(r, buf);
        buf
    }
    #[inline(always)]
    fn block_rows(&self, r: usize, k: usize) -> Option<(GgmlType, &[u8])> {
        Some((self.ty, self.rows_bytes(r, k)))
    }
}

/// A weight of either kind.
#[derive(Debug, Clone)]
pub enum Weight {
    /// A float weight, held as f32.
    Dense(Matrix),
    /// A block-quantized weight, held in its GGUF blocks.
    Quant(QMatrix),
}

impl WeightRows for Weight {
    fn rows(&self) -> usize {
        match self {
            Weight::Dense(m) => m.rows,
            Weight::Quant(q) => q.rows,
        }
    }
    fn cols(&self) -> usize {
        match self {
            Weight::Dense(m) => m.cols,
            Weight::Quant(q) => q.cols,
        }
    }
    fn block(&self) -> usize {
        match self {
            Weight::Dense(m) => m.block,
            Weight::Quant(q) => q.ty.block_size(),
        }
    }
    #[inline(always)]
    fn row_in<'a>(&'a self, r: usize, buf: &'a mut [f32]) -> &'a [f32] {
        match self {
            Weight::Dense(m) => m.row(r),
            Weight::Quant(q) => q.row_in(r, buf),
        }
    }
    #[inline(always)]
    fn block_rows(&self, r: usize, k: usize) -> Option<(GgmlType, &[u8])> {
        match self {
            Weight::Dense(_) => None,
            Weight::Quant(q) => q.block_rows(r, k),
        }
    }
}

impl Weight {
    /// Bytes held for the weight values.
    pub fn resident_bytes(&self) -> usize {
        match self {
            Weight::Dense(m) => m.data.len() * 4,
            Weight::Quant(q) => q.bytes.len(),
        }
    }
}

/// An f16 at byte `i` of `b`, as f32 (exact).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// [`quant::dequantize`] of whole blocks: Q4_0, Q4_1 and Q8_0 eight weights
/// at a time with AVX2 (and F16C) where the CPU has them, else inlined into the caller
/// (so they compile with its target features).
#[inline(always)]
pub fn dequantize_blocks(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let simd = super::rows_avx::fused_type(ty);
        if simd && data.len() == ty.row_bytes(out.len()) && super::rows_avx::block_loops() {
            // SAFETY: AVX2, F16C and FMA checked, whole blocks of `ty` filling `out`.
            unsafe { super::rows_avx::dequantize(ty, data, out) };
            return;
        }
    }
    match ty {
        GgmlType::Q4_1 => {
            for (b, y) in data.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qs: &[u8; 16] = b[4..20].try_into().expect("16 bytes");
                let (lo, hi) = y.split_at_mut(16);
                for ((l, h), q) in lo.iter_mut().zip(hi).zip(qs) {
                    *l = (q & 0x0F) as f32 * d + m;
                    *h = (q >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (b, y) in data.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(b, 0);
                let qs: &[u8; 16] = b[2..18].try_into().expect("16 bytes");
                let (lo, hi) = y.split_at_mut(16);
                for ((l, h), q) in lo.iter_mut().zip(hi).zip(qs) {
                    *l = ((q & 0x0F) as i32 - 8) as f32 * d;
                    *h = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (b, y) in data.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(b, 0);
                let qs: &[u8; 32] = b[2..34].try_into().expect("32 bytes");
                for (yj, q) in y.iter_mut().zip(qs) {
                    *yj = *q as i8 as f32 * d;
                }
            }
        }
        _ => quant::dequantize(ty, data, out).expect("a whole row of blocks"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_rows_equal_at_every_scale() {
        // The vector path rounds `f * d + m` once (FMA), which equals the
        // reference's `mul` then `add` only because `f * d` is exact: check
        // it over the whole finite f16 range of scales and minimums, both
        // signs, subnormals included, every nibble.
        let (cols, mut bytes, mut s) = (32, Vec::new(), 0x2545_f491u32);
        let mut rows = 0;
        for d in (0u16..0x7c00).step_by(7).flat_map(|d| [d, d | 0x8000]) {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let m = ((s >> 16) as u16 % 0x7c00) | (s as u16 & 0x8000);
            bytes.extend_from_slice(&d.to_le_bytes());
            bytes.extend_from_slice(&m.to_le_bytes());
            bytes.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
            rows += 1;
        }
        let mut want = vec![0f32; rows * cols];
        quant::dequantize(GgmlType::Q4_1, &bytes, &mut want).unwrap();
        let q = QMatrix {
            rows,
            cols,
            ty: GgmlType::Q4_1,
            bytes: bytes.into(),
        };
        let mut got = vec![0f32; cols];
        for r in 0..rows {
            q.dequantize_row(r, &mut got);
            for (g, w) in got.iter().zip(&want[r * cols..]) {
                assert_eq!(g.to_bits(), w.to_bits(), "row {r}: {g} against {w}");
            }
        }
    }

    #[test]
    fn rows_equal_quant_dequantize_bit_for_bit() {
        let types = [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ];
        for ty in types {
            let cols = 256;
            let rows = 3;
            let n = ty.row_bytes(cols) * rows;
            // Arbitrary bytes, with the f16 scales kept finite and small.
            let mut s = 0x9e37_79b9u32;
            let mut bytes: Vec<u8> = (0..n)
                .map(|_| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (s >> 24) as u8
                })
                .collect();
            for b in bytes.chunks_exact_mut(ty.type_size()) {
                for h in b.chunks_exact_mut(2).take(2) {
                    h[1] &= 0x3b;
                }
            }
            let mut want = vec![0f32; rows * cols];
            quant::dequantize(ty, &bytes, &mut want).unwrap();
            let q = QMatrix {
                rows,
                cols,
                ty,
                bytes: bytes.into(),
            };
            let mut got = vec![0f32; cols];
            for r in 0..rows {
                q.dequantize_row(r, &mut got);
                let want_bits: Vec<u32> = want[r * cols..][..cols]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let got_bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got_bits, want_bits, "{ty} row {r}");
            }
        }
    }
}
