//! A tap's tensor as [`crate::TreeReader::read`] returns it: mapped from
//! its file, no copy until asked for one.

use crate::dtype::{DType, TapElem};
use memmap2::Mmap;

/// A tap's tensor, mapped from its file: no copy until asked for one.
pub struct TensorView {
    pub(crate) map: Mmap,
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

impl TensorView {
    /// The tensor's element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The tensor's shape, axis 0 the positions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The raw little-endian tensor bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// The elements as `T`, if `T` is the tap's dtype (data is 8-aligned in
    /// the file, so this never copies).
    pub fn as_slice<T: TapElem>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        bytemuck::try_cast_slice(self.bytes()).ok()
    }

    /// Every element converted to f64, row-major.
    pub fn to_f64(&self) -> Vec<f64> {
        let b = self.bytes();
        match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")) as f64)
                .collect(),
            DType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::I8 => b.iter().map(|&v| v as i8 as f64).collect(),
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4")) as f64)
                .collect(),
        }
    }
}

impl std::fmt::Debug for TensorView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorView")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}
