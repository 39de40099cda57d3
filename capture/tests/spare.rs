//! Replacing a tree keeps the replaced one as the path's spare
//! (`.NAME.taptree-spare`), and the next replacement writes over its files
//! instead of deleting them: same tree bits, same guarantees (a killed
//! replacement leaves the old tree, nothing of the user's is written
//! through a link), one spare per path, none outliving its tree, and
//! `TAPTREE_SPARE=0` deleting replaced trees instead.

#![cfg(not(feature = "compile-out"))]

mod tree_support;
use tree_support::*;

#[cfg(unix)]
fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).unwrap().ino()
}

const TAP: &str = "L001";

/// A tap file of layer 1 in `tree`.
fn a_tap_file(tree: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(tree.join(TAP))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.remove(0)
}

#[cfg(unix)]
#[test]
fn a_replacement_writes_over_the_spare_and_keeps_the_tree_it_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let spare = dir.path().join(".t.taptree-spare");
    let first = capture_tree(&out, "", 0.0);
    let second = replace_tree(&out, 5.0);
    assert_eq!(TreeReader::open(&spare).unwrap().root(), first.root);
    let spare_file = a_tap_file(&spare);
    let spare_ino = inode(&spare_file);
    let third = replace_tree(&out, 7.0);
    assert_ne!(third.root, second.root);
    let tree = TreeReader::open(&out).unwrap();
    assert_eq!(tree.root(), third.root);
    tree.verify().unwrap();
    // The same file, written over: no file deleted and created.
    let rel = spare_file.strip_prefix(&spare).unwrap();
    assert_eq!(
        inode(&out.join(rel)),
        spare_ino,
        "{} was not written over",
        rel.display()
    );
    // The spare is now the second tree, whole.
    let kept = TreeReader::open(&spare).unwrap();
    assert_eq!(kept.root(), second.root);
    kept.verify().unwrap();
    assert_eq!(listing(dir.path()), [".t.taptree-spare", "t"]);
}

#[test]
fn files_of_the_spare_the_new_tree_does_not_name_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let first = capture_tree(&out, "", 0.0);
    replace_tree(&out, 5.0);
    // The spare holds both layers; the new tree only layer 0 and the
    // global stages, whose shorter files are written over longer ones.
    let summary = {
        let _guard = serial();
        let mut o = opts(&out, "layer=0");
        o.force = true;
        let cap = Capture::start(o).unwrap();
        forward(9.0);
        cap.finish().unwrap()
    };
    let tree = TreeReader::open(&out).unwrap();
    assert_eq!(tree.root(), summary.root);
    tree.verify().unwrap();
    assert!(
        !out.join(TAP).exists(),
        "layer 1's files were left in the tree"
    );
    assert!(tree.entries().len() < first.taps);
    assert_eq!(tree.unlisted().unwrap(), Vec::<String>::new());
}

#[test]
fn a_killed_replacement_over_the_spare_leaves_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    capture_tree(&out, "", 0.0);
    let current = replace_tree(&out, 5.0);
    {
        let _guard = serial();
        let mut o = opts(&out, "");
        o.force = true;
        let cap = Capture::start(o).unwrap();
        forward(7.0);
        drop(cap);
    }
    let tree = TreeReader::open(&out).unwrap();
    assert_eq!(tree.root(), current.root);
    tree.verify().unwrap();
    // The spare was taken and half written over: it is gone, not kept.
    assert_eq!(listing(dir.path()), ["t"]);
}

#[test]
fn a_spare_whose_tree_was_deleted_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    capture_tree(&out, "", 0.0);
    replace_tree(&out, 5.0);
    std::fs::remove_dir_all(&out).unwrap();
    let fresh = capture_tree(&out, "", 3.0);
    assert_eq!(TreeReader::open(&out).unwrap().root(), fresh.root);
    assert_eq!(listing(dir.path()), ["t"]);
}

#[cfg(unix)]
#[test]
fn nothing_is_written_through_a_link_planted_in_the_spare() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let spare = dir.path().join(".t.taptree-spare");
    capture_tree(&out, "", 0.0);
    replace_tree(&out, 5.0);
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "mine").unwrap();
    // A hard link: the spare is still all files, so it is taken; the
    // linked file must be replaced, not written into.
    let linked = a_tap_file(&spare);
    std::fs::remove_file(&linked).unwrap();
    std::fs::hard_link(&victim, &linked).unwrap();
    let summary = replace_tree(&out, 7.0);
    assert_eq!(std::fs::read(&victim).unwrap(), b"mine");
    TreeReader::open(&out).unwrap().verify().unwrap();
    // A symbolic link: not a tree's file, so the spare is not taken (and is
    // deleted as a tree, the link with it, never its target).
    let linked = a_tap_file(&spare);
    std::fs::remove_file(&linked).unwrap();
    std::os::unix::fs::symlink(&victim, &linked).unwrap();
    let last = replace_tree(&out, 9.0);
    assert_ne!(last.root, summary.root);
    assert_eq!(std::fs::read(&victim).unwrap(), b"mine");
    let tree = TreeReader::open(&out).unwrap();
    assert_eq!(tree.root(), last.root);
    tree.verify().unwrap();
    assert_eq!(TreeReader::open(&spare).unwrap().root(), summary.root);
}

#[test]
fn with_spares_off_a_replaced_tree_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    capture_tree(&out, "", 0.0);
    // A spare from a replacement with spares on goes too.
    replace_tree(&out, 2.0);
    assert_eq!(listing(dir.path()), [".t.taptree-spare", "t"]);
    let summary = {
        let _guard = serial();
        // Read only by captures, which all hold `serial()`.
        std::env::set_var("TAPTREE_SPARE", "0");
        let mut o = opts(&out, "");
        o.force = true;
        let cap = Capture::start(o).unwrap();
        forward(5.0);
        let s = cap.finish();
        std::env::remove_var("TAPTREE_SPARE");
        s.unwrap()
    };
    assert_eq!(TreeReader::open(&out).unwrap().root(), summary.root);
    assert_eq!(listing(dir.path()), ["t"]);
}
