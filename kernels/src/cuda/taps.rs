//! GPU taps: a device buffer copied to the host only when the capture wants
//! it, asynchronously, through a ring of page-locked buffers.
//!
//! A tap enqueues its device-to-host copy on the forward's stream (ordered
//! after the kernel that wrote the buffer and before any that overwrites
//! it) and returns at once; the copy completes while the next kernels run.
//! The host waits for a copy only when its ring slot comes round again (or
//! at the end of the run), and then hands the bytes to the capture, in the
//! order the taps were made. So the GPU is never drained per tap, and a
//! capture costs its copies and the writers' work, not a round trip each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaView, PinnedHostSlice};

use super::device::Device;
use super::CudaError;
use capture::TapId;

/// Buffers in the ring: how many taps may be in flight at once.
const RING: usize = 8;

static TAP_COPY_BYTES: AtomicU64 = AtomicU64::new(0);
static TAP_HOST_WAIT_NANOS: AtomicU64 = AtomicU64::new(0);

/// Bytes the GPU taps copied to the host so far in this process, and the
/// time the host spent waiting for those copies to land (not the copies'
/// own time: they overlap the kernels that follow them). The tap figures of
/// docs/PERFORMANCE.md.
pub fn tap_copy_stats() -> (u64, Duration) {
    (
        TAP_COPY_BYTES.load(Ordering::Relaxed),
        Duration::from_nanos(TAP_HOST_WAIT_NANOS.load(Ordering::Relaxed)),
    )
}

/// The identity of a copy in flight.
struct Pending {
    id: TapId<'static>,
    shape: [usize; 2],
}

struct Slot {
    buf: Option<PinnedHostSlice<f32>>,
    pending: Option<Pending>,
    /// Recorded on the stream after the slot's copy.
    copied: Option<CudaEvent>,
}

/// The ring of page-locked tap buffers of one forward. Each grows to the
/// largest tap it has carried.
pub struct TapRing {
    slots: Vec<Slot>,
    /// The slot the next tap takes: also the oldest one in flight.
    next: usize,
}

impl Default for TapRing {
    fn default() -> TapRing {
        TapRing {
            slots: (0..RING)
                .map(|_| Slot {
                    buf: None,
                    pending: None,
                    copied: None,
                })
                .collect(),
            next: 0,
        }
    }
}

impl TapRing {
    /// Enqueues the copy of `view` (`[rows, width]`) as the tap `id` for
    /// the capture, first handing over the oldest copy if its slot is
    /// needed.
    pub fn tap(
        &mut self,
        dev: &Device,
        id: TapId<'static>,
        view: &CudaView<f32>,
        width: usize,
    ) -> Result<(), CudaError> {
        let n = view.len();
        let i = self.next;
        self.next = (i + 1) % self.slots.len();
        deliver(&mut self.slots[i])?;
        let s = &mut self.slots[i];
        if s.buf.as_ref().is_none_or(|p| p.len() < n) {
            // SAFETY: page-locked memory of n.next_power_of_two() floats;
            // only the part a copy has written is ever read.
            let p = unsafe {
                dev.context()
                    .alloc_pinned_with_flags::<f32>(n.next_power_of_two(), 0)
            }
            .map_err(|e| CudaError::driver("alloc pinned tap buffer", e))?;
            s.buf = Some(p);
        }
        let buf = s.buf.as_mut().expect("allocated above");
        // An exact-length destination (cudarc copies as many elements as
        // the destination holds); a plain slice, so the copy is only
        // enqueued, and an event of our own marks its completion (cudarc
        // tracks none: the forward has one stream).
        let host = &mut buf
            .as_mut_slice()
            .map_err(|e| CudaError::driver("pinned tap buffer", e))?[..n];
        let stream = dev.stream();
        stream
            .memcpy_dtoh(view, host)
            .map_err(|e| CudaError::driver("copy tap to host", e))?;
        let record = |e| CudaError::driver("record tap copy", e);
        if s.copied.is_none() {
            s.copied = Some(dev.context().new_event(None).map_err(record)?);
        }
        let copied = s.copied.as_ref().expect("created above");
        copied.record(stream).map_err(record)?;
        TAP_COPY_BYTES.fetch_add((n * 4) as u64, Ordering::Relaxed);
        s.pending = Some(Pending {
            id,
            shape: [n / width.max(1), width],
        });
        Ok(())
    }

    /// Hands every copy still in flight to the capture, oldest first.
    pub fn drain(&mut self) -> Result<(), CudaError> {
        let n = self.slots.len();
        for k in 0..n {
            deliver(&mut self.slots[(self.next + k) % n])?;
        }
        Ok(())
    }
}

/// Waits for the slot's copy, if any, and passes it to the capture.
fn deliver(s: &mut Slot) -> Result<(), CudaError> {
    let Some(p) = s.pending.take() else {
        return Ok(());
    };
    let t0 = Instant::now();
    if let Some(ev) = &s.copied {
        ev.synchronize()
            .map_err(|e| CudaError::driver("wait for tap copy", e))?;
    }
    TAP_HOST_WAIT_NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    let buf = s.buf.as_ref().expect("a pending copy has a buffer");
    let host = buf
        .as_slice()
        .map_err(|e| CudaError::driver("pinned tap buffer", e))?;
    let n = p.shape[0] * p.shape[1];
    let id = p.id;
    capture::tap(
        id.stage,
        id.layer,
        id.start..id.end,
        id.slot,
        &p.shape,
        &host[..n],
    );
    Ok(())
}
