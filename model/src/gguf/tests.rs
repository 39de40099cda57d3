use super::*;
use crate::quant::GgmlType;

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("u8", Value::U8(7))
        .meta("i8", Value::I8(-7))
        .meta("u16", Value::U16(65535))
        .meta("i16", Value::I16(-300))
        .meta("u32", Value::U32(4_000_000_000))
        .meta("i32", Value::I32(-5))
        .meta("u64", Value::U64(u64::MAX))
        .meta("i64", Value::I64(i64::MIN))
        .meta("f32", Value::F32(1e-5))
        .meta("f64", Value::F64(-2.5))
        .meta("bool", Value::Bool(true))
        .meta("str", Value::String("héllo".into()))
        .meta(
            "arr",
            Value::Array(
                ValueType::String,
                vec![Value::String("a".into()), Value::String("".into())],
            ),
        )
        .meta(
            "nested",
            Value::Array(
                ValueType::Array,
                vec![Value::Array(
                    ValueType::I32,
                    vec![Value::I32(1), Value::I32(-2)],
                )],
            ),
        );
    w.tensor("v", GgmlType::F32, &[3], vec![0u8; 12]);
    w.tensor("m", GgmlType::Q8_0, &[2, 64], vec![1u8; 2 * 2 * 34]);
    w
}

fn write_tmp(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

#[test]
fn round_trips_every_value_type_and_tensor_layout() {
    let w = sample();
    let (_d, p) = write_tmp(&w.to_bytes());
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata().len(), 15);
    for (k, v) in w.metadata() {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    let m = g.tensor("m").unwrap();
    assert_eq!(m.dims, vec![64, 2], "ne0 first on disk");
    assert_eq!(m.shape(), vec![2, 64]);
    assert_eq!(m.ggml_type, GgmlType::Q8_0);
    assert_eq!(m.offset % DEFAULT_ALIGNMENT, 0);
    assert_eq!(g.tensor_data(m), &[1u8; 136][..]);
    assert_eq!(g.data_start() % DEFAULT_ALIGNMENT, 0);
}

#[test]
fn honours_general_alignment() {
    let mut w = sample();
    w.meta("general.alignment", Value::U32(256));
    let (_d, p) = write_tmp(&w.to_bytes());
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.alignment(), 256);
    assert_eq!(g.data_start() % 256, 0);
    assert_eq!(g.tensor("m").unwrap().offset, 256);
}

fn open_err(bytes: &[u8]) -> String {
    let (_d, p) = write_tmp(bytes);
    let e = GgufFile::open(&p).unwrap_err().to_string();
    assert!(e.starts_with(&p.display().to_string()), "{e}");
    e
}

#[test]
fn every_truncation_is_an_error_naming_the_file() {
    let bytes = sample().to_bytes();
    let g_len = {
        let (_d, p) = write_tmp(&bytes);
        let g = GgufFile::open(&p).unwrap();
        g.tensors().iter().map(|t| t.range.end).max().unwrap()
    };
    assert_eq!(g_len, bytes.len());
    for cut in 0..bytes.len() {
        let e = open_err(&bytes[..cut]);
        assert!(
            e.contains("truncated") || e.contains("out of bounds"),
            "cut at {cut}: {e}"
        );
    }
}

#[test]
fn bad_magic_and_version() {
    let mut bytes = sample().to_bytes();
    bytes[0] = b'X';
    assert!(open_err(&bytes).contains("bad magic"));
    let mut bytes = sample().to_bytes();
    bytes[4] = 1;
    assert!(open_err(&bytes).contains("unsupported GGUF version 1"));
}

/// Offset of the first byte after the tensor table's last type id.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn unknown_quant_type_names_the_tensor() {
    let mut bytes = sample().to_bytes();
    // tensor "m": name, n_dims=2, dims 64 and 2, then the type id (8 = Q8_0).
    let at = find(&bytes, b"\x01\x00\x00\x00\x00\x00\x00\x00m\x02\x00\x00\x00") + 13 + 16;
    assert_eq!(bytes[at], 8);
    bytes[at] = 99;
    let e = open_err(&bytes);
    assert!(
        e.contains("tensor \"m\": unknown or unsupported quant type id 99"),
        "{e}"
    );
}

#[test]
fn element_count_overflow_and_out_of_bounds() {
    let mut bytes = sample().to_bytes();
    let at = find(&bytes, b"\x01\x00\x00\x00\x00\x00\x00\x00m\x02\x00\x00\x00") + 13;
    bytes[at + 8..at + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(open_err(&bytes).contains("overflows"));

    let mut bytes = sample().to_bytes();
    bytes[at + 8..at + 16].copy_from_slice(&3u64.to_le_bytes());
    let e = open_err(&bytes);
    assert!(
        e.contains("tensor \"m\"") && e.contains("out of bounds"),
        "{e}"
    );
}

#[test]
fn unknown_value_type_and_implausible_counts() {
    let mut bytes = sample().to_bytes();
    // the key "u8" is followed by its type id 0
    let at = find(&bytes, b"\x02\x00\x00\x00\x00\x00\x00\x00u8") + 10;
    bytes[at] = 42;
    assert!(open_err(&bytes).contains("metadata key \"u8\": unknown value type id 42"));

    let mut bytes = sample().to_bytes();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(
        open_err(&bytes).contains("truncated or corrupt: 1099511627776 metadata entries declared")
    );
}

#[test]
fn misaligned_tensor_offset_is_refused() {
    let mut bytes = sample().to_bytes();
    let at = find(&bytes, b"\x01\x00\x00\x00\x00\x00\x00\x00m\x02\x00\x00\x00") + 13 + 16 + 4;
    let off = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    bytes[at..at + 8].copy_from_slice(&(off + 1).to_le_bytes());
    assert!(open_err(&bytes).contains("not a multiple of the alignment"));
}

mod mutations {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Corrupting any bytes of a valid file yields a file or an error,
        /// never a panic or a runaway allocation.
        #[test]
        fn corrupt_headers_never_panic(
            edits in proptest::collection::vec((0usize..400, any::<u8>()), 1..6)
        ) {
            let mut bytes = sample().to_bytes();
            for (at, v) in edits {
                let at = at % bytes.len();
                bytes[at] = v;
            }
            let (_d, p) = write_tmp(&bytes);
            if let Ok(g) = GgufFile::open(&p) {
                for t in g.tensors() {
                    prop_assert!(t.range.end <= bytes.len());
                    prop_assert_eq!(g.tensor_data(t).len(), t.range.len());
                }
            }
        }
    }
}

#[test]
fn a_huge_array_count_is_refused_before_allocating() {
    let mut bytes = sample().to_bytes();
    // "arr" is an array of strings: type 9, element type 8, then the count.
    let at = find(&bytes, b"arr\x09\x00\x00\x00\x08\x00\x00\x00") + 11;
    bytes[at..at + 8].copy_from_slice(&(u64::MAX / 16).to_le_bytes());
    let e = open_err(&bytes);
    assert!(e.contains("array elements declared"), "{e}");
}
