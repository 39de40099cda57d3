//! The stage graph of a manifest: forward order of (layer, stage) rows and
//! each row's input rows, from the vocabulary's `inputs` (see
//! `capture::StageSpec`: `stage`, `stage@prev`, `stage@last`, and
//! `first_layer_inputs` at layer 0).

use capture::{Scope, StageSpec};
use std::collections::{BTreeSet, HashMap};

/// A node of the stage graph: a stage at a layer (none for globals); the
/// owned key the graph indexes by, where `capture::RowId` is the typed id.
pub type StageNode = (Option<u32>, String);

/// Where a row falls in the forward: globals before the layers, the layers,
/// globals after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    Before,
    Layers,
    After,
}

/// The vocabulary, the layers present, and the ordering rule.
#[derive(Debug, Clone)]
pub struct StageGraph {
    stages: Vec<StageSpec>,
    /// Each stage name's first place in `stages`.
    by_name: HashMap<String, usize>,
    after: Vec<bool>,
    /// Every layer a tap carries (the first and last of them are what
    /// `first_layer_inputs` and `@last` name).
    layers: BTreeSet<u32>,
}

impl StageGraph {
    /// `stages` is the manifest's vocabulary (A's, extended by stages only B
    /// knows); `layers` every layer number any tap carries.
    pub fn new(stages: &[StageSpec], layers: &BTreeSet<u32>) -> StageGraph {
        // Each name's first stage, as a search of the vocabulary finds it.
        let mut by_name: HashMap<String, usize> = HashMap::with_capacity(stages.len());
        for (i, s) in stages.iter().enumerate() {
            by_name.entry(s.name.clone()).or_insert(i);
        }
        let first_layer_stage = stages.iter().position(|s| s.scope == Scope::Layer);
        // A global stage comes after the layers if it follows a per-layer
        // stage in the vocabulary or reads (transitively) `@last`: those
        // that do directly, then their global readers, each stage once.
        let mut after = vec![false; stages.len()];
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); stages.len()];
        let mut todo = Vec::new();
        for (i, s) in stages.iter().enumerate() {
            if s.scope != Scope::Global {
                continue;
            }
            let follows = first_layer_stage.is_some_and(|f| i > f);
            let mut reads_last = false;
            for input in &s.inputs {
                let (name, suffix) = split_input(input);
                reads_last |= suffix == Some("last");
                if let Some(&j) = by_name.get(name) {
                    readers[j].push(i);
                }
            }
            if follows || reads_last {
                after[i] = true;
                todo.push(i);
            }
        }
        while let Some(j) = todo.pop() {
            for &i in &readers[j] {
                if !after[i] {
                    after[i] = true;
                    todo.push(i);
                }
            }
        }
        StageGraph {
            stages: stages.to_vec(),
            by_name,
            after,
            layers: layers.clone(),
        }
    }

    fn index(&self, stage: &str) -> Option<usize> {
        self.by_name.get(stage).copied()
    }

    /// Sort key of a row in forward order. Stages outside the vocabulary sort
    /// after the known ones of their section, by name.
    pub fn order(&self, layer: Option<u32>, stage: &str) -> (u8, u32, usize, String) {
        let idx = self.index(stage);
        let section = match (layer, idx) {
            (Some(_), _) => Section::Layers,
            (None, Some(i)) if self.after[i] => Section::After,
            (None, Some(_)) => Section::Before,
            (None, None) => Section::After,
        };
        (
            section as u8,
            layer.unwrap_or(0),
            idx.unwrap_or(usize::MAX),
            stage.to_string(),
        )
    }

    /// The rows a row reads, per the vocabulary. Unknown stages have none.
    pub fn inputs(&self, layer: Option<u32>, stage: &str) -> Vec<StageNode> {
        let Some(spec) = self.index(stage).map(|i| &self.stages[i]) else {
            return Vec::new();
        };
        let list = if spec.scope == Scope::Layer
            && layer == self.layers.first().copied()
            && !spec.first_layer_inputs.is_empty()
        {
            &spec.first_layer_inputs
        } else {
            &spec.inputs
        };
        list.iter()
            .filter_map(|inp| {
                let (name, suffix) = split_input(inp);
                let input_scope = self.index(name).map(|i| self.stages[i].scope);
                let l = match (suffix, input_scope) {
                    (Some("prev"), _) => Some(layer?.checked_sub(1)?),
                    (Some("last"), _) => Some(*self.layers.last()?),
                    (_, Some(Scope::Global)) => None,
                    (_, _) => layer,
                };
                Some((l, name.to_string()))
            })
            .collect()
    }
}

