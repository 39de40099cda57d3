//! The `tree` target's edits: what a hostile writer changes in a tree whose
//! every hash it then redoes. Each edit changes the meaning of the
//! manifest's entries or of its run, not its bytes at random: positions,
//! layers, slots, ranks and shards, stages, shapes, dtypes, byte counts,
//! paths, the entries' number and order, the prompt, the stage vocabulary.
//! An edited entry's tap file is sometimes written again to match it (key,
//! dtype and shape in its header, its tensor hash in the entry: module
//! `tap_files`), so that no hash or header check is left to catch it.
//! `reseal::reseal` then redoes the directory hashes, the root, the seal
//! and the index.

use capture::manifest::{self, MAX_LAYER, MAX_POSITION};
use capture::{DType, Manifest, Scope, Shard, StageSpec};
use std::path::Path;

/// One edit's context: the manifest being edited and the tree whose tap
/// files it may write.
pub struct Editor<'a> {
    pub rng: &'a mut fastrand::Rng,
    pub m: &'a mut Manifest,
    pub tree: &'a Path,
}

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F64,
    DType::I8,
    DType::I32,
];

impl Editor<'_> {
    /// Applies one random edit; says what it did.
    pub fn edit(&mut self) -> String {
        if self.m.entries.is_empty() {
            return self.run_edit();
        }
        match self.rng.u8(..21) {
            0 | 1 => self.positions(),
            2 => self.layer(),
            3 => self.slot(),
            4 => self.rank(),
            5 => self.stage(),
            6 | 7 => self.shape(),
            8 => self.dtype(),
            9 => self.bytes(),
            10 => self.path(),
            11 => self.duplicate(),
            12 => self.drop(),
            13 => self.reorder(),
            14 | 15 => self.run_edit(),
            16 => self.vocabulary(),
            17 => self.version(),
            18 => self.split_rows(),
            _ => self.reshard(),
        }
    }

    pub(crate) fn pick(&mut self) -> usize {
        self.rng.usize(..self.m.entries.len())
    }

    pub(crate) fn name(&self, i: usize) -> String {
        format!("entry {i} ({})", self.m.entries[i].key)
    }

    /// Another entry of the same stage, layer, slot and rank, if any.
    fn neighbour(&mut self, i: usize) -> Option<usize> {
        let k = &self.m.entries[i].key;
        let same: Vec<usize> = (self.m.entries.iter().enumerate())
            .filter(|(j, e)| {
                *j != i
                    && e.key.stage == k.stage
                    && e.key.layer == k.layer
                    && e.key.slot == k.slot
                    && e.key.rank == k.rank
            })
            .map(|(j, _)| j)
            .collect();
        (!same.is_empty()).then(|| same[self.rng.usize(..same.len())])
    }

    fn positions(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let pos = self.m.entries[i].key.pos.clone();
        let rows = pos.end.wrapping_sub(pos.start).max(1);
        let what = match self.rng.u8(..9) {
            0 => {
                self.m.entries[i].key.pos = pos.start..pos.start;
                "empty".to_string()
            }
            1 => {
                self.m.entries[i].key.pos = pos.end..pos.start;
                "reversed".to_string()
            }
            2 => match self.neighbour(i) {
                Some(j) => {
                    let other = self.m.entries[j].key.pos.clone();
                    let start = if self.rng.bool() {
                        other.start
                    } else {
                        other.end.saturating_sub(1)
                    };
                    self.m.entries[i].key.pos = start..start.saturating_add(rows);
                    format!("overlapping entry {j}'s {}..{}", other.start, other.end)
                }
                None => {
                    self.m.entries[i].key.pos = pos.start.wrapping_add(1)..pos.end.wrapping_add(1);
                    "moved by one".to_string()
                }
            },
            3 => {
                let end = if self.rng.bool() {
                    u32::MAX
                } else {
                    u32::MAX - 1
                };
                self.m.entries[i].key.pos = end.saturating_sub(rows)..end;
                "near u32::MAX".to_string()
            }
            4 => {
                self.m.entries[i].key.pos = u32::MAX..rows - 1;
                "start u32::MAX, end wrapped".to_string()
            }
            5 => {
                let start = MAX_POSITION
                    - [1, rows, rows.saturating_add(1)][self.rng.usize(..3)].min(MAX_POSITION);
                self.m.entries[i].key.pos = start..start.saturating_add(rows);
                "at the format's last positions".to_string()
            }
            6 => {
                self.m.entries[i].key.pos = pos.start..MAX_POSITION + self.rng.u32(0..3);
                "huge".to_string()
            }
            7 => {
                // Every tap moved: a tree of later positions, or of positions
                // near the end of the format's.
                let by = [1, 3, MAX_POSITION - 64, MAX_POSITION / 2][self.rng.usize(..4)];
                for e in &mut self.m.entries {
                    e.key.pos =
                        e.key.pos.start.saturating_add(by)..e.key.pos.end.saturating_add(by);
                }
                return format!("every entry's positions moved by {by}");
            }
            _ => {
                self.m.entries[i].key.pos = pos.start..pos.end.wrapping_add(1);
                "one more position".to_string()
            }
        };
        let p = &self.m.entries[i].key.pos;
        let (s, e) = (p.start, p.end);
        let done = self.maybe_consistent(i);
        format!("{name}: positions {what} ({s}..{e}){done}")
    }

    fn layer(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let layers = self.m.entries.iter().filter_map(|e| e.key.layer).max();
        let layer = &mut self.m.entries[i].key.layer;
        *layer = match self.rng.u8(..7) {
            0 => Some(MAX_LAYER),
            1 => Some(MAX_LAYER + 1),
            2 => Some(u32::MAX),
            3 => match layer {
                Some(_) => None,
                None => Some(0),
            },
            4 => Some(layers.map_or(0, |l| l.saturating_add(1))),
            5 => layer.map(|l| l.saturating_sub(1)).or(Some(1)),
            _ => Some(layers.map_or(0, |l| l.saturating_add(1000))),
        };
        let new = *layer;
        if self.rng.bool() {
            self.m.entries[i].path = manifest::path_of(&self.m.entries[i].key);
        }
        let done = if self.rng.bool() && self.rewrite(i) {
            ", tap file written"
        } else {
            ""
        };
        format!("{name}: layer {new:?}{done}")
    }

    fn slot(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let value = [
            None,
            Some(0),
            Some(1),
            Some(2),
            Some(u32::MAX),
            Some(65_536),
        ][self.rng.usize(..6)];
        if self.rng.u8(..4) == 0 {
            // Every tap of the tree in that slot.
            for e in &mut self.m.entries {
                e.key.slot = value;
            }
            return format!("every entry: slot {value:?}");
        }
        self.m.entries[i].key.slot = value;
        let done = if self.rng.bool() && self.rewrite(i) {
            ", tap file written"
        } else {
            ""
        };
        format!("{name}: slot {value:?}{done}")
    }

    fn rank(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let shard = self.m.entries[i].key.shard;
        let width = self.m.entries[i].shape.get(1).copied().unwrap_or(1) as u32;
        let odd = |rng: &mut fastrand::Rng| {
            let v = [
                0,
                1,
                2,
                7,
                64,
                u32::MAX,
                1 << 31,
                width,
                width.saturating_add(1),
            ];
            v[rng.usize(..v.len())]
        };
        let key = &mut self.m.entries[i].key;
        let what = match self.rng.u8(..8) {
            0 => {
                key.rank = None;
                "rank removed".to_string()
            }
            1 => {
                key.shard = None;
                "shard removed".to_string()
            }
            2 => {
                key.rank = Some([0, 1, 2, 3, u32::MAX, 1 << 20][self.rng.usize(..6)]);
                format!("rank {:?}", key.rank)
            }
            3 => {
                key.rank = Some(key.rank.unwrap_or(0));
                key.shard = Some(Shard {
                    axis: 1,
                    start: 0,
                    end: width,
                    full: width,
                });
                "a whole shard".to_string()
            }
            4..=6 => {
                let mut s = shard.unwrap_or(Shard {
                    axis: 1,
                    start: 0,
                    end: width,
                    full: width.saturating_mul(2),
                });
                match self.rng.u8(..4) {
                    0 => s.axis = [0, 2, 3, 255, u32::MAX][self.rng.usize(..5)],
                    1 => s.start = odd(self.rng),
                    2 => s.end = odd(self.rng),
                    _ => s.full = odd(self.rng),
                }
                key.rank = Some(key.rank.unwrap_or(0));
                key.shard = Some(s);
                format!("shard {s}")
            }
            _ => {
                // Every tap of the stage ranked alike.
                let stage = key.stage.clone();
                let rank = Some(self.rng.u32(0..3));
                for e in &mut self.m.entries {
                    if e.key.stage == stage {
                        e.key.rank = rank;
                    }
                }
                return format!("every {stage} entry: rank {rank:?}");
            }
        };
        let done = if self.rng.bool() && self.rewrite(i) {
            ", tap file written"
        } else {
            ""
        };
        format!("{name}: {what}{done}")
    }

    fn stage(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let vocabulary: Vec<String> = self.m.stages.iter().map(|s| s.name.clone()).collect();
        let new = match self.rng.u8(..5) {
            0 | 1 if !vocabulary.is_empty() => {
                vocabulary[self.rng.usize(..vocabulary.len())].clone()
            }
            2 => "not_in_the_vocabulary".to_string(),
            3 => ["", "a/b", "..", ".x", "x y"][self.rng.usize(..5)].to_string(),
            _ => {
                // Two stages swapped in every entry: a tree that lies about
                // which op is which.
                if vocabulary.len() >= 2 {
                    let a = vocabulary[self.rng.usize(..vocabulary.len())].clone();
                    let b = vocabulary[self.rng.usize(..vocabulary.len())].clone();
                    for e in &mut self.m.entries {
                        if e.key.stage == a {
                            e.key.stage = b.clone();
                        } else if e.key.stage == b {
                            e.key.stage = a.clone();
                        }
                    }
                    return format!("stages {a} and {b} swapped in every entry");
                }
                "x".to_string()
            }
        };
        self.m.entries[i].key.stage = new.clone();
        let done = if self.rng.bool() && self.rewrite(i) {
            ", tap file written"
        } else {
            ""
        };
        format!("{name}: stage {new:?}{done}")
    }

    fn shape(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let e = &mut self.m.entries[i];
        let rows = e.shape.first().copied().unwrap_or(1);
        let what = match self.rng.u8(..9) {
            0 => {
                e.shape[0] = rows.saturating_add(1);
                "axis 0 one more than its positions"
            }
            1 => {
                e.shape.push(0);
                "a zero dimension"
            }
            2 => {
                e.shape = vec![rows, 1 << 40];
                "a huge dimension"
            }
            3 => {
                e.shape.clear();
                "no dimension"
            }
            4 => {
                e.shape = vec![rows, usize::MAX / 2, 4];
                "an element count that overflows"
            }
            5 => {
                e.shape = vec![rows];
                "one dimension"
            }
            6 => {
                e.shape.splice(1..1, [1, 1, 1]);
                "more dimensions"
            }
            7 => {
                // The width halved or doubled: another tensor of the same rows.
                let w = e
                    .shape
                    .iter()
                    .skip(1)
                    .fold(1usize, |w, &d| w.saturating_mul(d));
                e.shape = vec![
                    rows,
                    if self.rng.bool() {
                        w / 2
                    } else {
                        w.saturating_mul(2)
                    },
                ];
                "width changed"
            }
            _ => {
                e.shape = vec![rows, 0];
                "zero width"
            }
        };
        let shape = format!("{:?}", e.shape);
        if self.rng.bool() {
            if let Some(n) = elements(&e.shape).and_then(|n| n.checked_mul(e.dtype.size())) {
                e.bytes = n as u64;
            }
        }
        let done = if self.rng.bool() && self.rewrite(i) {
            ", tap file written"
        } else {
            ""
        };
        format!("{name}: shape {what} {shape}{done}")
    }

    fn dtype(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let dtype = DTYPES[self.rng.usize(..DTYPES.len())];
        let e = &mut self.m.entries[i];
        e.dtype = dtype;
        if self.rng.bool() {
            if let Some(n) = elements(&e.shape).and_then(|n| n.checked_mul(dtype.size())) {
                e.bytes = n as u64;
            }
        }
        let done = if self.rng.bool() && self.rewrite(i) {
            ", tap file written"
        } else {
            ""
        };
        format!("{name}: dtype {dtype}{done}")
    }

    fn bytes(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let e = &mut self.m.entries[i];
        e.bytes = match self.rng.u8(..5) {
            0 => e.bytes.saturating_add(1),
            1 => e.bytes.saturating_sub(1),
            2 => 0,
            3 => e.bytes.saturating_mul(2),
            _ => u64::MAX,
        };
        format!("{name}: bytes {}", e.bytes)
    }

    fn path(&mut self) -> String {
        let (i, j) = (self.pick(), self.pick());
        let name = self.name(i);
        self.m.entries[i].path = self.m.entries[j].path.clone();
        if self.rng.bool() {
            // And its hashes, so that only the header's key disagrees.
            self.m.entries[i].blake3 = self.m.entries[j].blake3.clone();
            self.m.entries[i].header_blake3 = self.m.entries[j].header_blake3.clone();
        }
        format!("{name}: path of entry {j}")
    }

    fn duplicate(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let mut copy = self.m.entries[i].clone();
        let what = match self.rng.u8(..3) {
            0 => "as it is",
            1 => {
                copy.key.pos = copy.key.pos.start..copy.key.pos.end.wrapping_add(1);
                "one position longer"
            }
            _ => {
                copy.key.slot = Some(copy.key.slot.map_or(0, |s| s.saturating_add(1)));
                "in another slot"
            }
        };
        let at = self.rng.usize(..=self.m.entries.len());
        self.m.entries.insert(at, copy);
        format!("{name}: duplicated {what} at {at}")
    }

    fn drop(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let key = self.m.entries[i].key.clone();
        let what = match self.rng.u8(..5) {
            0 | 1 => {
                self.m.entries.remove(i);
                return format!("{name}: dropped");
            }
            2 => {
                self.m.entries.retain(|e| e.key.stage != key.stage);
                "its stage"
            }
            3 => {
                self.m.entries.retain(|e| e.key.layer != key.layer);
                "its layer"
            }
            _ => {
                self.m.entries.clear();
                "every entry"
            }
        };
        format!("{name}: dropped with {what}")
    }

    fn reorder(&mut self) -> String {
        let n = self.m.entries.len();
        match self.rng.u8(..3) {
            0 => {
                let (i, j) = (self.pick(), self.pick());
                self.m.entries.swap(i, j);
                format!("entries {i} and {j} swapped")
            }
            1 => {
                self.m.entries.reverse();
                format!("{n} entries reversed")
            }
            _ => {
                self.rng.shuffle(&mut self.m.entries);
                format!("{n} entries shuffled")
            }
        }
    }

    fn run_edit(&mut self) -> String {
        let run = &mut self.m.run;
        match self.rng.u8(..10) {
            0 => {
                run.prompt_tokens.pop();
                "prompt one token shorter".to_string()
            }
            1 => {
                run.prompt_tokens.push(7);
                "prompt one token longer".to_string()
            }
            2 => {
                if let Some(t) = run.prompt_tokens.last_mut() {
                    *t = t.wrapping_add(1);
                }
                "prompt's last token changed".to_string()
            }
            3 => {
                run.prompt_tokens.clear();
                "prompt empty".to_string()
            }
            4 => {
                run.prompt_tokens = vec![u32::MAX; 1 + self.rng.usize(..40)];
                "prompt of u32::MAX tokens".to_string()
            }
            5 => {
                let slots = [
                    serde_json::json!([]),
                    serde_json::json!("not a list"),
                    serde_json::json!([run.prompt_tokens, [1, 2, 3]]),
                    serde_json::json!([[], [u32::MAX]]),
                    serde_json::json!([[0, 1], [0, 1], [0, 1], [0, 1]]),
                ];
                let v = slots[self.rng.usize(..slots.len())].clone();
                run.extra.insert("slots".into(), v.clone());
                format!("extra.slots {v}")
            }
            6 => {
                let generated = [
                    serde_json::json!([]),
                    serde_json::json!([[1, 2, 3, 4, 5, 6, 7, 8]]),
                    serde_json::json!([[u64::MAX]]),
                    serde_json::json!({"a": 1}),
                ];
                let v = generated[self.rng.usize(..generated.len())].clone();
                run.extra.insert("generated_tokens".into(), v.clone());
                format!("extra.generated_tokens {v}")
            }
            7 => {
                run.extra.remove("slots");
                run.extra.remove("generated_tokens");
                "extra.slots and generated_tokens removed".to_string()
            }
            8 => {
                run.precision = ["f64", "q8", "", "f32"][self.rng.usize(..4)].to_string();
                format!("precision {:?}", run.precision)
            }
            _ => {
                self.m.selection =
                    ["all", "stage=nope", "layer=0", ""][self.rng.usize(..4)].to_string();
                format!("selection {:?}", self.m.selection)
            }
        }
    }

    fn vocabulary(&mut self) -> String {
        let stages = &mut self.m.stages;
        if stages.is_empty() {
            stages.push(StageSpec::global("x", &[]));
            return "a stage added to an empty vocabulary".to_string();
        }
        let i = self.rng.usize(..stages.len());
        let name = stages[i].name.clone();
        let other = stages[self.rng.usize(..stages.len())].name.clone();
        match self.rng.u8(..12) {
            11 => {
                // Thousands of stages, each read by the one before it, the
                // last reading a per-layer stage `@last`: what costs a
                // vocabulary's size and what costs more.
                let n = [100, 2000, 6000][self.rng.usize(..3)];
                let chain = (0..n).map(|k| {
                    let input = match k + 1 == n {
                        true => format!("{other}@last"),
                        false => format!("chain{}", k + 1),
                    };
                    StageSpec::global(&format!("chain{k}"), &[input.as_str()])
                });
                let at = self.rng.usize(..=stages.len());
                stages.splice(at..at, chain);
                format!("a chain of {n} global stages in the vocabulary at {at}")
            }
            0 => {
                stages.remove(i);
                format!("stage {name} removed from the vocabulary")
            }
            1 => {
                stages[i].name = "renamed".to_string();
                format!("stage {name} renamed in the vocabulary")
            }
            2 => {
                let copy = stages[i].clone();
                stages.push(copy);
                format!("stage {name} twice in the vocabulary")
            }
            3 => {
                stages[i].inputs = vec!["nowhere".to_string()];
                format!("stage {name}'s input unknown")
            }
            4 => {
                stages[i].inputs = vec![name.clone()];
                format!("stage {name} its own input")
            }
            5 => {
                let input = [
                    format!("{other}@prev"),
                    format!("{other}@last"),
                    format!("{other}@"),
                ][self.rng.usize(..3)]
                .clone();
                stages[i].inputs = vec![input.clone()];
                stages[i].first_layer_inputs = vec![input.clone()];
                format!("stage {name}'s input {input}")
            }
            6 => {
                stages[i].scope = match stages[i].scope {
                    Scope::Global => Scope::Layer,
                    Scope::Layer => Scope::Global,
                };
                format!("stage {name}'s scope flipped")
            }
            7 => {
                stages.reverse();
                "vocabulary reversed".to_string()
            }
            8 => {
                stages.clear();
                "vocabulary empty".to_string()
            }
            9 => {
                let head_dim = [
                    serde_json::json!(0),
                    serde_json::json!(1),
                    serde_json::json!(2),
                    serde_json::json!(6),
                    serde_json::json!(u64::MAX - 1),
                    serde_json::json!(-2),
                ];
                let d = head_dim[self.rng.usize(..head_dim.len())].clone();
                stages[i]
                    .layout
                    .insert("rotary".into(), "half_split".into());
                stages[i].layout.insert("head_dim".into(), d.clone());
                format!("stage {name} declared half_split, head_dim {d}")
            }
            _ => {
                stages[i].layout.insert("rotary".into(), "sideways".into());
                format!("stage {name} declared an unknown layout")
            }
        }
    }

    fn version(&mut self) -> String {
        let v = ["1.0", "2.0", "2.2", "2.3", "2.9", "3.0"][self.rng.usize(..6)];
        self.m.format_version = v.to_string();
        format!("format_version {v}")
    }
}

/// A shape's element count, where it does not overflow.
pub(crate) fn elements(shape: &[usize]) -> Option<usize> {
    capture::tapfile::element_count(shape).ok()
}
