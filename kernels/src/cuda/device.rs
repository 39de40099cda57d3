//! The device: one CUDA context and stream, and the kernel sources compiled
//! with NVRTC on first use.
//!
//! Each `.cu` file of this directory is one module, compiled with
//! `common.cuh` prepended (NVRTC has no include path here) for the device's
//! own architecture. The PTX is cached on disk under a name made of the
//! architecture and the blake3 of source and options, so a second process
//! skips NVRTC entirely, and a changed kernel can never load stale PTX.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use super::CudaError;

const COMMON: &str = include_str!("common.cuh");
const MATMUL_CORE: &str = include_str!("matmul_core.cuh");

/// A kernel source family: one `.cu` file, one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `embedding.cu`: the embedding row lookup.
    Embedding,
    /// `norm.cu`: RMSNorm.
    Norm,
    /// `matmul.cu`: matmuls over every supported weight type, and the int8
    /// quantization of their activations.
    Matmul,
    /// `rope.cu`: rotary embedding.
    Rope,
    /// `attention.cu`: attention and the KV cache writes.
    Attention,
    /// `ffn.cu`: the gated nonlinearities (SwiGLU, GeGLU).
    Ffn,
    /// `elementwise.cu`: residual adds and scaling.
    Elementwise,
    /// `fused.cu`: the fused matmuls of an unarmed single-sequence forward.
    Fused,
    /// `decode.cu`: every layer of a decode step in one persistent launch,
    /// compiled after `attention.cu` and `fused.cu`, whose code it runs.
    Decode,
}

impl Family {
    /// Every family, each compiled as one module.
    pub const ALL: [Family; 9] = [
        Family::Embedding,
        Family::Norm,
        Family::Matmul,
        Family::Rope,
        Family::Attention,
        Family::Ffn,
        Family::Elementwise,
        Family::Fused,
        Family::Decode,
    ];

    /// The family's source file name (under `kernels/src/cuda/`).
    pub fn file(self) -> &'static str {
        match self {
            Family::Embedding => "embedding.cu",
            Family::Norm => "norm.cu",
            Family::Matmul => "matmul.cu",
            Family::Rope => "rope.cu",
            Family::Attention => "attention.cu",
            Family::Ffn => "ffn.cu",
            Family::Elementwise => "elementwise.cu",
            Family::Fused => "fused.cu",
            Family::Decode => "decode.cu",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Family::Embedding => include_str!("embedding.cu"),
            Family::Norm => include_str!("norm.cu"),
            Family::Matmul => include_str!("matmul.cu"),
            Family::Rope => include_str!("rope.cu"),
            Family::Attention => include_str!("attention.cu"),
            Family::Ffn => include_str!("ffn.cu"),
            Family::Elementwise => include_str!("elementwise.cu"),
            Family::Fused => include_str!("fused.cu"),
            Family::Decode => include_str!("decode.cu"),
        }
    }

    /// What the file is compiled after, besides `common.cuh`: the matmul
    /// core (`matmul_core.cuh`) for the families whose outputs must be the
    /// matmul's bits, and for `decode.cu` the two families whose code it
    /// runs (each under its own file name, for the compiler's messages).
    fn prelude(self) -> String {
        match self {
            Family::Matmul | Family::Fused => MATMUL_CORE.to_string(),
            Family::Decode => [Family::Attention, Family::Fused]
                .iter()
                .fold(MATMUL_CORE.to_string(), |acc, f| {
                    format!("{acc}\n#line 1 \"{}\"\n{}", f.file(), f.source())
                }),
            _ => String::new(),
        }
    }
}

/// One GPU, its stream, and the kernels loaded so far.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    name: String,
    functions: Mutex<HashMap<(Family, &'static str), CudaFunction>>,
    modules: Mutex<HashMap<Family, Arc<CudaModule>>>,
    /// Whether the architecture has programmatic dependent launch (sm_90).
    has_early: bool,
    /// How the kernels written for it are launched (an [`EarlyLaunch`]).
    early: AtomicU8,
    /// Its streaming multiprocessors.
    sms: usize,
    /// The most shared memory a block may opt in to, in bytes.
    shared_optin: usize,
}

/// Whether the fused pass's kernels start before the kernel ahead of them
/// in the stream has finished (programmatic dependent launch, sm_90 and
/// later), and when a running kernel lets the next one start. Every mode
/// computes the same bits: a kernel launched early reads no activation
/// before the kernel ahead has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyLaunch {
    /// Each kernel starts after the one before has finished.
    Off,
    /// A kernel lets the next one start as soon as all its blocks run.
    AtStart,
    /// A kernel lets the next one start once the kernel before it has
    /// finished (its blocks past `pdl_wait`): the next kernel fetches its
    /// weights while this one computes, and no kernel starts two ahead.
    AfterWait,
    /// A kernel lets the next one start once its blocks have computed
    /// their outputs (before they write them).
    Late,
    /// The fused matmuls let the next kernel start as soon as all their
    /// blocks run, attention once it is past its wait, and a one-row fused
    /// matmul decodes its block's weights into shared memory before its
    /// wait (fused.cu, "the dequantized staging"): the decoding runs while
    /// the kernel before computes, and the products after the wait read
    /// plain floats.
    Staged,
}