impl StageGraph {
    /// What the stages `from` of `layer`, a layer no tap carries, read
    /// through every such layer below it: the rows outside that run of
    /// layers (a global stage, one `@last`, or one of the first layer
    /// below the run that a tap carries). `None` where a tap carries
    /// `layer`.
    ///
    /// Every layer of the run reads alike (none is the first layer, whose
    /// inputs may differ), so the stages reached at each layer follow from
    /// those reached at the layer above, and once a set of stages recurs
    /// the rest of the run repeats it: a run of 65,000 layers costs what its
    /// first repeat does, not a walk through each of its layers.
    pub fn through_untapped_layers(
        &self,
        layer: u32,
        from: BTreeSet<String>,
    ) -> Option<Vec<StageNode>> {
        if self.layers.contains(&layer) {
            return None;
        }
        // The lowest layer of the run.
        let low = self.layers.range(..layer).next_back().map_or(0, |l| l + 1);
        let mut out: BTreeSet<StageNode> = BTreeSet::new();
        let (mut at, mut stages) = (layer, from);
        let mut seen: HashMap<BTreeSet<String>, u32> = HashMap::new();
        loop {
            // The stages of this layer read through, and those of the
            // layer below read `@prev`.
            let mut below = BTreeSet::new();
            let mut todo: Vec<String> = stages.iter().cloned().collect();
            let mut here: BTreeSet<String> = stages.clone();
            while let Some(stage) = todo.pop() {
                for (l, name) in self.inputs(Some(at), &stage) {
                    if l == Some(at) {
                        if here.insert(name.clone()) {
                            todo.push(name);
                        }
                    } else if l.is_some() && l == at.checked_sub(1) {
                        below.insert(name);
                    } else {
                        out.insert((l, name));
                    }
                }
            }
            let Some(next) = at.checked_sub(1) else {
                break;
            };
            if next < low || below.is_empty() {
                out.extend(below.into_iter().map(|s| (Some(next), s)));
                break;
            }
            // A set of stages met again `period` layers up: the layers
            // between repeat, so whole periods are skipped.
            match seen.get(&below) {
                Some(&up) => {
                    let period = up - next;
                    at = next - (next - low) / period * period;
                    seen.clear();
                }
                None => {
                    seen.insert(below.clone(), next);
                    at = next;
                }
            }
            stages = below;
        }
        Some(out.into_iter().collect())
    }
}

