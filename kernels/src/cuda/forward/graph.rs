//! A single sequence's decode step as one CUDA graph, and the page-locked
//! buffers its inputs and logits go through.
//!
//! With the step's copies in the graph (the default; `set_graph_copies`),
//! the host writes the token and position into a page-locked buffer, and
//! the graph copies them to the device, runs the forward and copies the
//! logits back into a second page-locked buffer: a step is one graph
//! launch and one synchronization. Without, the two uploads and the
//! logits' copy are their own calls around the graph's launch. Either way
//! the graph holds the same kernels, so the logits are the same bits.

use cudarc::driver::{DevicePtr, PinnedHostSlice};

use super::{CudaForward, DecodeGraph, GraphKey, Group, StepIo};
use crate::cuda::CudaError;

/// Page-locked host memory of `n` values.
fn pinned<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    fwd: &CudaForward,
    n: usize,
) -> Result<PinnedHostSlice<T>, CudaError> {
    // SAFETY: page-locked memory of `n` values, each written (by the host
    // or by a copy the stream has finished) before it is read.
    unsafe { fwd.dev.context().alloc_pinned_with_flags::<T>(n, 0) }
        .map_err(|e| CudaError::driver("alloc page-locked step buffer", e))
}

impl CudaForward {
    /// Allocates, once, the page-locked buffers of a row of logits and of
    /// a step's token and position. A graph with the step's copies names
    /// them, so replacing one bumps the generation; a first allocation does
    /// not (such a graph is only recorded after this call, and one without
    /// the copies names neither).
    pub(super) fn ensure_host_buffers(&mut self) -> Result<(), CudaError> {
        let vocab = self.config.vocab_size;
        if self.logits_host.as_ref().is_none_or(|p| p.len() != vocab) {
            let old = self.logits_host.replace(pinned(self, vocab)?);
            self.generation += u64::from(old.is_some());
        }
        if self.step_host.is_none() {
            self.step_host = Some(pinned(self, 2)?);
        }
        Ok(())
    }

