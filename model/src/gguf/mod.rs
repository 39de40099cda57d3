//! GGUF files: a validating reader over a memory map, and a writer.
//!
//! [`GgufFile::open`] parses the header, every metadata value (arrays
//! included) and the tensor table, and checks that every tensor's bytes lie
//! inside the file before handing out a single slice, so a truncated or
//! corrupt file fails at open with its path and the reason, never later
//! inside a forward. Tensor dims are stored ne0-first; [`TensorInfo::shape`]
//! gives them outermost-first (`[rows, cols]`), as [`crate::QTensor`] wants.

mod read;
mod write;

pub use read::{GgufFile, TensorInfo};
pub use write::GgufWriter;

use std::path::PathBuf;

/// `"GGUF"` read as a little-endian u32.
pub const MAGIC: u32 = 0x4655_4747;
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value. Arrays hold values of one type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// The element type id and the elements.
    Array(ValueType, Vec<Value>),
}

/// GGUF metadata value type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
        }
    }

    /// Any integer type that fits in a u64 (writers disagree on u32 vs u64
    /// for counts, and some use signed types).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

/// Why a GGUF file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file: bad magic {found:#010x} (expected \"GGUF\")")]
    BadMagic { path: PathBuf, found: u32 },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{path}: truncated: {what} at byte {offset} needs {needed} bytes, file has {len}")]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("{path}: metadata key {key:?}: unknown value type id {id}")]
    UnknownValueType { path: PathBuf, key: String, id: u32 },
    #[error("{path}: {what}: invalid UTF-8")]
    BadString { path: PathBuf, what: String },
    #[error("{path}: tensor {tensor:?}: unknown or unsupported quant type id {id}")]
    UnknownQuantType {
        path: PathBuf,
        tensor: String,
        id: u32,
    },
    #[error("{path}: tensor {tensor:?}: {reason}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error(
        "{path}: tensor {tensor:?}: data {start}..{end} out of bounds (data section ends at {len})"
    )]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("{path}: tensor {tensor:?}: element count of dims {dims:?} overflows")]
    ElementCountOverflow {
        path: PathBuf,
        tensor: String,
        dims: Vec<u64>,
    },
    #[error("{path}: bad general.alignment {alignment} (must be a nonzero power of two)")]
    BadAlignment { path: PathBuf, alignment: u64 },
    #[error("{path}: duplicate {what} {name:?}")]
    Duplicate {
        path: PathBuf,
        what: &'static str,
        name: String,
    },
    #[error("{path}: truncated or corrupt: {count} {what} declared, more than a file of {len} bytes can hold")]
    ImplausibleCount {
        path: PathBuf,
        what: &'static str,
        count: u64,
        len: u64,
    },
}

#[cfg(test)]
mod tests;
