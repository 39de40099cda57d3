//! The all-reduce of the row-parallel partial sums, two ways:
//!
//! - [`Reducer::Nccl`]: one GPU per rank, NCCL's `ncclAllReduce` (sum, in
//!   place) over every rank's buffer, issued as one NCCL group from the
//!   driving thread. NVLink multicast is kept off (`NCCL_NVLS_ENABLE=0`,
//!   set in the process before the communicators exist).
//! - [`Reducer::OneDevice`]: every rank on one GPU, no NCCL: a device-side
//!   sum in the declared order `((p0 + p1) + p2) + ...`, element by element
//!   in f32 (the CPU tensor-parallel forward's [`crate::cpu::tp::forward::all_reduce`]
//!   order), written back to every rank's buffer as an all-reduce would.
//!
//! The planted fault (`TAPTREE_FAULT_TP_SKIP_ALLREDUCE`) leaves one rank's
//! partial sum out: the one-device sum skips it; under NCCL that rank
//! contributes zeros instead (`x + 0` is `x`, so the sum is the others').

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use cudarc::nccl::{Comm, ReduceOp};

use crate::cuda::device::Device;
use crate::cuda::ops;
use crate::cuda::CudaError;

/// How the ranks' partial sums are added.
pub enum Reducer {
    /// One GPU per rank, through NCCL: one communicator per rank.
    Nccl(Vec<Comm>),
    /// Every rank on one GPU: the sum in rank order, through two buffers.
    OneDevice {
        /// The running sum.
        acc: Option<CudaSlice<f32>>,
        /// The next running sum.
        tmp: Option<CudaSlice<f32>>,
    },
}

fn nccl_err(op: &str, e: cudarc::nccl::result::NcclError) -> CudaError {
    CudaError::Driver {
        op: op.to_string(),
        message: format!("{e:?}"),
    }
}

/// Whether an NCCL library can be loaded (cudarc looks for `libnccl.so`).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the NCCL library by its usual names.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

impl Reducer {
    /// One NCCL communicator per device, rank `r` on `devs[r]`'s stream.
    /// Sets `NCCL_NVLS_ENABLE=0` first: NVLink multicast stays off.
    pub fn nccl(devs: &[Arc<Device>]) -> Result<Reducer, CudaError> {
        if !nccl_present() {
            return Err(CudaError::Driver {
                op: "load NCCL".into(),
                message: format!(
                    "no NCCL library found: could not load any of {} (link libnccl.so.2 as libnccl.so into a directory on LD_LIBRARY_PATH; docs/TP.md)",
                    cudarc::get_lib_name_candidates("nccl").join(", ")
                ),
            });
        }
        // Before any communicator: NCCL reads it at init. Multicast objects
        // can take a shared host's GPUs out of service.
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
        let streams = devs.iter().map(|d| d.stream().clone()).collect();
        let comms = Comm::from_devices(streams).map_err(|e| nccl_err("ncclCommInitAll", e))?;
        Ok(Reducer::Nccl(comms))
    }

    /// The device-side sum for ranks sharing one GPU.
    pub fn one_device() -> Reducer {
        Reducer::OneDevice {
            acc: None,
            tmp: None,
        }
    }

    /// Replaces the first `n` floats of every rank's `bufs[r]` (on
    /// `devs[r]`) with their sum over the ranks, `skip`'s left out.
    pub fn all_reduce(
        &mut self,
        devs: &[Arc<Device>],
        bufs: &mut [&mut CudaSlice<f32>],
        n: usize,
        skip: Option<usize>,
    ) -> Result<(), CudaError> {
        match self {
            Reducer::Nccl(comms) => {
                if let Some(r) = skip {
                    devs[r]
                        .stream()
                        .memset_zeros(&mut bufs[r].slice_mut(..n))
                        .map_err(|e| CudaError::driver("zero a skipped partial sum", e))?;
                }
                cudarc::nccl::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
                let mut issued = Ok(());
                for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
                    if let Err(e) =
                        comm.all_reduce_in_place(&mut buf.slice_mut(..n), &ReduceOp::Sum)
                    {
                        issued = Err(nccl_err("ncclAllReduce", e));
                        break;
                    }
                }
                // Always close the group, so a failed call leaves NCCL usable.
                let ended = cudarc::nccl::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
                issued.and(ended.map(|_| ()))
            }
            Reducer::OneDevice { acc, tmp } => {
                let dev = &devs[0];
                let s = dev.stream();
                for b in [&mut *acc, &mut *tmp] {
                    if b.as_ref().is_none_or(|b| b.len() < n) {
                        *b = Some(
                            s.alloc_zeros::<f32>(n)
                                .map_err(|e| CudaError::driver("alloc all-reduce sum", e))?,
                        );
                    }
                }
                let (a, t) = (
                    acc.as_mut().expect("allocated"),
                    tmp.as_mut().expect("allocated"),
                );
                let order: Vec<usize> = (0..bufs.len()).filter(|r| Some(*r) != skip).collect();
                let copy = |e| CudaError::driver("all-reduce copy", e);
                // The first add reads the first two ranks' buffers; a lone
                // rank is copied, none gives zeros.
                let rest = match order[..] {
                    [] => {
                        s.memset_zeros(&mut a.slice_mut(..n)).map_err(copy)?;
                        &order[..0]
                    }
                    [only] => {
                        s.memcpy_dtod(&bufs[only].slice(..n), &mut a.slice_mut(..n))
                            .map_err(copy)?;
                        &order[..0]
                    }
                    [p0, p1, ..] => {
                        let (x, y) = (bufs[p0].slice(..n), bufs[p1].slice(..n));
                        ops::add(dev, &x, &y, &mut a.slice_mut(..n), n)?;
                        &order[2..]
                    }
                };
                for &r in rest {
                    ops::add(
                        dev,
                        &a.slice(..n),
                        &bufs[r].slice(..n),
                        &mut t.slice_mut(..n),
                        n,
                    )?;
                    std::mem::swap(a, t);
                }
                for b in bufs.iter_mut() {
                    s.memcpy_dtod(&a.slice(..n), &mut b.slice_mut(..n))
                        .map_err(copy)?;
                }
                Ok(())
            }
        }
    }
}
