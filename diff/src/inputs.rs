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
    /// A's token at `pos`.
    pub token_a: u32,
    /// B's token at `pos`.
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

/// Two runs fed different prompts: nothing about either engine can be
/// learned by comparing them position by position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptsDiffer {
    /// A's slot, `None` in a single-sequence run.
    pub slot: Option<u32>,
    /// The first position whose prompt token differs.
    pub pos: u32,
    /// A's prompt token at `pos`.
    pub token_a: u32,
    /// B's prompt token at `pos`.
    pub token_b: u32,
    /// Length of A's prompt, in tokens.
    pub len_a: usize,
    /// Length of B's prompt, in tokens.
    pub len_b: usize,
    /// A shift of B (`--align N`) under which the prompts agree, if a small one does.
    pub align_hint: Option<i64>,
}

fn prompt(run: &RunInfo, slot: Option<u32>) -> Option<Vec<u32>> {
    match slot {
        Some(i) => u32s(run.extra.get("slots")?.get(i as usize)?),
        None if !run.prompt_tokens.is_empty() => Some(run.prompt_tokens.clone()),
        None => u32s(run.extra.get("slots")?.get(0)?),
    }
    .filter(|p| !p.is_empty())
}

/// Whether the shorter prompt agrees with `b` shifted by `shift` (B's
/// position `p + shift` is A's position `p`).
fn agree(a: &[u32], b: &[u32], shift: i64) -> bool {
    let (a, b) = if shift >= 0 {
        (a, b.get(shift as usize..).unwrap_or(&[]))
    } else {
        (a.get((-shift) as usize..).unwrap_or(&[]), b)
    };
    let n = a.len().min(b.len());
    n > 0 && a[..n] == b[..n]
}

/// The first position where the two runs' *prompts* differ (greedy
/// generation choosing differently is not a prompt difference), if both
/// recorded their prompts.
pub fn prompts_differ(
    a: &RunInfo,
    b: &RunInfo,
    slot_a: Option<u32>,
    slot_b: Option<u32>,
) -> Option<PromptsDiffer> {
    let (pa, pb) = (prompt(a, slot_a)?, prompt(b, slot_b)?);
    let pos = pa.iter().zip(&pb).position(|(x, y)| x != y)?;
    let align_hint = (1..=4i64)
        .flat_map(|s| [s, -s])
        .find(|&s| agree(&pa, &pb, s));
    Some(PromptsDiffer {
        slot: slot_a,
        pos: pos as u32,
        token_a: pa[pos],
        token_b: pb[pos],
        len_a: pa.len(),
        len_b: pb.len(),
        align_hint,
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
    fn a_prompt_with_an_extra_bos_differs_and_hints_the_shift() {
        let a = run(&[7, 8, 9], &[10]);
        let b = run(&[1, 7, 8, 9], &[10]);
        let d = prompts_differ(&a, &b, None, None).unwrap();
        assert_eq!((d.pos, d.token_a, d.token_b), (0, 7, 1));
        assert_eq!(d.align_hint, Some(1));
        assert_eq!(
            prompts_differ(&b, &a, None, None).unwrap().align_hint,
            Some(-1)
        );
        // Different generations are not different prompts.
        assert_eq!(
            prompts_differ(&a, &run(&[7, 8, 9], &[11]), None, None),
            None
        );
        let c = run(&[5, 5, 5], &[]);
        assert_eq!(prompts_differ(&a, &c, None, None).unwrap().align_hint, None);
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
