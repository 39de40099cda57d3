//! Greedy decoding of one sequence chained on the device: each step's graph
//! ends by picking its greedy token (`step_next`, the index of the largest
//! logit as [`crate::generate::argmax`] picks it) and writing it, with the
//! next position, where the next step's first launch reads them. The host
//! queues steps back to back without waiting between them, so a step costs
//! the GPU's time alone; it reads the steps' tokens from page-locked memory
//! a window behind, and stops queueing at a stop token.
//!
//! A chained step is the mapped step's graph (`graph.rs`) with its input in
//! device memory and the greedy pick after its logits: the same kernels on
//! the same values, so its logits, and their greedy token, are the bits a
//! step-by-step decode gives (`cuda_chain.rs::chained_greedy_equals_step_by_step`).
//! The logits stay on the device. `TAPTREE_CUDA_CHAIN=0` (or
//! [`CudaForward::set_chained`]) steps from the host instead.

use cudarc::driver::{CudaSlice, DevicePtr, PinnedHostSlice};

use super::{CudaForward, GraphKey, Group, StepIo};
use crate::cuda::CudaError;
use crate::forward::ForwardError;

/// Steps queued between two looks at their tokens: 1, or
/// `TAPTREE_CUDA_CHAIN_WINDOW` (1 to 64) to measure others. At most two
/// windows are queued at once, so a stop token costs at most the rest of
/// its window and one window more of steps that run past it: at 8 steps a
/// window, an 8-token chat's decode took 5 ms longer chained than stepped
/// from the host (an H100; H200: chat 2,800 against 4,300 positions/s),
/// and at 1 it is as fast as stepped, while 256 steps run at the same
/// 1,550 positions/s at 1, 2, 4 and 8 (docs/PERFORMANCE.md): one step
/// queued ahead of the one the host waits on keeps the GPU busy.
static WINDOW: crate::knobs::Count =
    crate::knobs::Count::new("TAPTREE_CUDA_CHAIN_WINDOW", 1..=64, 1);

/// A chained step's device input (token, position), the page-locked tokens
/// the steps write, one per position of the cache, and the chained step's
/// graph with what it was captured against (kept apart from the step's
/// graph, `graph.rs`, so neither evicts the other).
pub(super) struct ChainBuffers {
    input: CudaSlice<u32>,
    toks: PinnedHostSlice<u32>,
    graph: Option<(GraphKey, cudarc::driver::CudaGraph)>,
}

impl CudaForward {
    /// Runs greedy decoding of one sequence chained on the device (the
    /// default where the step runs fused as one graph;
    /// `TAPTREE_CUDA_CHAIN=0` starts with it off), or lets the caller step
    /// from the host. Either way the tokens are the same.
    pub fn set_chained(&mut self, on: bool) {
        self.chained = on;
    }

    /// How many decode steps ran chained so far.
    pub fn chained_steps(&self) -> u64 {
        self.chained_steps
    }

    /// Whether the lone sequence's greedy steps can run chained: chaining
    /// and graphs on, and the step fused with no embedding scale (its first
    /// launch, `step_start`, applies none).
    fn chainable(&self, group: &Group) -> bool {
        self.chained
            && self.graphs
            && self.fusable(std::slice::from_ref(group), 1)
            && !self.config.family.embed_scale
    }

