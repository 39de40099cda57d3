//! The hashes that make two trees comparable without reading their tensors
//! (format 2; format 1 still read): one line per tap per directory, the
//! directories, and what steers a verdict, into the root.
//!
//! Format 2 hashes, per directory, one line per tap in **byte order of the
//! lines** (so the root does not depend on the order the taps were
//! captured in): `stage \t layer \t pos_start \t pos_end \t slot \t dtype \t shape \t blake3 \n`
//! (`-` for an absent layer or slot, shape as comma-separated dimensions).
//! The root hash covers `dir \t dir_hash \n` for every directory in byte
//! order of its name, then everything else in the manifest that steers a
//! verdict: the selection, the run's precision, prompt tokens and switches,
//! and the stage vocabulary. No time, host, path, argv or other run metadata
//! enters a hash, so equal roots mean bitwise-equal tensors under equal keys,
//! compared the same way. Each entry also carries the blake3 of its file's
//! safetensors header, and the manifest its own seal ([`crate::manifest::seal`]).
//! Format 1 (capture-order lines, nothing but the entries in the root) is
//! still read. docs/FORMAT.md is the normative description.

use crate::dir_text;
use crate::dtype::DType;
use crate::key::Key;
use crate::manifest::{
    dir_of_layer, parse_version, push_decimal, push_decimal_bytes, Entry, Manifest, RunInfo,
};
use crate::stage::StageSpec;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Everything in a manifest besides its entries that steers a verdict, and
/// so enters the root: which taps were selected, how the run was made
/// (precision, prompt tokens, switches), and the stage graph that decides
/// an origin from an inherited divergence.
#[derive(Debug, Clone, Copy)]
pub struct VerdictInputs<'a> {
    /// The selection's canonical string (`all` for everything).
    pub selection: &'a str,
    /// How the run was made; only its `precision`, `switches` and
    /// `prompt_tokens` are hashed.
    pub run: &'a RunInfo,
    /// The stage vocabulary in forward order, with each stage's inputs.
    pub stages: &'a [StageSpec],
}

/// The line an entry contributes to its directory's hash.
pub fn hash_line(out: &mut String, key: &Key, dtype: DType, shape: &[usize], blake3: &str) {
    let mut line = Vec::with_capacity(128);
    hash_line_bytes(&mut line, key, dtype, shape, blake3);
    out.push_str(std::str::from_utf8(&line).expect("a hash line is its fields' text"));
}

/// [`hash_line`] appended to bytes (the directory hashes build their text
/// as bytes: no UTF-8 check per piece).
fn hash_line_bytes(out: &mut Vec<u8>, key: &Key, dtype: DType, shape: &[usize], blake3: &str) {
    let dims = shape.iter().map(|&d| d as u64);
    line_fields(
        out,
        &key.stage,
        (key.layer, &key.pos, key.slot),
        dtype,
        dims,
    );
    out.extend_from_slice(blake3.as_bytes());
    // Format 2.2: only a ranked tap's line grows, so trees without ranks
    // keep their hashes.
    if let Some(rank) = key.rank {
        out.extend_from_slice(b"\trank ");
        push_decimal_bytes(out, rank as u64);
    }
    if let Some(shard) = key.shard {
        out.extend_from_slice(format!("\tshard {shard}").as_bytes());
    }
    out.push(b'\n');
}

/// The fields of a hash line before its tap's hash, through the tab that
/// precedes it: from an owned entry ([`hash_line`]) or an index's record.
pub(crate) fn line_fields(
    out: &mut Vec<u8>,
    stage: &str,
    (layer, pos, slot): (Option<u32>, &std::ops::Range<u32>, Option<u32>),
    dtype: DType,
    shape: impl Iterator<Item = u64>,
) {
    // Written piece by piece, not through `write!`: opening a tree hashes
    // every entry, and formatting was most of that.
    let opt = |out: &mut Vec<u8>, v: Option<u32>| match v {
        Some(v) => push_decimal_bytes(out, v as u64),
        None => out.push(b'-'),
    };
    out.extend_from_slice(stage.as_bytes());
    out.push(b'\t');
    opt(out, layer);
    out.push(b'\t');
    push_decimal_bytes(out, pos.start as u64);
    out.push(b'\t');
    push_decimal_bytes(out, pos.end as u64);
    out.push(b'\t');
    opt(out, slot);
    out.push(b'\t');
    out.extend_from_slice(dtype.name().as_bytes());
    out.push(b'\t');
    for (i, d) in shape.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_decimal_bytes(out, d);
    }
    out.push(b'\t');
}

