use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::{GgufError, Value, ValueType, DEFAULT_ALIGNMENT, MAGIC};
use crate::quant::GgmlType;

/// One entry of the tensor table, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// The block layout its bytes are in.
    pub ggml_type: GgmlType,
    /// As stored: `ne0` (the contiguous dimension) first.
    pub dims: Vec<u64>,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Absolute byte range of the tensor's data in the file.
    pub range: std::ops::Range<usize>,
}

impl TensorInfo {
    /// Outermost-first shape (`[rows, cols]` for a matrix).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The number of elements (product of the dims).
    pub fn numel(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }
}

/// A parsed GGUF file, its tensor data left in the memory map.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Maps and validates `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 4 {
            return Err(GgufError::Truncated {
                path,
                what: "magic".into(),
                offset: 0,
                needed: 4,
                len,
            });
        }
        // SAFETY: the map is read-only; like every mmap-based model loader we
        // rely on the file not being truncated underneath us while it is mapped
        // (the map lives as long as any tensor sliced from it, `tensor_bytes`).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let parsed = Parser {
            path: &path,
            buf: &map,
            pos: 0,
        }
        .parse()?;
        Ok(GgufFile {
            path,
            map: Arc::new(map),
            version: parsed.version,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
            meta_index: index(&parsed.metadata, |(k, _)| k),
            tensor_index: index(&parsed.tensors, |t| &t.name),
            metadata: parsed.metadata,
            tensors: parsed.tensors,
        })
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version of the header (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of tensor data: `general.alignment`, else 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of metadata `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (bounds were checked at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.range.clone()]
    }

    /// A tensor's bytes as a shared slice of the map (no copy): they stay
    /// valid after this `GgufFile` is dropped.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> crate::TensorBytes {
        crate::TensorBytes::mapped(Arc::clone(&self.map), info.range.clone())
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// The fewest bytes one value of type `ty` takes in a file.
fn min_encoded_size(ty: ValueType) -> u64 {
    match ty {
        ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
        ValueType::U16 | ValueType::I16 => 2,
        ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
        ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
        ValueType::Array => 12,
    }
}

fn index<T>(items: &[T], key: impl Fn(&T) -> &String) -> HashMap<String, usize> {
    items
        .iter()
        .enumerate()
        .map(|(i, t)| (key(t).clone(), i))
        .collect()
}

/// A tensor as the header gives it: name, dims, type id, data offset.
type RawTensor = (String, Vec<u64>, u32, u64);

struct Parsed {
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
}

struct Parser<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn parse(mut self) -> Result<Parsed, GgufError> {
        let magic = self.u32("magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                path: self.path.into(),
                found: magic,
            });
        }
        let version = self.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion {
                path: self.path.into(),
                version,
            });
        }
        let n_tensors = self.u64("tensor count")?;
        let n_kv = self.u64("metadata count")?;
        // Each metadata entry takes at least 12 bytes and each tensor entry at
        // least 24, so a count beyond that is corruption, not a reason to
        // allocate.
        self.plausible(n_kv, 12, "metadata entries")?;
        self.plausible(n_tensors, 24, "tensors")?;

        let metadata = self.metadata(n_kv)?;
        let alignment = self.alignment(&metadata)?;
        let raw = self.tensor_headers(n_tensors)?;

        let header_end = self.pos as u64;
        let data_start = header_end.div_ceil(alignment) * alignment;
        let len = self.buf.len() as u64;
        let data_len = len.saturating_sub(data_start);

        let mut tensors = Vec::with_capacity(raw.len());
        let mut names = std::collections::HashSet::new();
        for (name, dims, type_id, offset) in raw {
            let ggml_type =
                GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownQuantType {
                    path: self.path.into(),
                    tensor: name.clone(),
                    id: type_id,
                })?;
            let numel = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= usize::MAX as u64 / 4)
                .ok_or_else(|| GgufError::ElementCountOverflow {
                    path: self.path.into(),
                    tensor: name.clone(),
                    dims: dims.clone(),
                })?;
            if dims[0] % ggml_type.block_size() as u64 != 0 {
                return Err(self.bad_tensor(
                    &name,
                    format!(
                        "row length {} is not a multiple of {ggml_type}'s block size {}",
                        dims[0],
                        ggml_type.block_size()
                    ),
                ));
            }
            if offset % alignment != 0 {
                return Err(self.bad_tensor(
                    &name,
                    format!("data offset {offset} is not a multiple of the alignment {alignment}"),
                ));
            }
            let nbytes = numel / ggml_type.block_size() as u64 * ggml_type.type_size() as u64;
            let end = offset.checked_add(nbytes).filter(|&e| e <= data_len);
            let Some(end) = end else {
                return Err(GgufError::TensorOutOfBounds {
                    path: self.path.into(),
                    tensor: name,
                    start: offset,
                    end: offset.saturating_add(nbytes),
                    len: data_len,
                });
            };
            if !names.insert(name.clone()) {
                return Err(GgufError::Duplicate {
                    path: self.path.into(),
                    what: "tensor",
                    name,
                });
            }
            let range = (data_start + offset) as usize..(data_start + end) as usize;
            tensors.push(TensorInfo {
                name,
                ggml_type,
                dims,
                offset,
                range,
            });
        }

        Ok(Parsed {
            version,
            alignment,
            data_start,
            metadata,
            tensors,
        })
    }

    /// The metadata entries, in file order; a repeated key is corruption.
    fn metadata(&mut self, n_kv: u64) -> Result<Vec<(String, Value)>, GgufError> {
        // Capacities are capped: a count that passed the plausibility check
        // can still be far larger than what the file really holds.
        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv.min(1024) as usize);
        let mut seen = std::collections::HashSet::new();
        for i in 0..n_kv {
            let key = self.string(&format!("metadata key #{i}"))?;
            let id = self.u32(&format!("type of metadata {key:?}"))?;
            let ty = ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
                path: self.path.into(),
                key: key.clone(),
                id,
            })?;
            let value = self.value(ty, &key, 0)?;
            if !seen.insert(key.clone()) {
                return Err(GgufError::Duplicate {
                    path: self.path.into(),
                    what: "metadata key",
                    name: key,
                });
            }
            metadata.push((key, value));
        }
        Ok(metadata)
    }

    /// `general.alignment`, or GGUF's default; it must be a power of two.
    fn alignment(&self, metadata: &[(String, Value)]) -> Result<u64, GgufError> {
        Ok(
            match metadata.iter().find(|(k, _)| k == "general.alignment") {
                None => DEFAULT_ALIGNMENT,
                Some((_, v)) => {
                    let a = v.as_u64().unwrap_or(0);
                    if a == 0 || !a.is_power_of_two() {
                        return Err(GgufError::BadAlignment {
                            path: self.path.into(),
                            alignment: a,
                        });
                    }
                    a
                }
            },
        )
    }

    /// Each tensor's name, dims, type id and data offset, as the header has them.
    fn tensor_headers(&mut self, n_tensors: u64) -> Result<Vec<RawTensor>, GgufError> {
        let mut raw = Vec::with_capacity(n_tensors.min(4096) as usize);
        for i in 0..n_tensors {
            let name = self.string(&format!("tensor name #{i}"))?;
            let n_dims = self.u32(&format!("dims count of tensor {name:?}"))?;
            if n_dims == 0 || n_dims > 4 {
                return Err(self.bad_tensor(&name, format!("{n_dims} dims (GGML allows 1 to 4)")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(self.u64(&format!("dim {d} of tensor {name:?}"))?);
            }
            let type_id = self.u32(&format!("type of tensor {name:?}"))?;
            let offset = self.u64(&format!("offset of tensor {name:?}"))?;
            raw.push((name, dims, type_id, offset));
        }
        Ok(raw)
    }

    /// Like [`Parser::plausible`], against the bytes after the cursor.
    fn plausible_here(
        &self,
        count: u64,
        min_size: u64,
        what: &'static str,
    ) -> Result<(), GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if count.saturating_mul(min_size) > remaining {
            return Err(GgufError::ImplausibleCount {
                path: self.path.into(),
                what,
                count,
                len: self.buf.len() as u64,
            });
        }
        Ok(())
    }

    fn plausible(&self, count: u64, min_size: u64, what: &'static str) -> Result<(), GgufError> {
        let len = self.buf.len() as u64;
        if count.saturating_mul(min_size) > len {
            return Err(GgufError::ImplausibleCount {
                path: self.path.into(),
                what,
                count,
                len,
            });
        }
        Ok(())
    }

    fn bad_tensor(&self, name: &str, reason: String) -> GgufError {
        GgufError::BadTensor {
            path: self.path.into(),
            tensor: name.into(),
            reason,
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&[u8], GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(GgufError::Truncated {
                path: self.path.into(),
                what: what.into(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("length checked"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadString {
            path: self.path.into(),
            what: what.into(),
        })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: u32) -> Result<Value, GgufError> {
        let what = || format!("value of metadata {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what())?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what())?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            ValueType::Bool => Value::Bool(self.array::<1>(&what())?[0] != 0),
            ValueType::String => Value::String(self.string(&what())?),
            ValueType::Array => {
                let id = self.u32(&what())?;
                let elem = ValueType::from_id(id)
                    .filter(|t| *t != ValueType::Array || depth < 8)
                    .ok_or_else(|| GgufError::UnknownValueType {
                        path: self.path.into(),
                        key: key.into(),
                        id,
                    })?;
                let count = self.u64(&what())?;
                self.plausible_here(count, min_encoded_size(elem), "array elements")?;
                let mut items = Vec::with_capacity(count.min(1 << 16) as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}
