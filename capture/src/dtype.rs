//! Element types a tap may hold.

use serde::{Deserialize, Serialize};

/// The element type of a tapped tensor. Names match safetensors' dtype strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum DType {
    /// IEEE single, 4 bytes.
    F32,
    /// IEEE half, 2 bytes.
    F16,
    /// bfloat16 (the top 16 bits of an f32), 2 bytes.
    BF16,
    /// IEEE double, 8 bytes.
    F64,
    /// Signed 8-bit integer, 1 byte.
    I8,
    /// Signed 32-bit integer, 4 bytes.
    I32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 => 8,
            DType::I8 => 1,
        }
    }

    /// The safetensors spelling (`"F32"`, `"BF16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F64 => "F64",
            DType::I8 => "I8",
            DType::I32 => "I32",
        }
    }

    /// The type named `name` in the safetensors spelling, if any.
    pub fn from_name(name: &str) -> Option<DType> {
        use DType::*;
        [F32, F16, BF16, F64, I8, I32]
            .into_iter()
            .find(|d| d.name() == name)
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I8 | DType::I32)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type that can be tapped without conversion.
pub trait TapElem: bytemuck::Pod {
    /// The dtype the tree records for this element type.
    const DTYPE: DType;
}

impl TapElem for f32 {
    const DTYPE: DType = DType::F32;
}
impl TapElem for f64 {
    const DTYPE: DType = DType::F64;
}
impl TapElem for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl TapElem for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl TapElem for i8 {
    const DTYPE: DType = DType::I8;
}
impl TapElem for i32 {
    const DTYPE: DType = DType::I32;
}
