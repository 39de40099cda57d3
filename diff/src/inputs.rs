//! The input tokens of a run, position by position, when its manifest
//! records them: `run.prompt_tokens` (or `run.extra.slots[s]` for slot `s`)
//! followed by `run.extra.generated_tokens[s]` (greedy generation feeds each
//! generated token back as the next position's input).
//!
//! Two runs that generated different tokens do different computations from
//! the first position whose input differs; comparing those positions says
//! nothing about either engine, so the diff stops there (and says so).

use capture::RunInfo;
use serde::{Deserialize, Serialize};

/// Where two runs' inputs part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSplit {
    /// The first position whose input token differs.
    pub pos: u32,
    /// A's slot (B's, when slots are paired, may differ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    pub token_a: u32,
    pub token_b: u32,
}

fn u32s(v: &serde_json::Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect()
}

/// The input token of every position of `slot`, if the run recorded them.
pub fn tokens(run: &RunInfo, slot: Option<u32>) -> Option<Vec<u32>> {
    let index = slot.unwrap_or(0) as usize;
    let prompt = match slot {
        Some(_) => u32s(run.extra.get("slots")?.get(index)?)?,
        None if !run.prompt_tokens.is_empty() => run.prompt_tokens.clone(),
        None => u32s(run.extra.get("slots")?.get(0)?)?,
    };
    let mut out = prompt;
    if let Some(generated) = run.extra.get("generated_tokens").and_then(|g| g.get(index)) {
        out.extend(u32s(generated)?);
    }
    (!out.is_empty()).then_some(out)
}

/// The first position where the two runs' inputs differ, if both recorded
/// them and they differ within the shorter of the two.
pub fn split(
    a: &RunInfo,
    b: &RunInfo,
    slot_a: Option<u32>,
    slot_b: Option<u32>,
) -> Option<InputSplit> {
    let (ta, tb) = (tokens(a, slot_a)?, tokens(b, slot_b)?);
    let pos = ta.iter().zip(&tb).position(|(x, y)| x != y)?;
    Some(InputSplit {
        pos: pos as u32,
        slot: slot_a,
        token_a: ta[pos],
        token_b: tb[pos],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(prompt: &[u32], generated: &[u32]) -> RunInfo {
        let mut r = RunInfo {
            prompt_tokens: prompt.to_vec(),
            ..Default::default()
        };
        r.extra
            .insert("generated_tokens".into(), serde_json::json!([generated]));
        r
    }

    #[test]
    fn greedy_runs_part_at_the_first_different_generated_token() {
        let a = run(&[1, 2, 3], &[10, 11, 12]);
        let b = run(&[1, 2, 3], &[10, 14, 12]);
        assert_eq!(
            split(&a, &b, None, None),
            Some(InputSplit {
                pos: 4,
                slot: None,
                token_a: 11,
                token_b: 14
            })
        );
        assert_eq!(split(&a, &a, None, None), None);
        // A run that recorded nothing: no split claimed.
        assert_eq!(split(&a, &RunInfo::default(), None, None), None);
    }

    #[test]
    fn slots_read_their_own_prompts() {
        let mut r = RunInfo::default();
        r.extra
            .insert("slots".into(), serde_json::json!([[1, 2], [5, 6]]));
        r.extra
            .insert("generated_tokens".into(), serde_json::json!([[3], [7]]));
        assert_eq!(tokens(&r, Some(1)), Some(vec![5, 6, 7]));
        assert_eq!(tokens(&r, None), Some(vec![1, 2, 3]));
    }
}