    /// Puts a step's token and position where its graph's copies read them,
    /// after the stream is idle: a step before that failed before its own
    /// synchronization may still be reading them.
    pub(super) fn set_step_inputs(&mut self, token: u32, pos: u32) -> Result<(), CudaError> {
        self.dev
            .stream()
            .synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))?;
        let host = self
            .step_host
            .as_mut()
            .expect("allocated by ensure_host_buffers");
        let host = host
            .as_mut_slice()
            .map_err(|e| CudaError::driver("page-locked step buffer", e))?;
        host[0] = token;
        host[1] = pos;
        Ok(())
    }

    /// The logits the last step's graph copied back, once the stream is done.
    pub(super) fn graph_logits(&mut self) -> Result<Vec<f32>, CudaError> {
        self.dev
            .stream()
            .synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))?;
        let host = self
            .logits_host
            .as_ref()
            .expect("allocated by ensure_host_buffers");
        Ok(host
            .as_slice()
            .map_err(|e| CudaError::driver("page-locked logits buffer", e))?
            .to_vec())
    }

    /// Row `row`'s logits, copied to the host through `logits_host`.
    pub(super) fn logits_of(&mut self, row: usize) -> Result<Vec<f32>, CudaError> {
        self.ensure_host_buffers()?;
        let vocab = self.config.vocab_size;
        let pin = |e| CudaError::driver("page-locked logits buffer", e);
        let host = self.logits_host.as_mut().expect("allocated above");
        let host = host.as_mut_slice().map_err(pin)?;
        let sc = self.scratch.as_ref().expect("allocated");
        let s = self.dev.stream();
        s.memcpy_dtoh(&sc.logits.slice(row * vocab..(row + 1) * vocab), host)
            .map_err(|e| CudaError::driver("copy logits to host", e))?;
        s.synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))?;
        Ok(host.to_vec())
    }

    /// The decode step of one sequence through the CUDA graph of its slot,
    /// captured on first use and again whenever a buffer it names was
    /// reallocated. The graph holds exactly the launches [`Self::encode`]
    /// makes, with the token and position read from device buffers, so a
    /// replay computes what the eager launches would, bit for bit. With
    /// `copies` it also holds the step's uploads from `step_host` and the
    /// logits' copy into `logits_host` ([`Self::ensure_host_buffers`] first).
    pub(super) fn replay_decode(
        &mut self,
        groups: &[Group],
        copies: bool,
    ) -> Result<(), CudaError> {
        let key = GraphKey {
            slot: groups[0].slot,
            generation: self.generation,
        };
        // `set_graph_copies` drops the graph, so one made with the other
        // setting is never replayed.
        if self.graph.as_ref().is_none_or(|g| g.key != key) {
            self.graph = None;
            // The page-locked buffers' device addresses, looked up before
            // the capture begins.
            let mapped = if copies && self.mappable(groups) {
                Some(self.mapped_io()?)
            } else {
                None
            };
            let graph = self.capture(|f| f.encode_step(groups, copies, mapped))?;
            self.graph = Some(DecodeGraph {
                key,
                graph,
                mapped: mapped.is_some(),
            });
        }
        let g = self.graph.as_ref().expect("captured above");
        g.graph
            .launch()
            .map_err(|e| CudaError::driver("launch decode graph", e))?;
        self.replays += 1;
        self.mapped_replays += u64::from(g.mapped);
        Ok(())
    }

    /// The launches `encode` makes, captured from the stream into a graph
    /// (relaxed mode). The capture is ended whatever `encode` returns, so a
    /// failed encode leaves the stream usable.
    pub(super) fn capture(
        &mut self,
        encode: impl FnOnce(&mut Self) -> Result<(), CudaError>,
    ) -> Result<cudarc::driver::CudaGraph, CudaError> {
        let s = self.dev.stream().clone();
        let mode = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        s.begin_capture(mode)
            .map_err(|e| CudaError::driver("begin graph capture", e))?;
        let encoded = encode(self);
        let graph = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        encoded?;
        graph
            .map_err(|e| CudaError::driver("end graph capture", e))?
            .ok_or_else(|| CudaError::Shape("graph capture recorded nothing".into()))
    }

    /// Replays the last decode step's graph `n` times back to back, then
    /// waits for the stream: the GPU's own time for a step, without the
    /// host's share between steps (`cuda_perf`). Each replay computes that
    /// step again from the same token and position (its cache rows
    /// rewritten with the same values). An error where no graph was made.
    #[doc(hidden)]
    pub fn replay_last_step(&mut self, n: usize) -> Result<(), CudaError> {
        let g = self
            .graph
            .as_ref()
            .ok_or_else(|| CudaError::Shape("replay_last_step: no decode graph yet".into()))?;
        for _ in 0..n {
            g.graph
                .launch()
                .map_err(|e| CudaError::driver("launch decode graph", e))?;
        }
        self.dev
            .stream()
            .synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))
    }

    /// Whether a step of `groups` whose graph holds its copies runs mapped
    /// instead: its first launch reads the token and position from
    /// `step_host`, its logits' launch writes into `logits_host`, and the
    /// graph holds no copies. Needs the fused pass, the logits streamed, and
    /// no embedding scale (the first launch does not apply one).
    fn mappable(&self, groups: &[Group]) -> bool {
        self.mapped_step
            && self.fusable(groups, 1)
            && !self.config.family.embed_scale
            && crate::cuda::ops::streams(self.w.output(), 1, self.logits)
    }

    /// The mapped step's inputs and outputs: the device addresses of the
    /// page-locked step and logits buffers ([`Self::ensure_host_buffers`]
    /// first).
    fn mapped_io(&mut self) -> Result<StepIo, CudaError> {
        let (step, logits) = self.host_pointers()?;
        Ok(StepIo::Mapped {
            input: device_address(&self.dev, step)?,
            logits: device_address(&self.dev, logits)?,
        })
    }

    /// The page-locked step buffer (token, position) and logits buffer
    /// ([`Self::ensure_host_buffers`] first), as the graph's copies or its
    /// mapped launches name them.
    fn host_pointers(&mut self) -> Result<(*mut u32, *mut f32), CudaError> {
        let err = |e| CudaError::driver("page-locked step buffers", e);
        let step = self
            .step_host
            .as_mut()
            .expect("allocated by ensure_host_buffers")
            .as_mut_ptr()
            .map_err(err)?;
        let logits = self
            .logits_host
            .as_mut()
            .expect("allocated by ensure_host_buffers")
            .as_mut_ptr()
            .map_err(err)?;
        Ok((step, logits))
    }

    /// What a step's graph records: `mapped` ([`Self::mappable`]), the fused
    /// forward alone; else with `copies`, the uploads, the forward, the
    /// logits' download; else the forward.
    fn encode_step(
        &mut self,
        groups: &[Group],
        copies: bool,
        mapped: Option<StepIo>,
    ) -> Result<(), CudaError> {
        if let Some(io) = mapped {
            return self.encode_fused(groups, 1, true, io);
        }
        if !copies {
            return self.encode(groups, 1, true);
        }
        let err = |e| CudaError::driver("record the step's copies", e);
        let (step, logits) = self.host_pointers()?;
        let vocab = self.config.vocab_size;
        let s = self.dev.stream().clone();
        let cs = s.cu_stream();
        {
            let sc = self.scratch.as_ref().expect("allocated before the step");
            let (tok, _g) = sc.tok.device_ptr(&s);
            let (pos, _g) = sc.pos.device_ptr(&s);
            // SAFETY: page-locked buffers of 2 u32 and `vocab` floats that
            // live as long as the graph (a reallocation bumps the
            // generation, and the graph is captured again); the device
            // buffers hold a row each (the scratch has at least one row).
            unsafe {
                let host = std::slice::from_raw_parts(step, 2);
                cudarc::driver::result::memcpy_htod_async(tok, &host[..1], cs).map_err(err)?;
                cudarc::driver::result::memcpy_htod_async(pos, &host[1..], cs).map_err(err)?;
            }
        }
        self.encode(groups, 1, true)?;
        let sc = self.scratch.as_ref().expect("allocated before the step");
        let (src, _g) = sc.logits.device_ptr(&s);
        // SAFETY: as above; the scratch's logits hold at least a row.
        unsafe {
            let host = std::slice::from_raw_parts_mut(logits, vocab);
            cudarc::driver::result::memcpy_dtoh_async(host, src, cs).map_err(err)
        }
    }
}

/// The device address of page-locked host memory at `host` (allocated by
/// the driver, so mapped into the device's address space).
pub(super) fn device_address<T>(
    dev: &crate::cuda::device::Device,
    host: *mut T,
) -> Result<u64, CudaError> {
    let err = |e| CudaError::driver("device address of page-locked memory", e);
    dev.context().bind_to_thread().map_err(err)?;
    let mut dptr = 0;
    // SAFETY: `host` points into a page-locked allocation of the driver's;
    // the call only looks its address up.
    unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.cast(), 0) }
        .result()
        .map_err(err)?;
    Ok(dptr)
}
