//! The stage vocabulary: stage names in forward order, with each stage's inputs.
//!
//! The manifest carries the vocabulary of the engine that wrote it; the diff
//! uses it to order rows and to tell an op that *originated* a divergence
//! (its inputs agree) from one that inherited it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether a stage occurs once per layer or once per forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Once per forward, before or after the layers (`embedding`, `logits`).
    Global,
    /// Once in every layer (`attn_norm`, `ffn_down`, ...).
    Layer,
}

/// One stage of the vocabulary.
///
/// An input is written `stage` (the same layer for a per-layer stage, the one
/// instance for a global stage), `stage@prev` (the previous layer's instance),
/// or `stage@last` (the last layer's instance, for global stages after the
/// layers). At layer 0, a non-empty `first_layer_inputs` replaces `inputs`
/// entirely (layer 0 has no previous layer; it reads the global stages).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSpec {
    /// The stage name, as taps and keys spell it (`attn_norm`, `ffn_down`).
    pub name: String,
    /// Whether the stage happens once per layer or once per forward.
    pub scope: Scope,
    /// The stages this one's output is computed from (see above for the spelling).
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Inputs at layer 0, when they differ from `inputs`; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_layer_inputs: Vec<String>,
    /// How the stage's width is laid out where engines legitimately differ,
    /// e.g. `{"rotary": "half_split", "head_dim": 64}`; empty means the
    /// reference layout. The diff reconciles declared layouts before it
    /// compares (docs/FORMAT.md, "The stage contract").
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub layout: BTreeMap<String, serde_json::Value>,
}

impl StageSpec {
    /// A stage outside the layers (`embedding`, `logits`) computed from `inputs`.
    pub fn global(name: &str, inputs: &[&str]) -> StageSpec {
        StageSpec {
            name: name.to_string(),
            scope: Scope::Global,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            first_layer_inputs: Vec::new(),
            layout: BTreeMap::new(),
        }
    }

    /// A per-layer stage computed from `inputs`.
    pub fn layer(name: &str, inputs: &[&str]) -> StageSpec {
        StageSpec {
            name: name.to_string(),
            scope: Scope::Layer,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            first_layer_inputs: Vec::new(),
            layout: BTreeMap::new(),
        }
    }

    /// Sets the inputs of layer 0 (see [`StageSpec`]).
    pub fn with_first_layer_inputs(mut self, inputs: &[&str]) -> StageSpec {
        self.first_layer_inputs = inputs.iter().map(|s| s.to_string()).collect();
        self
    }
}
