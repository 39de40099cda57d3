//! Launches through `cuLaunchKernelEx`, for the kernels that may start
//! before the kernel ahead of them in the stream has finished
//! (programmatic dependent launch, sm_90 and later: the fused pass's
//! matmuls and split attention). Such a kernel fetches its weights, then
//! waits in `pdl_wait` (common.cuh) for the kernel before to finish before
//! it reads an activation or writes anything, so every value is the one a
//! serialized launch computes: the launch overlaps only the start of one
//! kernel (its launch and its weights' loads) with the end of the other.

use std::ffi::c_void;

use cudarc::driver::sys::{
    self, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
};
use cudarc::driver::{CudaFunction, DevicePtr, DeviceRepr, LaunchConfig};

use crate::cuda::device::{Device, EarlyLaunch};
use crate::cuda::CudaError;

/// A staging of the early-launched kernels forced on or off (by its
/// environment variable, `1` or `0`, or its setter), else as the launch
/// mode says: how `cuda_perf` times both forms in one process. The same
/// bits either way; a CUDA graph keeps what it captured.
pub(crate) struct Forced {
    var: &'static str,
    cell: std::sync::OnceLock<std::sync::atomic::AtomicU8>,
}

impl Forced {
    pub(crate) const fn new(var: &'static str) -> Forced {
        Forced {
            var,
            cell: std::sync::OnceLock::new(),
        }
    }

    fn flag(&self) -> &std::sync::atomic::AtomicU8 {
        self.cell.get_or_init(|| {
            std::sync::atomic::AtomicU8::new(match std::env::var(self.var).as_deref() {
                Ok("1") => 1,
                Ok("0") => 2,
                _ => 0,
            })
        })
    }

