//! `taptree verify TREE` (integrity) and `taptree verify A B` (the
//! refactoring oracle: are two trees bitwise identical?).

use crate::exit;
use capture::{compare, Comparison, Difference, TreeReader};
use std::io::{self, Write};
use std::path::PathBuf;

/// Check a tree's integrity, or whether two trees are bitwise identical.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
With one tree, every tensor file is reread and rehashed against the manifest: \
exit 0 when all match, 2 naming the first damaged file. Files in the tree that \
the manifest does not list are named in a note; they are not part of the tree.

With two trees, the manifests are trusted: the roots are compared (from the \
first bytes of each manifest), then the per-layer hashes, and no tensor file \
is read, so a file changed or damaged after its capture, or an edited \
manifest, goes unnoticed unless --rehash is given. Exit 0 \"bitwise \
identical\", 1 naming the first differing tap in forward order, 2 when a tree \
is missing, incomplete or damaged.")]
pub struct Args {
    /// One tree to check, or two (A B) to compare.
    #[arg(num_args = 1..=2, required = true, value_name = "TREE")]
    pub trees: Vec<PathBuf>,
    /// With two trees: reread and rehash every tensor file of both before
    /// comparing (without it, the manifests are trusted and no tensor is read).
    #[arg(long)]
    pub rehash: bool,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    match args.trees.as_slice() {
        [one] => {
            let checked = integrity(one)?;
            exit::report(exit::OK, |out| present_integrity(out, &checked, args.json))
        }
        [a, b] => {
            if !args.rehash && !args.json {
                // Equal roots settle it from the manifests' heads alone (the
                // JSON report counts from the whole manifests).
                if let Some(head) = crate::trusted::identical_heads(a, b)? {
                    return crate::trusted::report_identical(&head);
                }
            }
            let verdict = oracle(a, b, args.rehash)?;
            let code = if verdict.cmp.identical {
                exit::OK
            } else {
                exit::DIVERGED
            };
            exit::report(code, |out| present_oracle(out, &verdict, args.json))
        }
        _ => unreachable!("clap allows one or two trees"),
    }
}

/// One tree, every tensor file reread and rehashed against its manifest.
struct Integrity<'a> {
    tree: &'a PathBuf,
    taps: usize,
    bytes: u64,
    root: String,
    /// Files in the tree that its manifest does not list.
    unlisted: Vec<String>,
}

fn integrity(path: &PathBuf) -> anyhow::Result<Integrity<'_>> {
    let tree = TreeReader::open(path)?;
    let checked = tree.verify()?;
    Ok(Integrity {
        tree: path,
        taps: checked.taps,
        bytes: checked.bytes,
        root: tree.root().to_string(),
        unlisted: tree.unlisted()?,
    })
}

fn present_integrity(out: &mut dyn Write, v: &Integrity, json: bool) -> io::Result<()> {
    if json {
        let doc = serde_json::json!({
            "tree": v.tree,
            "ok": true,
            "taps": v.taps,
            "bytes": v.bytes,
            "root": v.root,
            "unlisted": v.unlisted,
        });
        return exit::json(out, &doc);
    }
    writeln!(
        out,
        "ok: {} tensors, {} bytes rehashed, root {}",
        v.taps, v.bytes, v.root
    )?;
    if !v.unlisted.is_empty() {
        const SHOWN: usize = 5;
        let more = match v.unlisted.len().saturating_sub(SHOWN) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        writeln!(
            out,
            "note: {} not in the manifest (not part of the tree, not checked): {}{more}",
            match v.unlisted.len() {
                1 => "1 file is".to_string(),
                n => format!("{n} files are"),
            },
            v.unlisted[..v.unlisted.len().min(SHOWN)].join(", ")
        )?;
    }
    Ok(())
}

/// Two trees compared entry by entry (after each was rehashed whole, with
/// `--rehash`).
struct Oracle<'a> {
    a: &'a PathBuf,
    b: &'a PathBuf,
    rehashed: bool,
    taps: usize,
    bytes: u64,
    root_a: String,
    root_b: String,
    cmp: Comparison,
    /// The first difference's tap files, in A and in B, where it has them.
    files: (Option<PathBuf>, Option<PathBuf>),
}

