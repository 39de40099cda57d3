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
    use crate::forward::Precision;
    use model::{LlamaConfig, ModelFamily};

    /// A forward whose logits are a fixed function of the last token and
    /// its position (over 13 tokens), which keeps one cache's length as a
    /// real forward does, and which may offer `greedy_steps` (stepping
    /// itself, as a device would).
    struct Toy {
        config: LlamaConfig,
        len: usize,
        own_steps: bool,
        calls: usize,
    }

    impl Toy {
        fn new(own_steps: bool) -> Toy {
            let config = LlamaConfig {
                arch: "llama".into(),
                n_layer: 1,
                n_embd: 4,
                n_head: 1,
                n_head_kv: 1,
                head_dim: 4,
                n_ff: 4,
                vocab_size: 13,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
                context_length: 64,
                family: ModelFamily::llama(),
            };
            Toy {
                config,
                len: 0,
                own_steps,
                calls: 0,
            }
        }
    }

    impl Forward for Toy {
        fn config(&self) -> &LlamaConfig {
            &self.config
        }
        fn backend(&self) -> &'static str {
            "toy"
        }
        fn precision(&self) -> Precision {
            Precision::F32
        }
        fn forward(
            &mut self,
            _slot: Option<u32>,
            tokens: &[u32],
            start: usize,
        ) -> Result<Vec<f32>, ForwardError> {
            assert_eq!(start, self.len, "a position skipped or repeated");
            self.len = start + tokens.len();
            let (t, p) = (*tokens.last().unwrap() as usize, self.len - 1);
            Ok((0..13)
                .map(|i| ((t * 7 + p * 5 + i * 3) % 11) as f32)
                .collect())
        }
        fn decode_batch(
            &mut self,
            _tokens: &[u32],
            _positions: &[usize],
        ) -> Result<Vec<Vec<f32>>, ForwardError> {
            unreachable!("one sequence")
        }
        fn reset(&mut self) {
            self.len = 0;
        }
        fn greedy_steps(
            &mut self,
            first: u32,
            pos: usize,
            steps: usize,
            stop: &[u32],
        ) -> Option<Result<Vec<u32>, ForwardError>> {
            if !self.own_steps {
                return None;
            }
            self.calls += 1;
            let mut out = Vec::new();
            let mut t = first;
            for i in 0..steps {
                t = match self.forward(None, &[t], pos + i) {
                    Ok(l) => argmax(&l),
                    Err(e) => return Some(Err(e)),
                };
                out.push(t);
                if stop.contains(&t) {
                    break;
                }
            }
            Some(Ok(out))
        }
    }

    /// `greedy` through a forward's own `greedy_steps` gives what stepping
    /// gives: the tokens, whether it stopped, and the cache's length, for
    /// budgets from prefill only to past every stop, and stop tokens met
    /// first, later or never.
    #[test]
    fn greedy_through_greedy_steps_is_greedy_step_by_step() {
        let prompt = [3u32, 1, 4];
        let mut stepping = Toy::new(false);
        let want = greedy(&mut stepping, &prompt, 12, &[]).unwrap();
        // The sequence is not constant, so a stop token can cut it early.
        assert!(want.tokens.windows(2).any(|w| w[0] != w[1]), "{want:?}");
        let mut stops: Vec<Vec<u32>> = vec![vec![], vec![99]];
        stops.extend(want.tokens.iter().map(|&t| vec![t]));
        for gen in [0, 1, 2, 5, 12] {
            for stop in &stops {
                let (mut a, mut b) = (Toy::new(false), Toy::new(true));
                let x = greedy(&mut a, &prompt, gen, stop).unwrap();
                let y = greedy(&mut b, &prompt, gen, stop).unwrap();
                assert_eq!(x, y, "gen {gen}, stop {stop:?}");
                assert_eq!(a.len, b.len, "gen {gen}, stop {stop:?}: cache length");
                // Called once past the prefill's token, when it is wanted.
                assert_eq!(b.calls, usize::from(x.tokens.len() >= 2), "gen {gen}");
            }
        }
    }

    #[test]
    fn argmax_first_on_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
        assert_eq!(argmax(&[-5.0]), 0);
    }
}
