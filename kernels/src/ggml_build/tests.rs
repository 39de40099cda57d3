use super::*;

#[test]
fn the_build_is_read_from_llamas_system_info() {
    let avx512 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | \
                  AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ";
    assert_eq!(GgmlSimd::from_system_info(avx512), Ok(GgmlSimd::Avx512));
    let avx2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | ";
    assert_eq!(GgmlSimd::from_system_info(avx2), Ok(GgmlSimd::Avx2));
    // AVX512_VBMI alone is not AVX512; a feature at 0 is off.
    let off = "CPU : AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 0 | AVX512_VBMI = 1 | ";
    assert_eq!(GgmlSimd::from_system_info(off), Ok(GgmlSimd::Avx2));
    for other in [
        "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | ",
        "",
        "CPU : AVX2 = 1 | FMA = 1 | ",
    ] {
        let e = GgmlSimd::from_system_info(other).unwrap_err();
        assert!(e.contains("without AVX2, F16C and FMA"), "{e}");
    }
    for s in [GgmlSimd::Avx2, GgmlSimd::Avx512] {
        assert_eq!(GgmlSimd::parse(s.name()), Some(s));
    }
    assert_eq!(GgmlSimd::parse("sse"), None);
}

#[test]
fn avx512_fp16_is_read_from_the_captures_cpu_flags() {
    const AVX512: &str = "CPU : AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | ";
    const AVX2: &str = "CPU : AVX2 = 1 | F16C = 1 | FMA = 1 | ";
    let build = |info, flags: &[&'static str]| {
        EngineBuild::from_account(info, flags.iter().copied()).unwrap()
    };
    assert!(build(AVX512, &[]).flash_attn_unmodelled().is_none());
    assert!(build(AVX512, &["avx512bw", "avx512f"])
        .flash_attn_unmodelled()
        .is_none());
    let fp16 = build(AVX512, &["avx512_fp16", "avx512f"]);
    assert_eq!(fp16.simd, GgmlSimd::Avx512);
    assert!(fp16
        .flash_attn_unmodelled()
        .unwrap()
        .contains("AVX512-FP16"));
    // A build that did not compile for AVX-512 has no f16 vector ops.
    assert!(build(AVX2, &["avx512_fp16"])
        .flash_attn_unmodelled()
        .is_none());
}
