//! Greedy generation over any [`Forward`]: prefill-only, prefill + decode,
//! and batched slots decoded together.

use crate::forward::{Forward, ForwardError};

/// The index of the largest logit; the first on ties, NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut max = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            max = v;
            best = i;
        }
    }
    best as u32
}

/// Greedy continuation of one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// The generated ids, in order (the stop token included when reached).
    pub tokens: Vec<u32>,
    /// Whether generation ended at a stop token rather than at the budget.
    pub stopped: bool,
}

/// Prefills `prompt` (one batched forward, positions `0..len`), then decodes
/// greedily until `gen` tokens are produced or a `stop` token is. `gen == 0`
/// is prefill only. The last generated token is not fed back: nothing reads
/// its output. The decode steps run through [`Forward::greedy_steps`] where
/// the forward has that path (the same tokens), else one
/// [`Forward::forward`] each.
pub fn greedy(
    fwd: &mut dyn Forward,
    prompt: &[u32],
    gen: usize,
    stop: &[u32],
) -> Result<Generation, ForwardError> {
    let mut logits = fwd.forward(None, prompt, 0)?;
    let mut out = Generation {
        tokens: Vec::with_capacity(gen),
        stopped: false,
    };
    let mut pos = prompt.len();
    while out.tokens.len() < gen {
        let next = argmax(&logits);
        out.tokens.push(next);
        if stop.contains(&next) {
            out.stopped = true;
            break;
        }
        if out.tokens.len() == gen {
            break;
        }
        if let Some(rest) = fwd.greedy_steps(next, pos, gen - out.tokens.len(), stop) {
            let rest = rest?;
            out.stopped = rest.last().is_some_and(|t| stop.contains(t));
            out.tokens.extend(rest);
            break;
        }
        logits = fwd.forward(None, &[next], pos)?;
        pos += 1;
    }
    Ok(out)
}

/// Greedy continuation of several sequences as batched slots: each prompt is
/// prefilled into its slot (`forward(Some(i), ..)`), then every step decodes
/// all slots together with [`Forward::decode_batch`]. A slot that reached a
/// stop token keeps its answer; its later steps still run (the batch shape is
/// fixed) but are not appended.
pub fn greedy_batch(
    fwd: &mut dyn Forward,
    prompts: &[Vec<u32>],
    gen: usize,
    stop: &[u32],
) -> Result<Vec<Generation>, ForwardError> {
    let mut logits = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        logits.push(fwd.forward(Some(i as u32), p, 0)?);
    }
    let mut outs: Vec<Generation> = prompts
        .iter()
        .map(|_| Generation {
            tokens: Vec::with_capacity(gen),
            stopped: false,
        })
        .collect();
    let mut positions: Vec<usize> = prompts.iter().map(Vec::len).collect();
    for step in 0..gen {
        let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
        for (o, &t) in outs.iter_mut().zip(&next) {
            if !o.stopped {
                o.tokens.push(t);
                o.stopped = stop.contains(&t);
            }
        }
        if step + 1 == gen || outs.iter().all(|o| o.stopped) {
            break;
        }
        logits = fwd.decode_batch(&next, &positions)?;
        for p in positions.iter_mut() {
            *p += 1;
        }
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_first_on_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
        assert_eq!(argmax(&[-5.0]), 0);
    }
}
