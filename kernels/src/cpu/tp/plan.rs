//! How a model splits over `N` simulated tensor-parallel ranks.
//!
//! Query heads go to ranks in contiguous runs as even as the count allows:
//! rank `r` takes heads `r * n_head / N .. (r + 1) * n_head / N` (floor), so
//! SmolLM2's 9 heads over 2 ranks are 4 + 5, over 4 ranks 2 + 2 + 2 + 3. A
//! rank holds every KV head its query heads read; a KV head read by query
//! heads on several ranks is **replicated** on each of them (as vLLM does
//! when `N > n_kv`), computed from the same weights and input, so the
//! replicas are equal by construction. Each KV head is tapped once, by its
//! owner: the lowest rank holding it.
//!
//! FFN columns go to ranks in contiguous runs whose bounds are multiples of
//! the `ffn_down` weight's block (a row-parallel matmul reads whole blocks):
//! rank `r` takes blocks `r * B / N .. (r + 1) * B / N` of the `B` blocks.
//! The o_proj split follows the heads, so `head_dim` must be a multiple of
//! the o_proj block. A split that leaves a rank without a head or an FFN
//! column is refused.

use crate::forward::ForwardError;
use crate::switches::TpSkip;
use model::{LlamaConfig, ModelWeights};
use std::ops::Range;

/// One rank's share of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    /// Query heads (indices of the full model's heads).
    pub heads: Range<usize>,
    /// KV heads this rank holds (computes and caches).
    pub kv_held: Range<usize>,
    /// KV heads this rank taps: those held and held by no lower rank.
    pub kv_owned: Range<usize>,
    /// FFN columns (of `n_ff`).
    pub ffn: Range<usize>,
}

/// The split of a model over `ranks` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpPlan {
    /// One per rank, in rank order.
    pub ranks: Vec<RankPlan>,
    /// Query heads per KV head.
    pub group: usize,
}

impl TpPlan {
    /// Splits `cfg` over `n` ranks; `o_block` and `down_block` are the block
    /// sizes of the o_proj and ffn_down weights (1 for float weights).
    pub fn new(
        cfg: &LlamaConfig,
        n: usize,
        o_block: usize,
        down_block: usize,
    ) -> Result<TpPlan, ForwardError> {
        let refuse = |why: String| {
            Err(ForwardError::Unsupported(format!(
                "--tp {n}: {why} ({} query heads over {} KV heads, FFN {})",
                cfg.n_head, cfg.n_head_kv, cfg.n_ff
            )))
        };
        if n == 0 {
            return refuse("needs at least one rank".into());
        }
        if n > cfg.n_head {
            return refuse(format!("{n} ranks leave a rank without a query head"));
        }
        if !cfg.head_dim.is_multiple_of(o_block) {
            return refuse(format!(
                "a head of {} columns does not hold whole o_proj blocks of {o_block}",
                cfg.head_dim
            ));
        }
        if !cfg.n_ff.is_multiple_of(down_block) {
            return refuse(format!("FFN is not whole blocks of {down_block}"));
        }
        let blocks = cfg.n_ff / down_block;
        if n > blocks {
            return refuse(format!(
                "{n} ranks leave a rank without an FFN block of {down_block}"
            ));
        }
        let group = cfg.n_head / cfg.n_head_kv;
        let mut ranks: Vec<RankPlan> = Vec::with_capacity(n);
        for r in 0..n {
            let heads = r * cfg.n_head / n..(r + 1) * cfg.n_head / n;
            let kv_held = heads.start / group..(heads.end - 1) / group + 1;
            let first_unowned = ranks.last().map_or(0, |p| p.kv_held.end);
            let kv_owned = kv_held.start.max(first_unowned)..kv_held.end;
            let ffn = r * blocks / n * down_block..(r + 1) * blocks / n * down_block;
            ranks.push(RankPlan {
                heads,
                kv_held,
                kv_owned,
                ffn,
            });
        }
        Ok(TpPlan { ranks, group })
    }

    /// Splits `weights` over `n` ranks with the block sizes of its first
    /// layer's o_proj and ffn_down weights as the file holds them: the one
    /// plan of every backend's tensor-parallel forward (the CPU's prepared
    /// weights keep their file's block, the CUDA forward's are the file's).
    pub fn for_weights(weights: &ModelWeights, n: usize) -> Result<TpPlan, ForwardError> {
        let l0 = weights.layers.first().ok_or_else(|| {
            ForwardError::Unsupported(format!("--tp {n}: the model has no layers"))
        })?;
        TpPlan::new(
            &weights.config,
            n,
            l0.wo.ggml_type.block_size(),
            l0.w_down.ggml_type.block_size(),
        )
    }

