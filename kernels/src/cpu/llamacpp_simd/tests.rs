use super::*;
use half::f16;

#[test]
fn v_expf_is_expf_to_a_few_ulps_and_zero_far_below() {
    for exp in [v_expf, v_expf_avx512] {
        for i in -2000..=200 {
            let x = i as f32 * 0.0437;
            let (got, want) = (exp(x), x.exp());
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "x {x}: {got} vs {want}");
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }
}

#[test]
fn the_two_builds_exponentials_differ_in_the_last_bit() {
    // AVX2 adds the 1 last (`j k + k`), AVX-512 inside the polynomial
    // (`c1 b + 1`, then `scalef`): for some inputs the bits differ, which
    // is why a recomputation must know the build.
    let differ = (-20000..0)
        .map(|i| i as f32 * 1.7e-3)
        .filter(|x| v_expf(*x) != v_expf_avx512(*x))
        .count();
    assert!(differ > 0, "no input tells the builds' expf apart");
    // Subnormal results (n < -126): AVX-512's scalef rounds once, as the
    // f64 product rounded to f32 does; both stay within 2 ulps of expf.
    for x in [-88.0f32, -95.5, -100.0, -103.0] {
        let (a, want) = (v_expf_avx512(x), x.exp());
        assert!(
            (a.to_bits() as i64 - want.to_bits() as i64).abs() <= 2,
            "{x}: {a} vs {want}"
        );
    }
}

#[test]
fn dot_f16_orders_lanes_as_the_kernel_of_its_row_count() {
    // Lanes 0, 1, 2 hold 1e8, -1e8, 1. tinyBLAS folds lane 2 onto lane
    // 0 first ((1e8 + 1) - 1e8 = 0 in f32); ggml_vec_dot_f16 pairs
    // lanes 0 and 1 first ((1e8 - 1e8) + 1 = 1). The exact sum is 1.
    let mut a = vec![0f32; 32];
    a[0] = 1.0e8;
    a[1] = -1.0e8;
    a[2] = 1.0;
    let b = vec![1f32; 32];
    assert_eq!(dot_f16(&a, &b, 2, GgmlSimd::Avx2), 0.0);
    assert_eq!(dot_f16(&a, &b, 1, GgmlSimd::Avx2), 1.0);
}

#[test]
fn dot_f16_orders_lanes_as_the_builds_vector_width() {
    // One row (ggml_vec_dot_f16): lanes 0, 1, 2 hold 1e8, -1e8, 1. AVX2's
    // reduce pairs lanes 0 and 1 first ((1e8 - 1e8) + 1 = 1); AVX-512's
    // `_mm512_reduce_add_ps` pairs lanes 0 and 2 ((1e8 + 1) - 1e8 = 0).
    let mut a = vec![0f32; 64];
    (a[0], a[1], a[2]) = (1.0e8, -1.0e8, 1.0);
    let b = vec![1f32; 64];
    assert_eq!(dot_f16(&a, &b, 1, GgmlSimd::Avx2), 1.0);
    assert_eq!(dot_f16(&a, &b, 1, GgmlSimd::Avx512), 0.0);
    // Two rows (tinyBLAS): elements 0, 8 and 16 hold 1e8, -1e8, 1. On 8
    // lanes all three accumulate in lane 0, in order (0, then 1); on 16,
    // elements 0 and 16 share lane 0 (1e8 + 1 = 1e8) and 8 cancels it
    // in the reduce (0).
    let mut a = vec![0f32; 64];
    (a[0], a[8], a[16]) = (1.0e8, -1.0e8, 1.0);
    assert_eq!(dot_f16(&a, &b, 2, GgmlSimd::Avx2), 1.0);
    assert_eq!(dot_f16(&a, &b, 2, GgmlSimd::Avx512), 0.0);
}

#[test]
fn the_fma_builds_give_the_portable_bits() {
    let mut s = 0x1234_5678u32;
    let mut next = || {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (s >> 8) as f32 / (1 << 24) as f32 - 0.5
    };
    for simd in [GgmlSimd::Avx2, GgmlSimd::Avx512] {
        for len in [1usize, 7, 8, 37, 64, 100] {
            let a: Vec<f32> = (0..len)
                .map(|_| f16::from_f32(next() * 8.0).to_f32())
                .collect();
            let b: Vec<f32> = (0..len)
                .map(|_| f16::from_f32(next() * 8.0).to_f32())
                .collect();
            for rows in [1, 2] {
                assert_eq!(
                    dot_f16(&a, &b, rows, simd).to_bits(),
                    dot_f16_of(&a, &b, rows, simd).to_bits(),
                    "{simd} len {len} rows {rows}"
                );
            }
            let w = lanes(simd);
            let mut p: Vec<f32> = (0..len.div_ceil(w) * w).map(|_| next() * 40.0).collect();
            let mut q = p.clone();
            assert_eq!(
                exp_sum(&mut p, 3.0, simd).to_bits(),
                exp_sum_of(&mut q, 3.0, simd).to_bits()
            );
            assert_eq!(
                p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                q.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
