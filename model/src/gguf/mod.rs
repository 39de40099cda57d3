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
    /// A `uint8` (type id 0).
    U8(u8),
    /// An `int8` (type id 1).
    I8(i8),
    /// A `uint16` (type id 2).
    U16(u16),
    /// An `int16` (type id 3).
    I16(i16),
    /// A `uint32` (type id 4), the usual type of counts and ids.
    U32(u32),
    /// An `int32` (type id 5).
    I32(i32),
    /// A `uint64` (type id 10).
    U64(u64),
    /// An `int64` (type id 11).
    I64(i64),
    /// A `float32` (type id 6).
    F32(f32),
    /// A `float64` (type id 12).
    F64(f64),
    /// A `bool` (type id 7), one byte on disk.
    Bool(bool),
    /// A length-prefixed UTF-8 string (type id 8).
    String(String),
    /// The element type id and the elements.
    Array(ValueType, Vec<Value>),
}

/// GGUF metadata value type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// Type id 0.
    U8 = 0,
    /// Type id 1.
    I8 = 1,
    /// Type id 2.
    U16 = 2,
    /// Type id 3.
    I16 = 3,
    /// Type id 4.
    U32 = 4,
    /// Type id 5.
    I32 = 5,
    /// Type id 6.
    F32 = 6,
    /// Type id 7: one byte, 0 or 1.
    Bool = 7,
    /// Type id 8: a u64 length, then UTF-8 bytes.
    String = 8,
    /// Type id 9: an element type id, a u64 count, then the elements.
    Array = 9,
    /// Type id 10.
    U64 = 10,
    /// Type id 11.
    I64 = 11,
    /// Type id 12.
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`, or `None` for an id this reader does not know.
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
    /// The type id this value is written with.
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

    /// Any integer type whose value fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float value widened to f64; `None` for integers (they are not floats in GGUF).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, if this is a bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if this is an array.
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
    /// Opening, mapping or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("{path}: not a GGUF file: bad magic {found:#010x} (expected \"GGUF\")")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first four bytes, little-endian.
        found: u32,
    },
    /// The header's version is not 2 or 3.
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version the header declares.
        version: u32,
    },
    /// The file ends before a value it declares.
    #[error("{path}: truncated: {what} at byte {offset} needs {needed} bytes, file has {len}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read (`magic`, a metadata key, the tensor table).
        what: String,
        /// Where it starts, in bytes from the start of the file.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// The file's length in bytes.
        len: u64,
    },
    /// A metadata value has a type id outside 0..=12.
    #[error("{path}: metadata key {key:?}: unknown value type id {id}")]
    UnknownValueType {
        /// The file.
        path: PathBuf,
        /// The metadata key.
        key: String,
        /// The unknown type id.
        id: u32,
    },
    /// A string is not valid UTF-8.
    #[error("{path}: {what}: invalid UTF-8")]
    BadString {
        /// The file.
        path: PathBuf,
        /// Which string (a metadata key or value, a tensor name).
        what: String,
    },
    /// A tensor's ggml type id is not one the loader supports.
    #[error("{path}: tensor {tensor:?}: unknown or unsupported quant type id {id}")]
    UnknownQuantType {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The type id.
        id: u32,
    },
    /// A tensor table entry is inconsistent (its dims, or its offset's alignment).
    #[error("{path}: tensor {tensor:?}: {reason}")]
    BadTensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor's data does not lie inside the data section.
    #[error(
        "{path}: tensor {tensor:?}: data {start}..{end} out of bounds (data section ends at {len})"
    )]
    TensorOutOfBounds {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Its first byte, relative to the data section.
        start: u64,
        /// One past its last byte, relative to the data section.
        end: u64,
        /// The data section's length in bytes.
        len: u64,
    },
    /// A tensor's dims multiply past u64.
    #[error("{path}: tensor {tensor:?}: element count of dims {dims:?} overflows")]
    ElementCountOverflow {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Its dims as stored (ne0 first).
        dims: Vec<u64>,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("{path}: bad general.alignment {alignment} (must be a nonzero power of two)")]
    BadAlignment {
        /// The file.
        path: PathBuf,
        /// The alignment it declares.
        alignment: u64,
    },
    /// Two tensors or two metadata keys share a name.
    #[error("{path}: duplicate {what} {name:?}")]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// `tensor` or `metadata key`.
        what: &'static str,
        /// The repeated name.
        name: String,
    },
    /// A count in the header could not fit in the file (the sign of a truncated
    /// or corrupt header).
    #[error("{path}: truncated or corrupt: {count} {what} declared, more than a file of {len} bytes can hold")]
    ImplausibleCount {
        /// The file.
        path: PathBuf,
        /// What is counted (tensors, metadata entries, array elements).
        what: &'static str,
        /// The count declared.
        count: u64,
        /// The file's length in bytes.
        len: u64,
    },
}

#[cfg(test)]
mod tests;
