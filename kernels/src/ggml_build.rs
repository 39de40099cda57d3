//! Which build of ggml's CPU backend ran: the x86 vector width it was
//! compiled for, read from llama.cpp's own account of itself or named by
//! `TAPTREE_LLAMACPP_SIMD`. The arithmetic that depends on it is
//! `cpu::llamacpp_simd`'s.

use std::fmt;

/// The x86 vector width ggml's CPU backend was compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlSimd {
    /// AVX2 with F16C and FMA: 8 lanes.
    Avx2,
    /// AVX-512 (F and DQ): 16 lanes.
    Avx512,
}

impl GgmlSimd {
    /// The width `-march=native` gives on this CPU.
    pub fn host() -> GgmlSimd {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
            {
                return GgmlSimd::Avx512;
            }
        }
        GgmlSimd::Avx2
    }

    /// `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            GgmlSimd::Avx2 => "avx2",
            GgmlSimd::Avx512 => "avx512",
        }
    }

    /// The inverse of [`GgmlSimd::name`].
    pub fn parse(s: &str) -> Option<GgmlSimd> {
        match s.trim() {
            "avx2" => Some(GgmlSimd::Avx2),
            "avx512" => Some(GgmlSimd::Avx512),
            _ => None,
        }
    }

    /// The width of the build whose `llama_print_system_info()` is `info`
    /// (`CPU : SSE3 = 1 | ... | AVX2 = 1 | F16C = 1 | FMA = 1 | ... |
    /// AVX512 = 1 | ...`). A build without AVX2, F16C and FMA (another
    /// architecture, or an older x86) runs kernels not modelled here: an
    /// error saying so.
    pub fn from_system_info(info: &str) -> Result<GgmlSimd, String> {
        let on = |feature: &str| {
            info.split('|').any(|item| {
                let item = item.rsplit(':').next().unwrap_or(item);
                let mut kv = item.split('=');
                kv.next().map(str::trim) == Some(feature) && kv.next().map(str::trim) == Some("1")
            })
        };
        if !(on("AVX2") && on("F16C") && on("FMA")) {
            return Err(format!(
                "llama.cpp's CPU backend was built without AVX2, F16C and FMA (system_info: \
                 {info:?}); --precision llamacpp models x86 builds with AVX2 or AVX-512 only"
            ));
        }
        Ok(if on("AVX512") {
            GgmlSimd::Avx512
        } else {
            GgmlSimd::Avx2
        })
    }
}

/// What a llama.cpp capture says of the build that ran: its vector width
/// (from `llama_print_system_info()`) and whether its host had
/// AVX512-FP16, which `system_info` does not report but `-march=native`
/// compiles in, turning ggml's f16 vector ops into f16 arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineBuild {
    /// The vector width.
    pub simd: GgmlSimd,
    /// Whether the build has AVX512-FP16.
    pub avx512_fp16: bool,
}

impl EngineBuild {
    /// The build a capture records as `system_info` and its host's AVX-512
    /// flags (`cpu_avx512_flags`: `avx512f`, `avx512_fp16`, ...); an error,
    /// as [`GgmlSimd::from_system_info`], for a build not modelled.
    pub fn from_account<'a>(
        system_info: &str,
        avx512_flags: impl IntoIterator<Item = &'a str>,
    ) -> Result<EngineBuild, String> {
        let simd = GgmlSimd::from_system_info(system_info)?;
        Ok(EngineBuild {
            simd,
            avx512_fp16: simd == GgmlSimd::Avx512
                && avx512_flags.into_iter().any(|f| f == "avx512_fp16"),
        })
    }

    /// Why this build's flash attention is not modelled, if it is not: with
    /// AVX512-FP16 its values accumulate in f16 arithmetic.
    pub fn flash_attn_unmodelled(&self) -> Option<&'static str> {
        self.avx512_fp16.then_some(
            "llama.cpp was built on a CPU with AVX512-FP16, where its flash attention \
             accumulates the values in f16 arithmetic (ggml_vec_mad_f16 on _Float16), \
             which --precision llamacpp does not model",
        )
    }
}

impl fmt::Display for GgmlSimd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
