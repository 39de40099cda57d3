/// A GGML tensor type (the ids are GGUF's `ggml_type` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit float (id 0); a block is one element.
    F32,
    /// IEEE half (id 1); a block is one element.
    F16,
    /// bfloat16 (id 30); a block is one element.
    BF16,
    /// 32-element blocks of 4-bit values with an f16 scale (id 2).
    Q4_0,
    /// 32-element blocks of 4-bit values with an f16 scale and minimum (id 3).
    Q4_1,
    /// 32-element blocks of 5-bit values with an f16 scale (id 6).
    Q5_0,
    /// 32-element blocks of 8-bit values with an f16 scale (id 8).
    Q8_0,
    /// 256-element super-blocks of 2-bit values with 4-bit sub-block scales and
    /// mins (id 10).
    Q2_K,
    /// 256-element super-blocks of 3-bit values with 6-bit sub-block scales (id 11).
    Q3_K,
    /// 256-element super-blocks of 4-bit values with 6-bit sub-block scales and
    /// mins (id 12).
    Q4_K,
    /// 256-element super-blocks of 5-bit values with 6-bit sub-block scales and
    /// mins (id 13).
    Q5_K,
    /// 256-element super-blocks of 6-bit values with 8-bit sub-block scales (id 14).
    Q6_K,
}

impl GgmlType {
    /// Elements per block.
    #[inline]
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => 32,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                256
            }
        }
    }

    /// Bytes per block.
    #[inline]
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
        }
    }

    /// Whether the type is block-quantized (not a plain float type).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::BF16 => 30,
        }
    }

    /// The type with GGUF id `id`, or `None` for a type this crate cannot dequantize.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// Bytes of a row of `n` elements (`n` a multiple of the block size).
    #[inline]
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.type_size()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Why bytes could not be dequantized.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// A tensor or row length is not a whole number of blocks.
    #[error("{ggml_type}: {n} elements is not a whole number of {block}-element blocks")]
    PartialBlock {
        /// The type.
        ggml_type: GgmlType,
        /// The element count.
        n: usize,
        /// The type's block size.
        block: usize,
    },
    /// Activations to quantize to Q8_K are not a whole number of 256-element blocks.
    #[error("Q8_K: {n} activations are not a whole number of 256-element blocks")]
    PartialQ8KBlock {
        /// The element count.
        n: usize,
    },
    /// The bytes do not match the element count.
    #[error("{ggml_type}: {n} elements need {expected} bytes, got {got}")]
    ByteLength {
        /// The type.
        ggml_type: GgmlType,
        /// The element count.
        n: usize,
        /// Bytes that count takes in the type's layout.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
}

/// Checks that `n` elements are whole blocks of `ty` held in exactly `bytes` bytes.
pub(super) fn check(ty: GgmlType, bytes: usize, n: usize) -> Result<(), QuantError> {
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::PartialBlock {
            ggml_type: ty,
            n,
            block,
        });
    }
    let expected = ty.row_bytes(n);
    if bytes != expected {
        return Err(QuantError::ByteLength {
            ggml_type: ty,
            n,
            expected,
            got: bytes,
        });
    }
    Ok(())
}