fn split_input(input: &str) -> (&str, Option<&str>) {
    match input.split_once('@') {
        Some((name, suffix)) => (name, Some(suffix)),
        None => (input, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Vec<StageSpec> {
        vec![
            StageSpec::global("embedding", &[]),
            StageSpec::layer("norm", &["out@prev"]).with_first_layer_inputs(&["embedding"]),
            StageSpec::layer("out", &["norm", "out@prev"]).with_first_layer_inputs(&["norm"]),
            StageSpec::global("final", &["out@last"]),
            StageSpec::global("logits", &["final"]),
        ]
    }

    #[test]
    fn globals_reading_last_sort_after_the_layers() {
        let g = StageGraph::new(&vocab(), &[0, 1, 2].into());
        let mut rows = [
            (None, "logits"),
            (Some(1), "norm"),
            (None, "embedding"),
            (Some(0), "out"),
            (None, "final"),
            (Some(0), "norm"),
        ];
        rows.sort_by_key(|(l, s)| g.order(*l, s));
        let names: Vec<_> = rows.iter().map(|(l, s)| format!("{l:?}{s}")).collect();
        assert_eq!(
            names,
            [
                "Noneembedding",
                "Some(0)norm",
                "Some(0)out",
                "Some(1)norm",
                "Nonefinal",
                "Nonelogits"
            ]
        );
    }

    /// What the stages `from` of `layer` read through layers no tap
    /// carries, by the definition: a walk through each of them.
    fn walked(g: &StageGraph, layer: u32, from: &[&str]) -> BTreeSet<StageNode> {
        let mut out = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut todo: Vec<StageNode> = from.iter().map(|s| (Some(layer), s.to_string())).collect();
        while let Some(id) = todo.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            match id.0 {
                Some(l) if !g.layers.contains(&l) => todo.extend(g.inputs(id.0, &id.1)),
                _ => {
                    out.insert(id);
                }
            }
        }
        out
    }

    /// A run of layers no tap carries, looked through as a whole, reaches
    /// what a walk through each of its layers reaches: for the llama-like
    /// vocabulary and for one whose stages reach each other a layer at a
    /// time in a cycle of three (a repeat with a period), across runs of
    /// every length up to 12, and of 65,533.
    #[test]
    fn layers_no_tap_carries_are_looked_through_as_a_walk_would() {
        let cycle = vec![
            StageSpec::global("embedding", &[]),
            StageSpec::layer("a", &["c@prev"]).with_first_layer_inputs(&["embedding"]),
            StageSpec::layer("b", &["a@prev"]),
            StageSpec::layer("c", &["b@prev"]),
            StageSpec::layer("d", &["d@prev", "final@last"]),
            StageSpec::global("final", &["c@last"]),
        ];
        for vocab in [vocab(), cycle] {
            let names: Vec<String> = vocab.iter().map(|s| s.name.clone()).collect();
            for top in (2..15).chain([65_535]) {
                let g = StageGraph::new(&vocab, &[0, top].into());
                for (k, stage) in names.iter().enumerate() {
                    for layer in [1, top / 2, top - 1].into_iter().filter(|&l| l > 0) {
                        let from = [stage.as_str(), names[(k + 2) % names.len()].as_str()];
                        let set: BTreeSet<String> = from.iter().map(|s| s.to_string()).collect();
                        let got: BTreeSet<StageNode> = g
                            .through_untapped_layers(layer, set)
                            .unwrap()
                            .into_iter()
                            .collect();
                        let want = walked(&g, layer, &from);
                        assert_eq!(got, want, "{top}: {from:?} at {layer}");
                    }
                }
                assert!(g.through_untapped_layers(top, BTreeSet::new()).is_none());
            }
        }
    }

    /// A vocabulary of thousands of global stages, each read by the one
    /// before it and the last reading `@last`, puts every one of them after
    /// the layers at the cost of its size (each pass over the vocabulary
    /// found one more, with a search of the vocabulary for every input:
    /// seconds for 3,000 stages, the cube of their number). No clock is
    /// read: at 30,000 stages that cube is days, and the test would not end.
    #[test]
    fn a_long_chain_of_globals_after_the_layers_costs_its_length() {
        let n = 30_000;
        let mut stages: Vec<StageSpec> = (0..n)
            .map(|i| {
                let input = match i + 1 == n {
                    true => "out@last".to_string(),
                    false => format!("g{}", i + 1),
                };
                StageSpec::global(&format!("g{i}"), &[input.as_str()])
            })
            .collect();
        stages.extend(vocab());
        let g = StageGraph::new(&stages, &[0, 1].into());
        for name in ["g0", "g15000", "g29999", "final"] {
            assert_eq!(g.order(None, name).0, Section::After as u8, "{name}");
        }
        assert_eq!(g.order(None, "embedding").0, Section::Before as u8);
        // Without the stage that reads `@last`, the chain stays before them.
        let before = StageGraph::new(&stages[..n - 1], &[0, 1].into());
        assert_eq!(before.order(None, "g0").0, Section::Before as u8);
    }

    #[test]
    fn inputs_resolve_prev_last_and_first_layer() {
        let g = StageGraph::new(&vocab(), &[0, 1, 2].into());
        assert_eq!(
            g.inputs(Some(0), "norm"),
            vec![(None, "embedding".to_string())]
        );
        assert_eq!(
            g.inputs(Some(2), "norm"),
            vec![(Some(1), "out".to_string())]
        );
        assert_eq!(
            g.inputs(Some(1), "out"),
            vec![(Some(1), "norm".to_string()), (Some(0), "out".to_string())]
        );
        assert_eq!(g.inputs(None, "final"), vec![(Some(2), "out".to_string())]);
        assert_eq!(g.inputs(None, "logits"), vec![(None, "final".to_string())]);
        assert!(g.inputs(None, "embedding").is_empty());
    }
}