impl EarlyLaunch {
    /// From `TAPTREE_CUDA_PDL`: `0`/`off`, `start`, `after-wait`, `late`,
    /// `staged`;
    /// unset is [`EarlyLaunch::DEFAULT`].
    fn from_env() -> EarlyLaunch {
        match std::env::var("TAPTREE_CUDA_PDL").as_deref() {
            Ok("0" | "off") => EarlyLaunch::Off,
            Ok("start") => EarlyLaunch::AtStart,
            Ok("after-wait") => EarlyLaunch::AfterWait,
            Ok("late") => EarlyLaunch::Late,
            Ok("staged") => EarlyLaunch::Staged,
            _ => EarlyLaunch::DEFAULT,
        }
    }

    /// The mode used unless `TAPTREE_CUDA_PDL` says otherwise.
    pub const DEFAULT: EarlyLaunch = EarlyLaunch::Staged;

    /// Every mode, the serialized one first.
    pub const ALL: [EarlyLaunch; 5] = [
        EarlyLaunch::Off,
        EarlyLaunch::AtStart,
        EarlyLaunch::AfterWait,
        EarlyLaunch::Late,
        EarlyLaunch::Staged,
    ];

    /// Whether a one-row fused matmul decodes its weights before its wait
    /// in this mode: where the kernel before lets it start while it still
    /// computes. Launched `Late` (the next kernel starts once the products
    /// are done) or serialized, the decoding would add to the step instead.
    pub fn stages_weights(self) -> bool {
        matches!(
            self,
            EarlyLaunch::AtStart | EarlyLaunch::AfterWait | EarlyLaunch::Staged
        )
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

/// Whether a CUDA driver library can be loaded on this host.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names;
    // nothing is called through it.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether the NVRTC library can be loaded on this host (no GPU needed).
pub fn nvrtc_available() -> bool {
    // SAFETY: as above, for the NVRTC library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// [`CudaError::NoNvrtc`] where the NVRTC library cannot be loaded.
fn require_nvrtc() -> Result<(), CudaError> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(CudaError::NoNvrtc {
            searched: candidates("nvrtc"),
        })
    }
}

impl Device {
    /// Opens GPU `ordinal`. Without a driver this is an error, never a panic.
    pub fn open(ordinal: usize) -> Result<Arc<Device>, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver {
                searched: candidates("cuda"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::driver("create context", e))?;
        // SAFETY: every launch and copy of this crate goes through the one
        // stream below, so the per-buffer events cudarc records to order
        // work across streams are pure overhead.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| CudaError::driver("query compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| CudaError::driver("query multiprocessor count", e))?;
        let shared_optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| CudaError::driver("query a block's shared memory", e))?;
        // A stream of our own, not the legacy default one: only a created
        // stream can be captured into a CUDA graph (the decode step's).
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaError::driver("create stream", e))?;
        let has_early = major >= 9;
        let early = if has_early {
            EarlyLaunch::from_env()
        } else {
            EarlyLaunch::Off
        };
        Ok(Arc::new(Device {
            ctx,
            stream,
            arch: format!("compute_{major}{minor}"),
            name,
            functions: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            has_early,
            early: AtomicU8::new(early as u8),
            sms: sms.max(1) as usize,
            shared_optin: shared_optin.max(0) as usize,
        }))
    }

    /// How the fused pass's kernels are launched ([`EarlyLaunch`]; `Off`
    /// before sm_90). Every mode gives the same bits.
    pub fn early_launch(&self) -> EarlyLaunch {
        match self.early.load(Ordering::Relaxed) {
            1 => EarlyLaunch::AtStart,
            2 => EarlyLaunch::AfterWait,
            3 => EarlyLaunch::Late,
            4 => EarlyLaunch::Staged,
            _ => EarlyLaunch::Off,
        }
    }

    /// Sets the launch mode (anything but `Off` only where the
    /// architecture has early launches). A CUDA graph captured before keeps
    /// the launches it recorded.
    pub fn set_early_launch(&self, mode: EarlyLaunch) {
        let mode = if self.has_early {
            mode
        } else {
            EarlyLaunch::Off
        };
        self.early.store(mode as u8, Ordering::Relaxed);
    }

    /// How many streaming multiprocessors it has.
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    /// The most shared memory (static and dynamic) a block may opt in to,
    /// in bytes.
    pub fn shared_optin(&self) -> usize {
        self.shared_optin
    }

    /// The stream every launch and copy of this device goes through.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context the stream belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// `NVIDIA H200 (compute_90)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    /// The kernel `name` of `family`, compiling and loading its module on
    /// first use.
    pub fn function(&self, family: Family, name: &'static str) -> Result<CudaFunction, CudaError> {
        let mut functions = self.functions.lock().expect("kernel table poisoned");
        if let Some(f) = functions.get(&(family, name)) {
            return Ok(f.clone());
        }
        let module = self.module(family)?;
        let f = module
            .load_function(name)
            .map_err(|e| CudaError::driver(&format!("{}: load kernel {name}", family.file()), e))?;
        functions.insert((family, name), f.clone());
        Ok(f)
    }

    /// Compiles (or loads from the PTX cache) every module now, so the first
    /// forward does not pay for NVRTC inside a timed region.
    pub fn warm_up(&self) -> Result<(), CudaError> {
        for family in Family::ALL {
            self.module(family)?;
        }
        Ok(())
    }

    fn module(&self, family: Family) -> Result<Arc<CudaModule>, CudaError> {
        let mut modules = self.modules.lock().expect("module table poisoned");
        if let Some(m) = modules.get(&family) {
            return Ok(m.clone());
        }
        let ptx = self.ptx(family)?;
        let module = self
            .ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| CudaError::driver(&format!("{}: load module", family.file()), e))?;
        modules.insert(family, module.clone());
        Ok(module)
    }

    fn ptx(&self, family: Family) -> Result<String, CudaError> {
        let source = family_source(family);
        let options = compile_options(&self.arch);
        let mut hasher = blake3::Hasher::new();
        hasher.update(source.as_bytes());
        for o in &options {
            hasher.update(o.as_bytes());
            hasher.update(b"\0");
        }
        let key = hasher.finalize().to_hex();
        let cached = ptx_cache_dir().map(|d| d.join(format!("{}-{}.ptx", self.arch, &key[..32])));
        if let Some(path) = &cached {
            if let Ok(ptx) = std::fs::read_to_string(path) {
                return Ok(ptx);
            }
        }
        require_nvrtc()?;
        let ptx = compile(&source, family.file(), options)?;
        if let Some(path) = &cached {
            // The cache only saves time: a read-only home must not fail a run.
            let _ = write_atomically(path, ptx.as_bytes());
        }
        Ok(ptx)
    }
}

