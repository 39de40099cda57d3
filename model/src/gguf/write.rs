use std::io::Write;
use std::path::Path;

use super::{GgufError, Value, DEFAULT_ALIGNMENT, MAGIC};
use crate::quant::GgmlType;

/// Builds a GGUF v3 file in memory, then writes it atomically.
#[derive(Debug, Default, Clone)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, GgmlType, Vec<usize>, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata entry (replacing an earlier one of the same key).
    pub fn meta(&mut self, key: &str, value: Value) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        self
    }

    /// Adds a tensor; `shape` is outermost-first and `data` is in
    /// `ggml_type`'s block layout.
    ///
    /// # Panics
    /// When the byte length does not match the shape: that is a bug in the
    /// caller, not bad input.
    pub fn tensor(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        shape: &[usize],
        data: Vec<u8>,
    ) -> &mut Self {
        let numel: usize = shape.iter().product();
        assert_eq!(
            data.len(),
            ggml_type.row_bytes(numel),
            "tensor {name}: {} bytes for shape {shape:?} of {ggml_type}",
            data.len()
        );
        self.tensors
            .push((name.to_string(), ggml_type, shape.to_vec(), data));
        self
    }

    /// The metadata added so far, in order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        for (name, ty, shape, data) in &self.tensors {
            put_string(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + data.len()).div_ceil(align) * align;
        }
        for (_, _, _, data) in &self.tensors {
            out.resize(out.len().div_ceil(align) * align, 0);
            out.extend_from_slice(data);
        }
        out
    }

    /// Writes to a temporary file beside `path`, then renames it into place,
    /// so a crash never leaves a half-written model under the final name.
    pub fn write(&self, path: &Path) -> Result<(), GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        let mut tmp = tempfile::NamedTempFile::new_in(dir.unwrap_or(Path::new("."))).map_err(io)?;
        tmp.write_all(&self.to_bytes()).map_err(io)?;
        // A temporary file is private (0600); a model file is not.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(io)?;
        }
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_string(out, s),
        Value::Array(ty, items) => {
            out.extend_from_slice(&(*ty as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