fn oracle<'a>(a: &'a PathBuf, b: &'a PathBuf, rehash: bool) -> anyhow::Result<Oracle<'a>> {
    let ta = TreeReader::open(a)?;
    let tb = TreeReader::open(b)?;
    if rehash {
        // Both trees at once: the rehash is I/O-bound, and two readers keep
        // the disk and both cores busy.
        let (ra, rb) = std::thread::scope(|s| {
            let ra = s.spawn(|| ta.verify());
            let rb = tb.verify();
            (ra.join().expect("a verify thread panicked"), rb)
        });
        ra?;
        rb?;
    }
    let cmp = compare(&ta, &tb);
    let files = match &cmp.first {
        Some(Difference::Changed { a: ea, b: eb }) => {
            (Some(ta.file_path(ea)), Some(tb.file_path(eb)))
        }
        Some(Difference::Missing(e)) => (Some(ta.file_path(e)), None),
        Some(Difference::Extra(e)) => (None, Some(tb.file_path(e))),
        None => (None, None),
    };
    Ok(Oracle {
        a,
        b,
        rehashed: rehash,
        taps: ta.entries().len(),
        bytes: ta.manifest().bytes_of_entries(),
        root_a: ta.root().to_string(),
        root_b: tb.root().to_string(),
        cmp,
        files,
    })
}

fn present_oracle(out: &mut dyn Write, v: &Oracle, json: bool) -> io::Result<()> {
    let cmp = &v.cmp;
    if json {
        let first = cmp.first.as_ref().map(|d| {
            let (kind, ha, hb) = match d {
                Difference::Changed { a, b } => ("changed", Some(&a.blake3), Some(&b.blake3)),
                Difference::Missing(e) => ("missing", Some(&e.blake3), None),
                Difference::Extra(e) => ("extra", None, Some(&e.blake3)),
            };
            serde_json::json!({
                "key": d.key().to_string(),
                "kind": kind,
                "a_blake3": ha,
                "b_blake3": hb,
            })
        });
        let doc = serde_json::json!({
            "a": v.a,
            "b": v.b,
            "identical": cmp.identical,
            "rehashed": v.rehashed,
            "taps": v.taps,
            "bytes": v.bytes,
            "root_a": v.root_a,
            "root_b": v.root_b,
            "changed": cmp.changed,
            "missing": cmp.missing,
            "extra": cmp.extra,
            "dirs_skipped": cmp.dirs_skipped,
            "dirs_differing": cmp.dirs_differing,
            "inputs_differ": cmp.inputs_differ,
            "first": first,
        });
        return exit::json(out, &doc);
    }
    let trust = if v.rehashed {
        "every tensor rehashed"
    } else {
        "manifests trusted; --rehash rereads every tensor"
    };
    if cmp.identical {
        writeln!(
            out,
            "bitwise identical: {} tensors, {} bytes, root {}",
            v.taps, v.bytes, v.root_a
        )?;
        if v.root_a != v.root_b {
            writeln!(
                out,
                "(the same tensors, hashed by format 1's rules: roots differ)"
            )?;
        }
    } else if let Some(what) = cmp.inputs_differ {
        writeln!(
            out,
            "differ: every tap equal, but not the runs' {what} (roots {} and {})",
            v.root_a, v.root_b
        )?;
    } else {
        let dirs = cmp.dirs_skipped + cmp.dirs_differing;
        writeln!(
            out,
            "differ: {} changed, {} missing from B, {} extra in B ({} of {dirs} layer directories identical, skipped)",
            cmp.changed, cmp.missing, cmp.extra, cmp.dirs_skipped
        )?;
        if let Some(first) = &cmp.first {
            writeln!(
                out,
                "first difference in forward order: {}",
                describe(first)
            )?;
            if let Some(p) = &v.files.0 {
                writeln!(out, "  A: {}", p.display())?;
            }
            if let Some(p) = &v.files.1 {
                writeln!(out, "  B: {}", p.display())?;
            }
        }
    }
    writeln!(out, "({trust})")?;
    Ok(())
}

fn describe(d: &Difference) -> String {
    let short = |h: &str| h[..h.len().min(12)].to_string();
    match d {
        Difference::Changed { a, b } if a.dtype != b.dtype || a.shape != b.shape => format!(
            "{}: {} {:?} in A, {} {:?} in B",
            a.key, a.dtype, a.shape, b.dtype, b.shape
        ),
        Difference::Changed { a, b } => format!(
            "{}: tensor bytes differ (blake3 {} in A, {} in B)",
            a.key,
            short(&a.blake3),
            short(&b.blake3)
        ),
        Difference::Missing(e) => format!("{}: only in A", e.key),
        Difference::Extra(e) => format!("{}: only in B", e.key),
    }
}