    /// `steps` greedy decode steps of the lone sequence, chained (the module
    /// comment): the first takes `first` at `pos`. `Ok(None)` where they
    /// cannot run chained ([`Self::chainable`]); else the steps' tokens, in
    /// order, through the first one in `stop`, the cache holding every
    /// position a returned token was picked at.
    pub(super) fn greedy_chain(
        &mut self,
        first: u32,
        pos: usize,
        steps: usize,
        stop: &[u32],
    ) -> Result<Option<Vec<u32>>, ForwardError> {
        let group = Group {
            slot: None,
            row: 0,
            rows: 1,
            start_pos: pos,
        };
        if steps == 0 || !self.chainable(&group) {
            return Ok(None);
        }
        self.check_tokens(&[first])?;
        self.check_group(None, steps, pos)?;
        self.ensure_cache(None, pos + steps, pos)?;
        self.ensure_scratch(1)?;
        let (input, toks) = self.chain_buffers()?;
        self.chain_graph(&group, input, toks)?;
        let s = self.dev.stream().clone();
        let err = |what: &'static str| move |e| CudaError::driver(what, e);
        let chain = self.chain.as_mut().expect("allocated by chain_buffers");
        s.memcpy_htod(&[first, pos as u32], &mut chain.input)
            .map_err(err("copy the chained step's input"))?;
        let (_, graph) = chain.graph.as_ref().expect("captured by chain_graph");
        let mut queued = 0;
        let mut seen = 0;
        let mut marks: std::collections::VecDeque<(usize, cudarc::driver::CudaEvent)> =
            Default::default();
        let mut out = Vec::with_capacity(steps);
        while seen < steps {
            // Keep two windows queued; then look at the older one's tokens.
            while queued < steps && marks.len() < 2 {
                let n = WINDOW.get().min(steps - queued);
                for _ in 0..n {
                    graph.launch().map_err(err("launch chained step"))?;
                }
                queued += n;
                let mark = s.record_event(None).map_err(err("record a window"))?;
                marks.push_back((queued, mark));
            }
            let (upto, mark) = marks.pop_front().expect("a window queued above");
            mark.synchronize().map_err(err("wait for a window"))?;
            let picked = chain
                .toks
                .as_slice()
                .map_err(err("page-locked chained tokens"))?;
            let mut stopped = false;
            for &t in &picked[pos + seen..pos + upto] {
                out.push(t);
                if stop.contains(&t) {
                    stopped = true;
                    break;
                }
            }
            seen = upto;
            if stopped {
                break;
            }
        }
        // Steps queued past a stop token run to their end; they write cache
        // rows past the sequence's length, which the next step there
        // writes again.
        s.synchronize().map_err(err("synchronize"))?;
        self.chained_steps += queued as u64;
        self.replays += queued as u64;
        if let Some(cache) = self.caches.get_mut(&None) {
            cache.len = pos + out.len();
        }
        Ok(Some(out))
    }

    /// The chained step's buffers, allocated once, the tokens' grown to the
    /// lone sequence's cache capacity (a chained graph names them, so
    /// growing them bumps the generation): their device addresses.
    fn chain_buffers(&mut self) -> Result<(u64, u64), CudaError> {
        let capacity = self.caches.get(&None).map_or(0, |c| c.capacity);
        let grow = self.chain.as_ref().is_none_or(|c| c.toks.len() < capacity);
        if grow {
            let err = |e| CudaError::driver("alloc chained step buffers", e);
            let input = match self.chain.take() {
                Some(c) => c.input,
                None => self.dev.stream().alloc_zeros::<u32>(2).map_err(err)?,
            };
            // Its graph names the old tokens: dropped with them.
            // SAFETY: page-locked memory the host reads only after the
            // steps that write it are done (an event or the stream
            // synchronized).
            let toks = unsafe {
                self.dev
                    .context()
                    .alloc_pinned_with_flags::<u32>(capacity, 0)
            }
            .map_err(err)?;
            self.chain = Some(ChainBuffers {
                input,
                toks,
                graph: None,
            });
            self.generation += 1;
        }
        let chain = self.chain.as_mut().expect("allocated above");
        let s = self.dev.stream();
        let (input, _g) = chain.input.device_ptr(s);
        let toks = chain
            .toks
            .as_mut_ptr()
            .map_err(|e| CudaError::driver("page-locked chained tokens", e))?;
        Ok((input, super::graph::device_address(&self.dev, toks)?))
    }

    /// Captures the chained step's graph unless the one held was captured
    /// against the buffers as they are.
    fn chain_graph(&mut self, group: &Group, input: u64, toks: u64) -> Result<(), CudaError> {
        let key = GraphKey {
            slot: None,
            generation: self.generation,
        };
        let chain = self.chain.as_mut().expect("allocated by chain_buffers");
        if chain.graph.as_ref().is_some_and(|(k, _)| *k == key) {
            return Ok(());
        }
        chain.graph = None;
        let groups = std::slice::from_ref(group);
        let io = StepIo::Chained { input, toks };
        let graph = self.capture(|f| f.encode_fused(groups, 1, true, io))?;
        self.chain.as_mut().expect("allocated above").graph = Some((key, graph));
        Ok(())
    }
}