    /// On or off where forced; `None`: as the launch mode says.
    pub(crate) fn get(&self) -> Option<bool> {
        match self.flag().load(std::sync::atomic::Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    /// Forces it on or off (`None`: as the launch mode says) for the
    /// launches that follow.
    pub(crate) fn set(&self, on: Option<bool>) {
        let v = match on {
            Some(true) => 1,
            Some(false) => 2,
            None => 0,
        };
        self.flag().store(v, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The most 8-byte words a kernel's arguments take here.
const ARG_WORDS: usize = 48;
/// The most arguments a kernel takes here.
const ARGS: usize = 32;

/// A kernel's arguments in order, each held by value (in 8-byte words, so
/// every argument is aligned as the driver reads it) until the launch has
/// copied them: inline, so an eager launch allocates nothing for them.
pub(crate) struct KernelArgs {
    words: [u64; ARG_WORDS],
    used: usize,
    /// Where each argument starts in `words`.
    starts: [usize; ARGS],
    count: usize,
}

impl Default for KernelArgs {
    fn default() -> Self {
        KernelArgs {
            words: [0; ARG_WORDS],
            used: 0,
            starts: [0; ARGS],
            count: 0,
        }
    }
}

impl KernelArgs {
    /// A plain value argument (an integer, a float, a `#[repr(C)]` struct).
    ///
    /// # Panics
    /// Past [`ARGS`] arguments or [`ARG_WORDS`] words: a kernel of this
    /// crate that needs more must raise them.
    pub(crate) fn val<T: DeviceRepr>(&mut self, v: &T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let n = size.div_ceil(8).max(1);
        assert!(
            self.count < ARGS && self.used + n <= ARG_WORDS,
            "kernel arguments past {ARGS} or {ARG_WORDS} words"
        );
        let w = &mut self.words[self.used..self.used + n];
        // SAFETY: `w` holds at least `size` bytes, and T is plain data
        // (DeviceRepr: passed to kernels by its bytes).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (v as *const T).cast::<u8>(),
                w.as_mut_ptr().cast::<u8>(),
                size,
            )
        };
        self.starts[self.count] = self.used;
        self.count += 1;
        self.used += n;
        self
    }

    /// A device buffer's address, for reading or writing. The guard cudarc
    /// returns is dropped at once and no event is recorded for a write:
    /// sound only because `Device::new` turns cudarc's event tracking off
    /// and every launch and copy of a device goes through its one stream,
    /// so stream order alone orders them. A second stream would need the
    /// guards kept until the launch, and `device_ptr_mut` for outputs.
    pub(crate) fn buf<T>(&mut self, dev: &Device, b: &impl DevicePtr<T>) -> &mut Self {
        let (p, _sync) = b.device_ptr(dev.stream());
        self.val(&p)
    }

    /// A null pointer, for an argument the launch's mode never reads.
    pub(crate) fn null(&mut self) -> &mut Self {
        self.val(&0u64)
    }
}

/// The last argument of a kernel written for early launch: where it lets
/// the next kernel start ([`EarlyLaunch`]): 0 at its start, 1 after
/// `pdl_wait`, 2 once it has computed its outputs.
pub(crate) fn trigger_at(dev: &Device) -> i32 {
    match dev.early_launch() {
        EarlyLaunch::Off | EarlyLaunch::AtStart => 0,
        EarlyLaunch::AfterWait => 1,
        EarlyLaunch::Late | EarlyLaunch::Staged => 2,
    }
}

/// [`trigger_at`] for a fused matmul: at its start under
/// [`EarlyLaunch::Staged`].
pub(crate) fn trigger_fused(dev: &Device) -> i32 {
    match dev.early_launch() {
        EarlyLaunch::Staged => 0,
        _ => trigger_at(dev),
    }
}

/// [`trigger_at`] for attention: after its wait under
/// [`EarlyLaunch::Staged`].
pub(crate) fn trigger_attention(dev: &Device) -> i32 {
    match dev.early_launch() {
        EarlyLaunch::Staged => 1,
        _ => trigger_at(dev),
    }
}

/// Launches `f` on the device's stream with `args`; `early` lets it start
/// while the kernel before it finishes, where the device's mode allows
/// ([`Device::early_launch`]). The kernel must then call `pdl_wait` as
/// described above (a kernel that calls it is also correct launched plain).
///
/// # Safety
/// As any launch: `args` match the kernel's parameters, and every buffer
/// holds what the kernel reads and writes at this configuration.
pub(crate) unsafe fn launch(
    dev: &Device,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut KernelArgs,
    early: bool,
    name: &str,
) -> Result<(), CudaError> {
    // SAFETY: an all-zero attribute is a valid plain C struct; its id and
    // value are set below.
    let mut attr: CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value = CUlaunchAttributeValue {
        programmaticStreamSerializationAllowed: 1,
    };
    let early = early && dev.early_launch() != EarlyLaunch::Off;
    let attrs = if early {
        std::slice::from_mut(&mut attr)
    } else {
        &mut []
    };
    // SAFETY: the caller's.
    unsafe { launch_with(dev, f, cfg, args, attrs, name) }
}

/// Launches `f` cooperatively: every block of the grid resident at once
/// (the driver refuses a grid that could not be), as a kernel whose blocks
/// wait for each other needs.
///
/// # Safety
/// As [`launch`].
pub(crate) unsafe fn launch_cooperative(
    dev: &Device,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut KernelArgs,
    name: &str,
) -> Result<(), CudaError> {
    // SAFETY: as in `launch`.
    let mut attr: CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value = CUlaunchAttributeValue { cooperative: 1 };
    // SAFETY: the caller's.
    unsafe { launch_with(dev, f, cfg, args, std::slice::from_mut(&mut attr), name) }
}

/// `cuLaunchKernelEx` of `f` with `attrs`.
///
/// # Safety
/// As [`launch`].
unsafe fn launch_with(
    dev: &Device,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut KernelArgs,
    attrs: &mut [CUlaunchAttribute],
    name: &str,
) -> Result<(), CudaError> {
    let err = |e| CudaError::driver(&format!("launch {name}"), e);
    dev.context().bind_to_thread().map_err(err)?;
    let base = args.words.as_mut_ptr();
    let mut ptrs = [std::ptr::null_mut::<c_void>(); ARGS];
    for (p, &at) in ptrs.iter_mut().zip(&args.starts[..args.count]) {
        // SAFETY: `at` is below `used` <= ARG_WORDS: inside `words`.
        *p = unsafe { base.add(at) }.cast::<c_void>();
    }
    let config = CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: dev.stream().cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: the configuration, the attributes and the argument words live
    // until the call returns (the driver copies the arguments at launch);
    // the caller vouches for the arguments and buffers.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(err)
}
