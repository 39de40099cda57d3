//! Dequantization, bit for bit against the `gguf` Python package's
//! `gguf.quants.dequantize` (through fixtures/gguf_dequant.py).

mod gguf_python;

use std::path::Path;

use model::gguf::{GgufFile, GgufWriter};
use model::{GgmlType, QTensor};
use sha2::{Digest, Sha256};

const ALL_TYPES: [GgmlType; 12] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// `(name, type, sha256 of the f32 LE bytes)` of every tensor, in file order.
fn rust_hashes(gguf: &GgufFile) -> Vec<(String, String, String)> {
    gguf.tensors()
        .iter()
        .map(|info| {
            let t = QTensor {
                name: info.name.clone(),
                ggml_type: info.ggml_type,
                shape: info.shape(),
                data: gguf.tensor_data(info).to_vec().into(),
            };
            (info.name.clone(), info.ggml_type.to_string(), hash(&t))
        })
        .collect()
}

fn hash(t: &QTensor) -> String {
    let values = t.to_f32().unwrap();
    let mut h = Sha256::new();
    for v in values {
        h.update(v.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn python_hashes(path: &Path) -> Vec<(String, String, String)> {
    gguf_python::run_script("gguf_dequant.py", &[path.as_os_str()])
        .lines()
        .map(|l| {
            let mut f = l.split('\t').map(str::to_string);
            (f.next().unwrap(), f.next().unwrap(), f.next().unwrap())
        })
        .collect()
}

/// Names of tensors whose hashes differ (or that one side lacks).
fn mismatches(
    rust: &[(String, String, String)],
    python: &[(String, String, String)],
) -> Vec<String> {
    let mut bad: Vec<String> = rust
        .iter()
        .filter(|r| !python.contains(r))
        .map(|r| format!("{} ({})", r.0, r.1))
        .collect();
    bad.extend(
        python
            .iter()
            .filter(|p| !rust.iter().any(|r| r.0 == p.0))
            .map(|p| format!("{} (missing on the Rust side)", p.0)),
    );
    bad
}

/// Random blocks of `ty` whose f16 fields are finite: NaN payloads are not
/// what is under test, every other bit pattern (subnormals included) is.
fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    let mut data = gguf_python::bytes(seed, n_blocks * ty.type_size());
    let f16_fields: &[usize] = match ty {
        GgmlType::F16 => &[0],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::F32 | GgmlType::BF16 => &[],
    };
    for block in data.chunks_exact_mut(ty.type_size()) {
        for &at in f16_fields {
            // An all-ones exponent is Inf/NaN; clearing its top bit keeps the
            // value finite.
            if block[at + 1] & 0x7C == 0x7C {
                block[at + 1] &= !0x40;
            }
        }
    }
    data
}

fn synthetic_file(dir: &Path) -> std::path::PathBuf {
    let mut w = GgufWriter::new();
    for (i, ty) in ALL_TYPES.into_iter().enumerate() {
        let b = ty.block_size();
        // One block, a row of three blocks, and three rows of two blocks.
        for (j, shape) in [vec![b], vec![3 * b], vec![3, 2 * b]]
            .into_iter()
            .enumerate()
        {
            let n_blocks = shape.iter().product::<usize>() / b;
            let data = random_blocks(ty, n_blocks, (i * 10 + j) as u64);
            w.tensor(&format!("{ty}.{j}"), ty, &shape, data);
        }
    }
    let path = dir.join("synthetic.gguf");
    w.write(&path).unwrap();
    path
}

#[test]
fn synthetic_blocks_of_every_type_match_gguf_python() {
    if !gguf_python::python_has(&["numpy", "gguf"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = synthetic_file(dir.path());
    let gguf = GgufFile::open(&path).unwrap();
    let rust = rust_hashes(&gguf);
    let python = python_hashes(&path);
    assert_eq!(python.len(), 36, "python read every tensor");
    assert_eq!(mismatches(&rust, &python), Vec::<String>::new());

    // The comparison must see a one-bit change in one tensor, and only there.
    let info = gguf.tensor("Q4_K.2").unwrap();
    let mut data = gguf.tensor_data(info).to_vec();
    data[200] ^= 0x10;
    let mut flipped = rust.clone();
    let t = QTensor {
        name: info.name.clone(),
        ggml_type: info.ggml_type,
        shape: info.shape(),
        data: data.into(),
    };
    flipped.iter_mut().find(|r| r.0 == "Q4_K.2").unwrap().2 = hash(&t);
    assert_eq!(
        mismatches(&flipped, &python),
        vec!["Q4_K.2 (Q4_K)".to_string()]
    );
}

#[test]
fn every_tensor_of_smollm2_matches_gguf_python() {
    if !gguf_python::python_has(&["numpy", "gguf"]) {
        return;
    }
    let Some(path) = gguf_python::smollm2() else {
        return;
    };
    let gguf = GgufFile::open(&path).unwrap();
    let rust = rust_hashes(&gguf);
    let python = python_hashes(&path);
    assert_eq!(rust.len(), 272);
    assert_eq!(python.len(), 272);
    let types: std::collections::BTreeSet<_> = rust.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        ["F32", "Q4_1", "Q8_0"]
    );
    assert_eq!(mismatches(&rust, &python), Vec::<String>::new());
}

#[test]
fn every_tensor_of_gemma3_matches_gguf_python() {
    if !gguf_python::python_has(&["numpy", "gguf"]) {
        return;
    }
    let Some(path) = gguf_python::gemma3() else {
        return;
    };
    let gguf = GgufFile::open(&path).unwrap();
    let rust = rust_hashes(&gguf);
    let python = python_hashes(&path);
    assert_eq!(rust.len(), 236);
    assert_eq!(python.len(), 236);
    let types: std::collections::BTreeSet<_> = rust.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    );
    assert_eq!(mismatches(&rust, &python), Vec::<String>::new());
}

#[test]
fn fixture_models_read_by_gguf_python_match() {
    if !gguf_python::python_has(&["numpy", "gguf"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for name in fixtures::NAMES {
        let path = fixtures::write(name, dir.path()).unwrap();
        let rust = rust_hashes(&GgufFile::open(&path).unwrap());
        let python = python_hashes(&path);
        assert_eq!(rust.len(), python.len(), "{name}");
        assert_eq!(mismatches(&rust, &python), Vec::<String>::new(), "{name}");
    }
}
