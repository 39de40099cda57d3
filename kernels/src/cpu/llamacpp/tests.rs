use super::*;

#[test]
fn v_expf_is_expf_to_a_few_ulps_and_zero_far_below() {
    for i in -2000..=200 {
        let x = i as f32 * 0.0437;
        let (got, want) = (v_expf(x), x.exp());
        let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
        assert!(ulps <= 2, "x {x}: {got} vs {want}");
    }
    assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
    assert_eq!(v_expf(-200.0), 0.0);
    assert_eq!(v_expf(0.0), 1.0);
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
    assert_eq!(dot_f16(&a, &b, 2), 0.0);
    assert_eq!(dot_f16(&a, &b, 1), 1.0);
}

#[test]
fn quantize_rounds_ties_to_even_with_127_over_amax() {
    // amax 127: id = 1, so x = 2.5 is a tie: ggml's AVX2 path gives 2,
    // the reference roundf (and taptree's q8) 3.
    let mut x = vec![0.0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    x[3] = 0.5;
    let g = quantize_row(&x, 32);
    assert_eq!(&g.q[..4], &[127.0, 2.0, -4.0, 0.0]);
    let r = super::super::quant_row::quantize_row(&x, 32);
    assert_eq!(&r.q[..4], &[127.0, 3.0, -4.0, 1.0]);
    assert_eq!(g.d[0], 1.0);
}

#[test]
fn quantize_scales_by_127_over_amax_not_one_over_d() {
    // amax = 1.3: 1 / (1.3 / 127) and 127 / 1.3 differ in the last bit,
    // which moves 0.65 * id across the .5 boundary of 63.5 or not.
    let amax = 1.3f32;
    let (id_ggml, id_ref) = (127.0 / amax, 1.0 / (amax / 127.0));
    assert_ne!(id_ggml.to_bits(), id_ref.to_bits());
    // Find an input whose product lands on different sides of a tie.
    let mut found = false;
    for k in 0..20000 {
        let v = k as f32 * 1e-4;
        if (v * id_ggml).round_ties_even() != (v * id_ref).round_ties_even() {
            let mut x = vec![0.0f32; 32];
            x[0] = amax;
            x[1] = v;
            assert_eq!(quantize_row(&x, 32).q[1], (v * id_ggml).round_ties_even());
            found = true;
            break;
        }
    }
    assert!(found, "no input tells the two scalings apart");
}

#[test]
fn q8_1_sum_is_rounded_to_f16() {
    let x: Vec<f32> = (0..32).map(|i| (i as f32 - 11.3) * 0.37).collect();
    let g = quantize_row(&x, 32);
    let sum: f32 = g.q.iter().sum();
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = f16::from_f32(amax / 127.0 * sum).to_f32() as f64;
    assert_eq!(
        g.s_err[0] as f64,
        (s - g.d[0] as f64 * sum as f64) as f32 as f64
    );
}

#[test]
fn rope_walks_the_angle_in_f32() {
    // Position 40, head_dim 64, base 1e5: the last pair's angle walked
    // in f32 differs from the f64 one, so the rotation does too.
    let (hd, base, pos) = (64, 1e5f32, 40);
    let mut x = vec![1.0f32; hd];
    rope(&mut x, hd, pos, hd, base);
    let mut y = vec![1.0f64; hd];
    super::super::rope::rope(&mut y, hd, pos, hd, base);
    let worst = x
        .iter()
        .zip(&y)
        .map(|(a, b)| (*a as f64 - b).abs())
        .fold(0f64, f64::max);
    assert!(worst > 1e-6, "{worst}");
    assert!(worst < 1e-3, "{worst}");
    // Position 0 is still the identity.
    let mut z = vec![0.5f32; hd];
    rope(&mut z, hd, 0, hd, base);
    assert!(z.iter().all(|v| *v == 0.5));
}

#[test]
fn flash_attention_accumulates_in_f16() {
    // Three equal scores over values 1, 2048, 1: the f16 accumulator
    // holds 1 + 2048 = 2049, which f16 cannot (2048 or 2050): the sum of
    // weights is 3, so the exact answer 2050/3 is missed by f16's step.
    let heads = Heads {
        n_head: 1,
        n_head_kv: 1,
        head_dim: 1,
    };
    let out = flash_attention(&[0.0f32; 3], 3, 0, &[1.0; 3], &[1.0, 2048.0, 1.0], heads);
    // acc: 1, then f16(2048 + 1) = 2048 (ties to even), then 2049 -> 2048.
    assert_eq!(out[2], 2048.0 / 3.0);
    let exact = attention(&[0.0f32; 3], 3, 0, &[1.0; 3], &[1.0, 2048.0, 1.0], heads);
    assert_ne!(out[2], exact[2]);
    // One position: the value itself.
    assert_eq!(out[0], 1.0);
}

#[test]
fn attention_rounds_probabilities_to_f16() {
    // Two positions with scores 0 and ln 3 (probabilities 1/4, 3/4):
    // exact in f16. Scores whose probability is 1/3 are not: the output
    // is f16(1/3) * v, not v / 3.
    let heads = Heads {
        n_head: 1,
        n_head_kv: 1,
        head_dim: 1,
    };
    let q = [0.0f32, 0.0];
    let k = [1.0f32, 1.0];
    let v = [3.0f32, 3.0];
    let out = attention(&q, 2, 0, &k, &v, heads);
    assert_eq!(out[0], 3.0);
    // Row 1: two equal scores, p = 0.5 each, exact.
    assert_eq!(out[1], 3.0);
    let q3 = [0.0f32; 3];
    let out = attention(&q3, 3, 0, &[1.0; 3], &[1.0, 1.0, 1.0], heads);
    let third = f16::from_f32(1.0 / 3.0).to_f32() as f64;
    assert_eq!(out[2], (3.0 * third) as f32);
    assert_ne!(out[2], 1.0);
}

#[test]
fn the_fma_builds_give_the_portable_bits() {
    let mut s = 0x1234_5678u32;
    let mut next = || {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (s >> 8) as f32 / (1 << 24) as f32 - 0.5
    };
    for len in [1usize, 7, 8, 37, 64, 100] {
        let a: Vec<f32> = (0..len).map(|_| f16_round(next() * 8.0)).collect();
        let b: Vec<f32> = (0..len).map(|_| f16_round(next() * 8.0)).collect();
        for rows in [1, 2] {
            assert_eq!(
                dot_f16(&a, &b, rows).to_bits(),
                dot_f16_in(&a, &b, rows).to_bits(),
                "len {len} rows {rows}"
            );
        }
        let mut p: Vec<f32> = (0..len.div_ceil(8) * 8).map(|_| next() * 40.0).collect();
        let mut q = p.clone();
        assert_eq!(
            exp_sum(&mut p, 3.0).to_bits(),
            exp_sum_in(&mut q, 3.0).to_bits()
        );
        assert_eq!(
            p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            q.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let x: Vec<f32> = (0..len * 32).map(|_| next() * 5.0).collect();
        let (g, r) = (quantize_row(&x, 32), quantize_row_32(&x, 32));
        assert_eq!((g.q, g.d, g.s_err), (r.q, r.d, r.s_err));
    }
}
