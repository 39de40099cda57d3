//! One tap, one safetensors file: a single tensor named `tap`, its key in the
//! metadata. Written and parsed here directly (the format is an 8-byte length,
//! a JSON header and the raw bytes) so that the writer streams from the
//! caller's buffer without building an intermediate, and so that the reader
//! can say exactly what is wrong with a damaged file.

use crate::dtype::DType;
use crate::key::Key;
use crate::manifest::FORMAT_VERSION;
use serde::Deserialize;

/// Name of the one tensor in every tap file.
pub const TENSOR_NAME: &str = "tap";

/// Headers larger than this are refused before being parsed (a corrupt
/// length prefix must not make the reader allocate gigabytes).
const MAX_HEADER: u64 = 1 << 20;

/// The bytes that precede the tensor data: length prefix, JSON header, padding
/// to a multiple of 8 so the data is aligned for any dtype when mapped.
pub fn encode_header(key: &Key, dtype: DType, shape: &[usize], data_len: usize) -> Vec<u8> {
    let mut meta = serde_json::Map::new();
    let version = if key.rank.is_some() || key.shard.is_some() {
        crate::manifest::FORMAT_VERSION_RANKED
    } else {
        FORMAT_VERSION
    };
    meta.insert("taptree.format".into(), version.into());
    meta.insert("taptree.key".into(), key.to_string().into());
    meta.insert("stage".into(), key.stage.clone().into());
    if let Some(layer) = key.layer {
        meta.insert("layer".into(), layer.to_string().into());
    }
    meta.insert("pos_start".into(), key.pos.start.to_string().into());
    meta.insert("pos_end".into(), key.pos.end.to_string().into());
    if let Some(slot) = key.slot {
        meta.insert("slot".into(), slot.to_string().into());
    }
    if let Some(rank) = key.rank {
        meta.insert("rank".into(), rank.to_string().into());
    }
    if let Some(shard) = key.shard {
        meta.insert("shard".into(), shard.to_string().into());
    }
    let header = serde_json::json!({
        "__metadata__": meta,
        TENSOR_NAME: {
            "dtype": dtype.name(),
            "shape": shape,
            "data_offsets": [0, data_len],
        }
    });
    let mut json = serde_json::to_vec(&header).expect("a JSON value always serializes");
    while !(8 + json.len()).is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// What a tap file's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The key recorded in the header's metadata.
    pub key: Key,
    /// The tensor's element type.
    pub dtype: DType,
    /// The tensor's shape, axis 0 the positions.
    pub shape: Vec<usize>,
    /// Offset of the first data byte in the file.
    pub data_start: usize,
    /// Bytes of tensor data (element count × dtype size).
    pub data_len: usize,
}

#[derive(Deserialize)]
struct TensorInfo<'a> {
    dtype: &'a str,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

/// The header, typed: parsing straight into it (no intermediate JSON tree)
/// keeps `verify --rehash` bound by I/O rather than by header parsing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader<'a> {
    #[serde(rename = "__metadata__", borrow)]
    meta: Option<RawMeta<'a>>,
    #[serde(borrow)]
    tap: Option<TensorInfo<'a>>,
}

#[derive(Deserialize)]
struct RawMeta<'a> {
    #[serde(borrow)]
    stage: Option<std::borrow::Cow<'a, str>>,
    layer: Option<&'a str>,
    pos_start: Option<&'a str>,
    pos_end: Option<&'a str>,
    slot: Option<&'a str>,
    rank: Option<&'a str>,
    shard: Option<&'a str>,
}

/// Parses the header of a whole tap file held in `bytes` (or mapped).
/// The error is a reason, without the path; the caller adds it.
pub fn parse(bytes: &[u8]) -> Result<Header, String> {
    let file_len = bytes.len() as u64;
    if file_len < 8 {
        return Err(format!(
            "truncated: {file_len} bytes, shorter than the 8-byte safetensors length prefix"
        ));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER {
        return Err(format!(
            "not a safetensors file: header length prefix {header_len} is implausible"
        ));
    }
    if 8 + header_len > file_len {
        return Err(format!(
            "truncated: {file_len} bytes, the header alone needs {}",
            8 + header_len
        ));
    }
    let header_bytes = &bytes[8..8 + header_len as usize];
    if header_bytes.first() != Some(&b'{') {
        return Err("not a safetensors file: the header is not a JSON object".into());
    }
    let raw: RawHeader = serde_json::from_slice(header_bytes).map_err(|e| {
        if e.is_data() {
            format!("not a taptree tap: {e} (expected __metadata__ and one tensor named {TENSOR_NAME:?})")
        } else {
            format!("not a safetensors file: header is not valid JSON: {e}")
        }
    })?;
    let meta = raw
        .meta
        .ok_or("not a taptree tap: no __metadata__ in the safetensors header")?;
    let info = raw
        .tap
        .ok_or_else(|| format!("not a taptree tap: no tensor named {TENSOR_NAME:?}"))?;
    let dtype = DType::from_name(info.dtype)
        .ok_or_else(|| format!("unsupported dtype {:?}", info.dtype))?;
    let elements = element_count(&info.shape)?;
    let expected = elements
        .checked_mul(dtype.size())
        .ok_or_else(|| format!("shape {:?}: byte count overflows", info.shape))?;
    let [begin, end] = info.data_offsets;
    if begin != 0 || end != expected as u64 {
        return Err(format!(
            "shape {:?} of {} needs {expected} bytes, data_offsets say [{begin}, {end}]",
            info.shape, dtype
        ));
    }
    let data_start = 8 + header_len;
    let actual = file_len - data_start;
    if actual != end {
        let what = if actual < end {
            "truncated"
        } else {
            "trailing bytes"
        };
        return Err(format!(
            "{what}: {actual} bytes of tensor data, header says {end}"
        ));
    }
    let key = key_from_metadata(&meta)?;
    Ok(Header {
        key,
        dtype,
        shape: info.shape,
        data_start: data_start as usize,
        data_len: end as usize,
    })
}

/// Product of the dimensions, refusing overflow.
pub fn element_count(shape: &[usize]) -> Result<usize, String> {
    shape.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| format!("shape {shape:?}: element count overflows"))
    })
}

