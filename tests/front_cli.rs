//! The `taptree` front (src/front.rs): it answers the commands that read
//! trees (`ls`, `verify`, `diff`, `stat`) itself and hands every other
//! command line to `taptree-full`. Whichever answers, the user sees the
//! same bytes.

use crate::verify_support::*;

const FRONT: &str = env!("CARGO_BIN_EXE_taptree");
const FULL: &str = env!("CARGO_BIN_EXE_taptree-full");

fn run(bin: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(bin)
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap()
}

/// The front and the full command give the same stdout, stderr and exit
/// code for `args`.
#[track_caller]
fn same(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let front = run(Path::new(FRONT), args);
    let full = run(Path::new(FULL), args);
    assert_eq!(text(&front), text(&full));
    assert_eq!(
        front.status.code(),
        full.status.code(),
        "{:?}",
        text(&front)
    );
    front
}

#[test]
fn the_front_and_the_full_command_say_the_same() {
    let (_dir, a, b) = two_trees(0.0);
    let (_dir2, _, c) = two_trees(0.5);
    // Answered by the front before any parsing: identical trees.
    let o = same(&[&"verify", &a, &b]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        text(&o).0.starts_with("bitwise identical: 7 tensors"),
        "{:?}",
        text(&o)
    );
    // Parsed and answered by the front: the tree commands, their help and
    // their errors.
    let o = same(&[&"verify", &a, &c]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(
        text(&o).0.starts_with("differ: 1 changed"),
        "{:?}",
        text(&o)
    );
    let o = same(&[&"verify", &a, &_dir.path().join("nothing")]);
    assert_eq!(o.status.code(), Some(2));
    same(&[&"verify", &"--json", &a, &b]);
    same(&[&"verify", &"--rehash", &a, &b]);
    same(&[&"ls", &a]);
    same(&[&"verify"]);
    let o = same(&[&"diff", &a, &c]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert_eq!(same(&[&"diff", &a, &b, &"--json"]).status.code(), Some(0));
    assert_eq!(
        same(&[&"diff", &a, &c, &"--bitwise"]).status.code(),
        Some(1)
    );
    let o = same(&[&"diff", &a, &_dir.path().join("nothing")]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        same(&[&"diff", &a, &c, &"--tol", &"cos>="]).status.code(),
        Some(2)
    );
    assert_eq!(same(&[&"diff", &a]).status.code(), Some(2));
    same(&[&"stat", &a]);
    for help in ["--help", "-h"] {
        for verb in ["ls", "verify", "diff", "stat"] {
            let o = same(&[&verb, &help]);
            assert!(
                text(&o).0.contains(&format!("Usage: taptree {verb}")),
                "{verb} {help}"
            );
        }
    }
    // Handed over: the other commands, the command's own help and version,
    // and what is no command.
    same(&[&"--version"]);
    same(&[&"--help"]);
    same(&[&"help", &"diff"]);
    same(&[&"capture", &"--help"]);
    same(&[&"no-such-command"]);
}

#[test]
fn a_damaged_manifest_is_never_identical_through_the_front() {
    let (_dir, a, b) = two_trees(0.0);
    let manifest = b.join("manifest.json");
    let bytes = std::fs::read(&manifest).unwrap();
    // Cut right after a `}` inside the entry list: still "a manifest" to a
    // reader that stops at the root.
    let cut = bytes.len() / 2
        + bytes[bytes.len() / 2..]
            .iter()
            .position(|&c| c == b'}')
            .unwrap();
    std::fs::write(&manifest, &bytes[..=cut]).unwrap();
    let o = same(&[&"verify", &a, &b]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(text(&o).1.contains("manifest.json"), "{:?}", text(&o));
    assert!(!text(&o).0.contains("identical"), "{:?}", text(&o));
}

#[test]
fn a_front_without_the_full_command_says_what_is_missing() {
    let (dir, a, b) = two_trees(0.0);
    let (_dir2, _, c) = two_trees(0.5);
    let lone = dir.path().join("bin");
    std::fs::create_dir(&lone).unwrap();
    let front = lone.join("taptree");
    std::fs::copy(FRONT, &front).unwrap();
    // The front alone still answers the tree commands...
    let o = run(&front, &[&"verify", &a, &b]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(text(&o).0.starts_with("bitwise identical"));
    assert_eq!(run(&front, &[&"verify", &a, &c]).status.code(), Some(1));
    assert_eq!(run(&front, &[&"diff", &a, &c]).status.code(), Some(1));
    assert_eq!(run(&front, &[&"ls", &a]).status.code(), Some(0));
    // ...and everything else names the missing full command, exit 2.
    for args in [
        vec![&"replay" as &dyn AsRef<std::ffi::OsStr>, &a],
        vec![&"capture", &"--model", &"tiny-f32", &"--out", &c],
        vec![&"--version"],
    ] {
        let o = run(&front, &args);
        assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
        let (out, err) = text(&o);
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains(&lone.join("taptree-full").display().to_string())
                && err.contains("missing"),
            "{err}"
        );
    }
}

#[test]
fn a_full_command_of_another_build_than_its_front_refuses() {
    let (_dir, a, _) = two_trees(0.0);
    // Started by its own front: the ids agree (every test above).
    // Started with another build's id, as a front rebuilt alone would
    // start an older full command: exit 2, saying so, nothing done.
    let o = Command::new(FULL)
        .args(["ls".as_ref(), a.as_os_str()])
        .env("TAPTREE_FRONT_BUILD", "another-build")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("another build")
            && err.contains("another-build")
            && err.contains("build both"),
        "{err}"
    );
}
