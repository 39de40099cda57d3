//! The stage graph of a manifest: forward order of (layer, stage) rows and
//! each row's input rows, from the vocabulary's `inputs` (see
//! `capture::StageSpec`: `stage`, `stage@prev`, `stage@last`, and
//! `first_layer_inputs` at layer 0).

use capture::{Scope, StageSpec};
use std::collections::BTreeSet;

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
    after: Vec<bool>,
    first_layer: Option<u32>,
    last_layer: Option<u32>,
}

impl StageGraph {
    /// `stages` is the manifest's vocabulary (A's, extended by stages only B
    /// knows); `layers` every layer number any tap carries.
    pub fn new(stages: &[StageSpec], layers: &BTreeSet<u32>) -> StageGraph {
        let first_layer_stage = stages.iter().position(|s| s.scope == Scope::Layer);
        let mut after = vec![false; stages.len()];
        // A global stage comes after the layers if it follows a per-layer
        // stage in the vocabulary or reads (transitively) `@last`.
        for _ in 0..stages.len().max(1) {
            let mut changed = false;
            for (i, s) in stages.iter().enumerate() {
                if s.scope != Scope::Global || after[i] {
                    continue;
                }
                let follows = first_layer_stage.is_some_and(|f| i > f);
                let reads_last = s.inputs.iter().any(|inp| {
                    let (name, suffix) = split_input(inp);
                    suffix == Some("last")
                        || stages
                            .iter()
                            .position(|t| t.name == name)
                            .is_some_and(|j| after[j])
                });
                if follows || reads_last {
                    after[i] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        StageGraph {
            stages: stages.to_vec(),
            after,
            first_layer: layers.iter().next().copied(),
            last_layer: layers.iter().next_back().copied(),
        }
    }

    fn index(&self, stage: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.name == stage)
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
            && layer == self.first_layer
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
                    (Some("last"), _) => Some(self.last_layer?),
                    (_, Some(Scope::Global)) => None,
                    (_, _) => layer,
                };
                Some((l, name.to_string()))
            })
            .collect()
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
