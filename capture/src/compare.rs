//! Bitwise comparison of two trees from their manifests: roots first, then
//! per-directory hashes, then the entries of the directories that differ.
//! No tensor is read; rehash first (`TreeReader::verify`) to distrust files.

use crate::manifest::{Entry, Manifest};
use crate::reader::TreeReader;
use crate::Key;
use std::collections::{BTreeSet, HashMap};

/// How one tap differs between A and B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// In both, with other bytes, dtype or shape.
    Changed {
        /// A's entry.
        a: Entry,
        /// B's entry.
        b: Entry,
    },
    /// In A, not in B.
    Missing(Entry),
    /// In B, not in A.
    Extra(Entry),
}

impl Difference {
    /// The key of the tap that differs.
    pub fn key(&self) -> &Key {
        match self {
            Difference::Changed { a, .. } => &a.key,
            Difference::Missing(e) | Difference::Extra(e) => &e.key,
        }
    }
}

/// The outcome of comparing two trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// Whether the roots are equal: the same taps, bitwise, and the same
    /// selection, verdict-steering run fields and stages. Where the roots
    /// differ only by their hash rules (a format 1 tree), the same taps and
    /// the same verdict inputs.
    pub identical: bool,
    /// The first difference in A's forward order (extras, in B's order, after).
    pub first: Option<Difference>,
    /// Taps in both trees whose entries differ.
    pub changed: usize,
    /// Taps in A only.
    pub missing: usize,
    /// Taps in B only.
    pub extra: usize,
    /// Directories whose hashes were equal and were not looked into.
    pub dirs_skipped: usize,
    /// Directories with a difference (present on one side counts).
    pub dirs_differing: usize,
    /// Where every tap is equal but the roots differ: the first of what
    /// else enters the root that differs (`prompt tokens`, `precision`,
    /// ...; see [`inputs_differ`]).
    pub inputs_differ: Option<&'static str>,
}

/// Whether two manifests' roots are equal: every tensor bitwise identical.
pub fn same_root(a: &Manifest, b: &Manifest) -> bool {
    a.root == b.root
}

/// The directories whose hashes are equal in A and B: every tap in them is
/// bitwise equal on both sides, and none needs to be looked at.
pub fn equal_dirs<'m>(a: &'m Manifest, b: &Manifest) -> BTreeSet<&'m str> {
    a.dirs
        .iter()
        .filter(|(d, h)| b.dirs.get(*d) == Some(*h))
        .map(|(d, _)| d.as_str())
        .collect()
}

/// Compares A and B, trusting both manifests.
pub fn compare(a: &TreeReader, b: &TreeReader) -> Comparison {
    let (ma, mb) = (a.manifest(), b.manifest());
    let mut out = Comparison {
        identical: false,
        first: None,
        changed: 0,
        missing: 0,
        extra: 0,
        dirs_skipped: 0,
        dirs_differing: 0,
        inputs_differ: None,
    };
    if same_root(ma, mb) {
        out.identical = true;
        out.dirs_skipped = ma.dirs.len();
        return out;
    }
    let equal = equal_dirs(ma, mb);
    out.dirs_skipped = equal.len();
    let mut differing = std::collections::HashSet::new();
    for dir in ma.dirs.keys() {
        if !equal.contains(dir.as_str()) {
            differing.insert(dir.as_str());
        }
    }
    for dir in mb.dirs.keys() {
        if !ma.dirs.contains_key(dir) {
            differing.insert(dir.as_str());
        }
    }
    out.dirs_differing = differing.len();
    let in_differing = |e: &&Entry| {
        let dir = e.path.split('/').next().unwrap_or("");
        differing.contains(dir)
    };
    let b_index: HashMap<&Key, &Entry> = mb
        .entries
        .iter()
        .filter(in_differing)
        .map(|e| (&e.key, e))
        .collect();
    let mut seen_in_a = std::collections::HashSet::new();
    for ea in ma.entries.iter().filter(in_differing) {
        seen_in_a.insert(&ea.key);
        let diff = match b_index.get(&ea.key) {
            Some(eb) if eb.blake3 == ea.blake3 && eb.dtype == ea.dtype && eb.shape == ea.shape => {
                continue
            }
            Some(eb) => {
                out.changed += 1;
                Difference::Changed {
                    a: ea.clone(),
                    b: (*eb).clone(),
                }
            }
            None => {
                out.missing += 1;
                Difference::Missing(ea.clone())
            }
        };
        out.first.get_or_insert(diff);
    }
    for eb in mb.entries.iter().filter(in_differing) {
        if !seen_in_a.contains(&eb.key) {
            out.extra += 1;
            out.first
                .get_or_insert_with(|| Difference::Extra(eb.clone()));
        }
    }
    // Every tap equal under roots that differ: what else enters the root
    // differs (two trees fed other prompts, or run another way, are not
    // identical however equal their tensors), or only the hash rules do (a
    // format 1 tree hashed its taps in capture order, and nothing else):
    // that is identical.
    let taps_equal = out.changed == 0 && out.missing == 0 && out.extra == 0;
    out.inputs_differ = taps_equal.then(|| inputs_differ(ma, mb)).flatten();
    out.identical = taps_equal && out.inputs_differ.is_none();
    out
}

/// The first of what besides the entries enters a format 2 root that `a`
/// and `b` do not share: `selection`, `precision`, `prompt tokens`,
/// `switches` or `stage vocabulary` (its stages' names, scopes and inputs:
/// declared layouts do not enter the root).
pub fn inputs_differ(a: &Manifest, b: &Manifest) -> Option<&'static str> {
    let (ia, ib) = (a.verdict_inputs(), b.verdict_inputs());
    let same_stages = ia.stages.len() == ib.stages.len()
        && ia.stages.iter().zip(ib.stages).all(|(x, y)| {
            (&x.name, x.scope, &x.inputs, &x.first_layer_inputs)
                == (&y.name, y.scope, &y.inputs, &y.first_layer_inputs)
        });
    [
        ("selection", ia.selection == ib.selection),
        ("precision", ia.run.precision == ib.run.precision),
        (
            "prompt tokens",
            ia.run.prompt_tokens == ib.run.prompt_tokens,
        ),
        ("switches", ia.run.switches == ib.run.switches),
        ("stage vocabulary", same_stages),
    ]
    .into_iter()
    .find(|(_, same)| !same)
    .map(|(what, _)| what)
}