impl Manifest {
    /// The directory and root hashes of this manifest's content, by the
    /// definition of its major version (format 1 only hashed the entries,
    /// in capture order).
    pub fn hashes(&self) -> (BTreeMap<String, String>, String) {
        match parse_version(&self.format_version) {
            Some((1, _)) => tree_hashes_v1(&self.entries),
            _ => tree_hashes(&self.entries, &self.verdict_inputs()),
        }
    }

    /// What in this manifest, besides the entries, steers a verdict.
    pub fn verdict_inputs(&self) -> VerdictInputs<'_> {
        VerdictInputs {
            selection: &self.selection,
            run: &self.run,
            stages: &self.stages,
        }
    }
}

/// Per-directory hashes and the root hash (format 2) of `entries`, in any
/// order, and of what else steers a verdict.
pub fn tree_hashes(
    entries: &[Entry],
    inputs: &VerdictInputs,
) -> (BTreeMap<String, String>, String) {
    tree_hashes_by(
        entries.len(),
        |i| entries[i].key.layer,
        |out, i| {
            let e = &entries[i];
            hash_line_bytes(out, &e.key, e.dtype, &e.shape, &e.blake3)
        },
        inputs,
    )
}

/// [`tree_hashes`] of `n` taps given by number: `layer(i)` is tap `i`'s
/// layer, `line(out, i)` appends its hash line (owned entries, or an
/// index's records read in place).
pub(crate) fn tree_hashes_by(
    n: usize,
    layer: impl Fn(usize) -> Option<u32> + Sync,
    line: impl Fn(&mut Vec<u8>, usize) + Sync,
    inputs: &VerdictInputs,
) -> (BTreeMap<String, String>, String) {
    use rayon::prelude::*;
    // Each directory's taps, found a chunk of taps per core (consecutive
    // taps mostly share a layer: runs of one layer), the chunks' runs then
    // joined in order; then (a directory per core) its lines in one
    // buffer, sorted in byte order and hashed.
    const CHUNK: usize = 4096;
    let runs: Vec<Vec<(Option<u32>, std::ops::Range<u32>)>> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut runs: Vec<(Option<u32>, std::ops::Range<u32>)> = Vec::new();
            for i in c * CHUNK..n.min((c + 1) * CHUNK) {
                let l = layer(i);
                match runs.last_mut() {
                    Some((x, r)) if *x == l => r.end = i as u32 + 1,
                    _ => runs.push((l, i as u32..i as u32 + 1)),
                }
            }
            runs
        })
        .collect();
    let mut groups: Vec<(Option<u32>, Vec<u32>)> = Vec::new();
    let mut group_of: std::collections::HashMap<Option<u32>, usize> = Default::default();
    for (l, r) in runs.into_iter().flatten() {
        let g = *group_of.entry(l).or_insert_with(|| {
            groups.push((l, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.extend(r);
    }
    let dirs: BTreeMap<String, String> = groups
        .into_par_iter()
        .map(|(layer, d)| {
            let mut text = Vec::with_capacity(d.len() * 128);
            let mut lines: Vec<dir_text::Line> = Vec::with_capacity(d.len());
            for i in d {
                let start = text.len();
                line(&mut text, i as usize);
                lines.push(dir_text::Line::new(&text, start));
            }
            (dir_of_layer(layer), dir_text::hash(&text, lines))
        })
        .collect();
    let root = root_hash(&dirs, inputs);
    (dirs, root)
}

/// The root hash (format 2) over directory hashes and what else steers a
/// verdict. Strings are written `{byte length}:{text}`, so no value can
/// forge a separator.
pub fn root_hash(dirs: &BTreeMap<String, String>, inputs: &VerdictInputs) -> String {
    fn text(out: &mut String, s: &str) {
        let _ = write!(out, "{}:{s}", s.len());
    }
    fn list(out: &mut String, items: &[String]) {
        for (i, s) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            text(out, s);
        }
    }
    let mut root = String::from("taptree root v2\n");
    for (dir, hash) in dirs {
        let _ = writeln!(root, "{dir}\t{hash}");
    }
    root.push_str("selection\t");
    text(&mut root, inputs.selection);
    root.push_str("\nprecision\t");
    text(&mut root, &inputs.run.precision);
    root.push_str("\ntokens\t");
    for (i, t) in inputs.run.prompt_tokens.iter().enumerate() {
        if i > 0 {
            root.push(',');
        }
        push_decimal(&mut root, u64::from(*t));
    }
    root.push('\n');
    for (name, value) in &inputs.run.switches {
        root.push_str("switch\t");
        text(&mut root, name);
        root.push('\t');
        text(&mut root, value);
        root.push('\n');
    }
    for s in inputs.stages {
        root.push_str("stage\t");
        text(&mut root, &s.name);
        root.push_str(match s.scope {
            crate::stage::Scope::Global => "\tglobal\t",
            crate::stage::Scope::Layer => "\tlayer\t",
        });
        list(&mut root, &s.inputs);
        root.push('\t');
        list(&mut root, &s.first_layer_inputs);
        root.push('\n');
    }
    blake3::hash(root.as_bytes()).to_hex().to_string()
}

/// Format 1's per-directory hashes and root hash of `entries`: lines in
/// capture order, and nothing but the entries in the root.
pub fn tree_hashes_v1(entries: &[Entry]) -> (BTreeMap<String, String>, String) {
    /// A directory's hash under way. Its lines are hashed a batch of whole
    /// blake3 chunks at a time: each update still hashes many chunks at
    /// once, and no directory's text (megabytes on a large tree, all fresh
    /// pages) is ever held whole.
    struct Dir {
        layer: Option<u32>,
        hasher: blake3::Hasher,
        pending: Vec<u8>,
    }
    const CHUNK: usize = 1024;
    const BATCH: usize = 16 * CHUNK;
    let dirs = by_layer(
        entries,
        |layer| {
            let mut pending = Vec::with_capacity(BATCH + 256);
            pending.extend_from_slice(b"taptree dir v1\n");
            Dir {
                layer,
                hasher: blake3::Hasher::new(),
                pending,
            }
        },
        |d, e| {
            hash_line_bytes(&mut d.pending, &e.key, e.dtype, &e.shape, &e.blake3);
            if d.pending.len() >= BATCH {
                // Whole chunks only, so that the next update starts on a chunk.
                let whole = d.pending.len() / CHUNK * CHUNK;
                d.hasher.update(&d.pending[..whole]);
                d.pending.drain(..whole);
            }
        },
    );
    let dirs: BTreeMap<String, String> = dirs
        .into_iter()
        .map(|(_, mut d)| {
            d.hasher.update(&d.pending);
            (
                dir_of_layer(d.layer),
                d.hasher.finalize().to_hex().to_string(),
            )
        })
        .collect();
    let mut root = String::from("taptree root v1\n");
    for (dir, hash) in &dirs {
        let _ = writeln!(root, "{dir}\t{hash}");
    }
    (dirs, blake3::hash(root.as_bytes()).to_hex().to_string())
}

/// Entries grouped by directory (layer), in the order each layer first
/// appears, each group built by `add` on what `new` made for its layer.
/// Found without building each entry's directory name: consecutive entries
/// mostly share a layer, so the last one is tried first.
fn by_layer<'e, D>(
    entries: &'e [Entry],
    mut new: impl FnMut(Option<u32>) -> D,
    mut add: impl FnMut(&mut D, &'e Entry),
) -> Vec<(Option<u32>, D)> {
    let mut dirs: Vec<(Option<u32>, D)> = Vec::new();
    let mut slot_of: std::collections::HashMap<Option<u32>, usize> = Default::default();
    let mut last: Option<(Option<u32>, usize)> = None;
    for e in entries {
        let layer = e.key.layer;
        let i = match last {
            Some((l, i)) if l == layer => i,
            _ => *slot_of.entry(layer).or_insert_with(|| {
                dirs.push((layer, new(layer)));
                dirs.len() - 1
            }),
        };
        last = Some((layer, i));
        add(&mut dirs[i].1, e);
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::path_of;

    fn entry(stage: &str, layer: Option<u32>, hash: &str) -> Entry {
        let key = Key::new(stage, layer, 0..2);
        Entry {
            path: path_of(&key),
            key,
            dtype: DType::F32,
            shape: vec![2, 3],
            blake3: hash.to_string(),
            bytes: 24,
            header_blake3: None,
        }
    }

    fn hashes(entries: &[Entry]) -> (BTreeMap<String, String>, String) {
        let run = RunInfo::default();
        tree_hashes(
            entries,
            &VerdictInputs {
                selection: "all",
                run: &run,
                stages: &[],
            },
        )
    }

    #[test]
    fn hashes_see_only_tensor_identity() {
        let a = vec![
            entry("attn_norm", Some(0), "aa"),
            entry("logits", None, "bb"),
        ];
        let (dirs, root) = hashes(&a);
        assert_eq!(dirs.len(), 2);
        // Same content, other run metadata: same root (the run never enters).
        assert_eq!(hashes(&a.clone()).1, root);
        // A changed tensor changes its directory's hash and the root, not the other directory.
        let mut b = a.clone();
        b[1].blake3 = "cc".into();
        let (dirs_b, root_b) = hashes(&b);
        assert_ne!(root_b, root);
        assert_eq!(dirs_b["L000"], dirs["L000"]);
        assert_ne!(dirs_b["global"], dirs["global"]);
        // Shape and dtype are part of the identity too.
        let mut c = a.clone();
        c[0].shape = vec![3, 2];
        assert_ne!(hashes(&c).1, root);
        let mut d = a.clone();
        d[0].dtype = DType::I32;
        assert_ne!(hashes(&d).1, root);
        let mut e = a.clone();
        e[0].key.slot = Some(0);
        assert_ne!(hashes(&e).1, root);
    }

    #[test]
    fn root_does_not_depend_on_capture_order() {
        // A refactor that computes v before q and k taps them in another
        // order: the same tensors must give the same root.
        let a = vec![
            entry("q_proj", Some(0), "aa"),
            entry("k_proj", Some(0), "bb"),
            entry("v_proj", Some(0), "cc"),
            entry("logits", None, "dd"),
        ];
        let mut b = a.clone();
        b.rotate_left(2);
        assert_eq!(hashes(&b), hashes(&a));
        // Format 1 hashed capture order: the defect this fixes.
        assert_ne!(tree_hashes_v1(&b).1, tree_hashes_v1(&a).1);
    }

    #[test]
    fn root_covers_what_steers_a_verdict() {
        let a = vec![entry("attn_norm", Some(0), "aa")];
        let run = RunInfo {
            precision: "f32".into(),
            prompt_tokens: vec![1, 2],
            switches: [("fast".to_string(), "1".to_string())].into(),
            host: "here".into(),
            time: "2026-01-01T00:00:00Z".into(),
            ..RunInfo::default()
        };
        let stages = [StageSpec::layer("attn_norm", &["post_ffn_residual@prev"])
            .with_first_layer_inputs(&["embedding"])];
        let root = |f: &dyn Fn(&mut RunInfo, &mut String, &mut Vec<StageSpec>)| {
            let (mut run, mut selection, mut stages) =
                (run.clone(), "all".to_string(), stages.to_vec());
            f(&mut run, &mut selection, &mut stages);
            let inputs = VerdictInputs {
                selection: &selection,
                run: &run,
                stages: &stages,
            };
            tree_hashes(&a, &inputs).1
        };
        let base = root(&|_, _, _| {});
        // Times, hosts, argv, revisions: not a verdict's business.
        assert_eq!(root(&|r, _, _| r.host = "there".into()), base);
        assert_eq!(
            root(&|r, _, _| r.time = "2027-01-01T00:00:00Z".into()),
            base
        );
        assert_eq!(root(&|r, _, _| r.git_rev = Some("abc".into())), base);
        // Each of these changes what a verdict would say.
        assert_ne!(root(&|r, _, _| r.precision = "q8".into()), base);
        assert_ne!(root(&|r, _, _| r.prompt_tokens = vec![1, 3]), base);
        assert_ne!(root(&|r, _, _| r.prompt_tokens = vec![12]), base);
        assert_ne!(
            root(&|r, _, _| {
                r.switches.insert("fast".into(), "0".into());
            }),
            base
        );
        assert_ne!(root(&|_, s, _| *s = "stage=attn_*".into()), base);
        assert_ne!(root(&|_, _, st| st[0].inputs.clear()), base);
        assert_ne!(root(&|_, _, st| st[0].first_layer_inputs.clear()), base);
        assert_ne!(
            root(&|_, _, st| st[0].scope = crate::stage::Scope::Global),
            base
        );
        // Length-prefixed strings: moving text between fields is seen.
        assert_ne!(
            root(&|r, _, _| {
                r.switches = [("fa".to_string(), "st\t1".to_string())].into();
            }),
            root(&|r, _, _| {
                r.switches = [("fa\tst".to_string(), "1".to_string())].into();
            })
        );
    }

    #[test]
    fn directory_hashes_of_many_entries_equal_the_hash_of_the_whole_text() {
        let entry = |layer: Option<u32>, p: u32| {
            let key = Key::new("ffn_down", layer, p..p + 1);
            Entry {
                path: path_of(&key),
                key,
                dtype: DType::F32,
                shape: vec![1, 576],
                blake3: format!("{:064x}", p as u64 * 7 + layer.map_or(9, u64::from)),
                bytes: 576 * 4,
                header_blake3: None,
            }
        };
        // Directories far larger than one hashing batch, their entries
        // interleaved as a decode loop writes them: more taps than one
        // chunk of the grouping (4096), every run one tap long.
        let interleaved: Vec<Entry> = (0..1500u32)
            .flat_map(|p| [Some(0), Some(1), None].map(|l| entry(l, p)))
            .collect();
        // Long runs of one layer, one of them across the chunks' boundary
        // at 4096, and a layer that comes back after others.
        let runs: Vec<Entry> = (0..3000)
            .map(|p| entry(Some(0), p))
            .chain((0..2000).map(|p| entry(Some(1), p)))
            .chain((0..1500).map(|p| entry(None, p)))
            .chain((3000..3100).map(|p| entry(Some(0), p)))
            .collect();
        for entries in [interleaved, runs] {
            let (dirs, _) = hashes(&entries);
            for layer in [Some(0), Some(1), None] {
                let mut lines: Vec<String> = entries
                    .iter()
                    .filter(|e| e.key.layer == layer)
                    .map(|e| {
                        let mut line = String::new();
                        hash_line(&mut line, &e.key, e.dtype, &e.shape, &e.blake3);
                        line
                    })
                    .collect();
                lines.sort();
                let text = format!("taptree dir v2\n{}", lines.concat());
                assert!(text.len() > 3 * 16 * 1024);
                let want = blake3::hash(text.as_bytes()).to_hex().to_string();
                assert_eq!(dirs[&dir_of_layer(layer)], want, "layer {layer:?}");
            }
        }
    }

    #[test]
    fn golden_root() {
        // The hash definition is part of the format: a change here is a
        // format change (bump the major version in FORMAT_VERSION and FORMAT.md).
        let a = vec![
            entry("attn_norm", Some(0), "aa"),
            entry("logits", None, "bb"),
        ];
        let mut text = String::new();
        hash_line(&mut text, &a[0].key, a[0].dtype, &a[0].shape, &a[0].blake3);
        assert_eq!(text, "attn_norm\t0\t0\t2\t-\tF32\t2,3\taa\n");
        let dir = blake3::hash(format!("taptree dir v2\n{text}").as_bytes()).to_hex();
        assert_eq!(hashes(&a).0["L000"], dir.as_str());
        let v1 = blake3::hash(format!("taptree dir v1\n{text}").as_bytes()).to_hex();
        assert_eq!(tree_hashes_v1(&a).0["L000"], v1.as_str());
        let global = hashes(&a).0["global"].clone();
        let root = format!(
            "taptree root v2\nL000\t{dir}\nglobal\t{global}\nselection\t3:all\nprecision\t0:\ntokens\t\n"
        );
        assert_eq!(
            hashes(&a).1,
            blake3::hash(root.as_bytes()).to_hex().as_str()
        );
    }
}
