//! Which forward runs and in what arithmetic, as flag values: `--backend`
//! (capture) and `--precision` (capture and replay), one set of words for
//! the built-in forward's [`Precision`]s and a foreign engine's compute
//! dtypes.

use kernels::Precision;

/// `--backend`: the backends of `kernels::backend`, as flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The CPU forward (the reference).
    Cpu,
    /// The CUDA forward (a build with the `cuda` feature).
    Cuda,
}

impl Backend {
    /// The name `kernels::backend::open_tp` and the manifest use: its
    /// word in [`kernels::backend::BACKENDS`], in whose order the variants
    /// are declared (a test holds them to it).
    pub fn name(self) -> &'static str {
        kernels::backend::BACKENDS[self as usize]
    }
}

/// `--precision`: the built-in forward's [`Precision`]s and the compute
/// dtypes of a foreign engine ([`crate::cli::engine::PRECISIONS`]), one set of words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// f32 activations (either forward).
    F32,
    /// int8 activations before quantized matmuls (built-in only).
    Q8,
    /// `q8` with llama.cpp's own CPU arithmetic (built-in, cpu only).
    Llamacpp,
    /// Every op in f64: the truth (either forward).
    F64,
    /// bfloat16 compute (a foreign engine only).
    Bf16,
    /// float16 compute (a foreign engine only).
    F16,
}

impl PrecisionArg {
    /// The word on the command line, and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionArg::F32 => "f32",
            PrecisionArg::Q8 => "q8",
            PrecisionArg::Llamacpp => "llamacpp",
            PrecisionArg::F64 => "f64",
            PrecisionArg::Bf16 => "bf16",
            PrecisionArg::F16 => "f16",
        }
    }

    /// The built-in forward's precision of that name, none for a dtype
    /// only a foreign engine computes in.
    pub fn builtin(self) -> Option<Precision> {
        match self {
            PrecisionArg::F32 => Some(Precision::F32),
            PrecisionArg::Q8 => Some(Precision::Q8),
            PrecisionArg::Llamacpp => Some(Precision::LlamaCpp),
            PrecisionArg::F64 => Some(Precision::F64),
            PrecisionArg::Bf16 | PrecisionArg::F16 => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::engine;
    use clap::ValueEnum;
    use kernels::backend;

    #[test]
    fn backend_words_are_the_backends_kernels_opens() {
        let word = |b: &Backend| b.to_possible_value().unwrap().get_name().to_string();
        let words: Vec<String> = Backend::value_variants().iter().map(word).collect();
        assert_eq!(words, backend::BACKENDS);
        for b in Backend::value_variants() {
            assert_eq!(word(b), b.name());
        }
    }

    #[test]
    fn precision_words_are_the_forwards_and_the_engines() {
        for &p in PrecisionArg::value_variants() {
            assert_eq!(
                p.to_possible_value().unwrap().get_name().to_string(),
                p.name()
            );
            let builtin = p.builtin().map(Precision::name);
            assert!(builtin.is_none_or(|n| n == p.name()), "{p:?}");
            assert!(
                builtin.is_some() || engine::PRECISIONS.contains(&p.name()),
                "{p:?} is a word neither forward takes"
            );
        }
        for p in [
            Precision::F32,
            Precision::Q8,
            Precision::F64,
            Precision::LlamaCpp,
        ] {
            assert!(PrecisionArg::from_str(p.name(), false).is_ok(), "{p:?}");
        }
        for p in engine::PRECISIONS {
            assert!(PrecisionArg::from_str(p, false).is_ok(), "{p}");
        }
        assert_eq!(PrecisionArg::Bf16.builtin(), None);
    }
}