/// The NVRTC options every kernel is compiled with for `arch`
/// (`compute_XY`). Precise division and square root, no flush-to-zero:
/// the CPU reference rounds every op to nearest, and so must we.
fn compile_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
    ]
}

/// A family's whole source, as NVRTC compiles it: `common.cuh`, the
/// family's prelude, then its file.
fn family_source(family: Family) -> String {
    format!(
        "{COMMON}\n{}\n#line 1 \"{}\"\n{}",
        family.prelude(),
        family.file(),
        family.source()
    )
}

/// NVRTC's PTX of `source`, compiled as file `file`.
fn compile(source: &str, file: &'static str, options: Vec<String>) -> Result<String, CudaError> {
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some(file.into()),
        ..Default::default()
    };
    Ok(cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map_err(|e| CudaError::Compile {
            file,
            log: e.to_string(),
        })?
        .to_src())
}

/// Compiles every kernel family for `arch` (`compute_XY`) with NVRTC,
/// exactly as a device of that architecture does when it first loads it
/// (the same source and options; no GPU and no PTX cache involved): the
/// size of each family's PTX. An error names the file and carries NVRTC's
/// log; without the NVRTC library, [`CudaError::NoNvrtc`].
pub fn compile_all(arch: &str) -> Result<Vec<(Family, usize)>, CudaError> {
    require_nvrtc()?;
    Family::ALL
        .iter()
        .map(|&f| {
            Ok((
                f,
                compile(&family_source(f), f.file(), compile_options(arch))?.len(),
            ))
        })
        .collect()
}

/// Compiles `source` as file `file` for `arch` with the kernels' options:
/// [`compile_all`]'s control (a source that must not compile).
pub fn compile_source(source: &str, file: &'static str, arch: &str) -> Result<String, CudaError> {
    require_nvrtc()?;
    compile(source, file, compile_options(arch))
}

/// The file names cudarc tries for `lib`, each once, for an error message.
fn candidates(lib: &str) -> String {
    let mut seen = Vec::new();
    for c in cudarc::get_lib_name_candidates(lib) {
        if !seen.contains(&c) {
            seen.push(c);
        }
    }
    seen.join(", ")
}

/// `$TAPTREE_PTX_CACHE`, else `$XDG_CACHE_HOME/taptree/ptx`, else
/// `~/.cache/taptree/ptx`; `TAPTREE_PTX_CACHE=off` disables the cache.
pub fn ptx_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TAPTREE_PTX_CACHE") {
        if dir == "off" {
            return None;
        }
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("taptree").join("ptx"))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), rand_suffix()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