    /// Refuses a planted fault (`TAPTREE_FAULT_TP_SKIP_ALLREDUCE`) naming a
    /// rank or a layer this split does not have.
    pub fn check_skip(&self, skip: Option<TpSkip>, n_layer: usize) -> Result<(), ForwardError> {
        let n = self.ranks.len();
        match skip {
            Some(s) if s.rank >= n || s.layer >= n_layer => {
                Err(ForwardError::Unsupported(format!(
                    "{}: rank {} of layer {} does not exist under --tp {n} with {n_layer} layers",
                    crate::switches::TP_SKIP_VAR,
                    s.rank,
                    s.layer,
                )))
            }
            _ => Ok(()),
        }
    }

    /// How the split reads, for the manifest and messages: `heads 0..4 kv 0..2 ffn 0..768 | ...`.
    pub fn describe(&self) -> String {
        self.ranks
            .iter()
            .map(|r| format!("heads {:?} kv {:?} ffn {:?}", r.heads, r.kv_held, r.ffn))
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n_head: usize, n_head_kv: usize, n_ff: usize) -> LlamaConfig {
        let mut c = fixtures_free_config();
        c.n_head = n_head;
        c.n_head_kv = n_head_kv;
        c.n_ff = n_ff;
        c
    }

    fn fixtures_free_config() -> LlamaConfig {
        LlamaConfig {
            arch: "llama".into(),
            n_layer: 1,
            n_embd: 576,
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
            n_ff: 1536,
            vocab_size: 8,
            context_length: 16,
            rope_base: 1e4,
            rms_eps: 1e-5,
            family: model::ModelFamily::llama(),
        }
    }

    #[test]
    fn smollm2_over_two_ranks_replicates_the_middle_kv_head() {
        let p = TpPlan::new(&cfg(9, 3, 1536), 2, 32, 32).unwrap();
        assert_eq!(p.ranks[0].heads, 0..4);
        assert_eq!(p.ranks[0].kv_held, 0..2);
        assert_eq!(p.ranks[1].heads, 4..9);
        assert_eq!(p.ranks[1].kv_held, 1..3);
        assert_eq!(p.ranks[1].kv_owned, 2..3);
        assert_eq!(p.ranks[0].ffn, 0..768);
        assert_eq!(p.ranks[1].ffn, 768..1536);
    }

    #[test]
    fn smollm2_over_four_ranks() {
        let p = TpPlan::new(&cfg(9, 3, 1536), 4, 32, 32).unwrap();
        let heads: Vec<_> = p.ranks.iter().map(|r| r.heads.clone()).collect();
        assert_eq!(heads, vec![0..2, 2..4, 4..6, 6..9]);
        let owned: Vec<_> = p.ranks.iter().map(|r| r.kv_owned.clone()).collect();
        assert_eq!(owned, vec![0..1, 1..2, 2..2, 2..3]);
        let ffn: Vec<_> = p.ranks.iter().map(|r| r.ffn.len()).collect();
        assert_eq!(ffn, vec![384; 4]);
    }

    #[test]
    fn one_kv_head_is_held_by_every_rank_and_owned_by_rank_0() {
        let p = TpPlan::new(&cfg(4, 1, 2048), 4, 1, 1).unwrap();
        assert!(p.ranks.iter().all(|r| r.kv_held == (0..1)));
        assert_eq!(p.ranks[0].kv_owned, 0..1);
        assert!(p.ranks[1..].iter().all(|r| r.kv_owned.is_empty()));
    }

    #[test]
    fn splits_that_cannot_be_made_are_refused() {
        let c = cfg(9, 3, 1536);
        for (n, o, d) in [(0, 32, 32), (10, 32, 32), (2, 128, 32), (2, 32, 1000)] {
            let e = TpPlan::new(&c, n, o, d).unwrap_err().to_string();
            assert!(e.contains(&format!("--tp {n}:")), "{e}");
        }
        assert!(TpPlan::new(&cfg(9, 3, 64), 3, 32, 32).is_err());
    }
}