fn key_from_metadata(meta: &RawMeta) -> Result<Key, String> {
    let missing = |name: &str| format!("not a taptree tap: metadata has no {name:?}");
    let num = |name: &str, v: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("metadata {name:?} is {v:?}, not a number"))
    };
    let stage = meta.stage.as_deref().ok_or_else(|| missing("stage"))?;
    let layer = meta.layer.map(|v| num("layer", v)).transpose()?;
    let start = num(
        "pos_start",
        meta.pos_start.ok_or_else(|| missing("pos_start"))?,
    )?;
    let end = num("pos_end", meta.pos_end.ok_or_else(|| missing("pos_end"))?)?;
    let slot = meta.slot.map(|v| num("slot", v)).transpose()?;
    let rank = meta.rank.map(|v| num("rank", v)).transpose()?;
    let shard = meta
        .shard
        .map(|v| v.parse::<crate::key::Shard>())
        .transpose()?;
    Ok(Key::new(stage, layer, start..end)
        .with_slot(slot)
        .with_rank(rank, shard))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(key: &Key, dtype: DType, shape: &[usize], data: &[u8]) -> Vec<u8> {
        let mut f = encode_header(key, dtype, shape, data.len());
        f.extend_from_slice(data);
        f
    }

    #[test]
    fn round_trip_and_alignment() {
        let key = Key::new("ffn_down", Some(3), 0..2).with_slot(Some(1));
        for width in [0usize, 1, 7, 8, 9] {
            let data: Vec<u8> = (0..2 * width * 4).map(|i| i as u8).collect();
            let f = file(&key, DType::F32, &[2, width], &data);
            let h = parse(&f).unwrap();
            assert_eq!(h.key, key);
            assert_eq!(h.shape, vec![2, width]);
            assert_eq!(h.data_start % 8, 0);
            assert_eq!(&f[h.data_start..], &data[..]);
        }
    }

    #[test]
    fn the_safetensors_crate_reads_what_we_write() {
        let key = Key::new("logits", None, 5..6);
        let values = [1.5f32, -2.0, 3.25];
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f = file(&key, DType::F32, &[1, 3], &data);
        let st = safetensors::SafeTensors::deserialize(&f).unwrap();
        let t = st.tensor(TENSOR_NAME).unwrap();
        assert_eq!(t.shape(), &[1, 3]);
        assert_eq!(t.data(), &data[..]);
        let (_, meta) = safetensors::SafeTensors::read_metadata(&f).unwrap();
        let meta = meta.metadata().clone().unwrap();
        assert_eq!(meta["taptree.key"], "logits@5");
    }

    #[test]
    fn damage_is_named() {
        let key = Key::new("embedding", None, 0..1);
        let f = file(&key, DType::F32, &[1, 4], &[0u8; 16]);
        assert!(parse(&f[..f.len() - 1])
            .unwrap_err()
            .starts_with("truncated"));
        assert!(parse(&f[..5]).unwrap_err().starts_with("truncated"));
        assert!(parse(&f[..20]).unwrap_err().starts_with("truncated"));
        let mut extra = f.clone();
        extra.push(0);
        assert!(parse(&extra).unwrap_err().starts_with("trailing bytes"));
        assert!(parse(b"hello, this is not a tensor at all")
            .unwrap_err()
            .contains("not a safetensors file"));
        let mut bad_json = f.clone();
        bad_json[8] = b'[';
        assert!(parse(&bad_json)
            .unwrap_err()
            .contains("not a safetensors file"));
    }

    #[test]
    fn overflowing_shapes_are_refused() {
        assert!(element_count(&[usize::MAX, 2]).is_err());
        assert_eq!(element_count(&[]).unwrap(), 1);
        assert_eq!(element_count(&[3, 0]).unwrap(), 0);
        let key = Key::new("x", None, 0..1);
        let mut f = encode_header(&key, DType::F32, &[usize::MAX / 2, 4], 0);
        f.truncate(f.len());
        let err = parse(&f).unwrap_err();
        assert!(err.contains("overflows"), "{err}");
    }
}
