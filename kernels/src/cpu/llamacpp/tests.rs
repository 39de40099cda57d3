use super::*;

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
    let out = flash_attention(
        &[0.0f32; 3],
        3,
        0,
        &[1.0; 3],
        &[1.0, 2048.0, 1.0],
        heads,
        GgmlSimd::Avx2,
    );
    // acc: 1, then f16(2048 + 1) = 2048 (ties to even), then 2049 -> 2048.
    assert_eq!(out[2], 2048.0 / 3.0);
    let exact = attention(
        &[0.0f32; 3],
        3,
        0,
        &[1.0; 3],
        &[1.0, 2048.0, 1.0],
        heads,
        GgmlSimd::Avx2,
    );
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
    let out = attention(&q, 2, 0, &k, &v, heads, GgmlSimd::Avx2);
    assert_eq!(out[0], 3.0);
    // Row 1: two equal scores, p = 0.5 each, exact.
    assert_eq!(out[1], 3.0);
    let q3 = [0.0f32; 3];
    let out = attention(
        &q3,
        3,
        0,
        &[1.0; 3],
        &[1.0, 1.0, 1.0],
        heads,
        GgmlSimd::Avx2,
    );
    let third = f16::from_f32(1.0 / 3.0).to_f32() as f64;
    assert_eq!(out[2], (3.0 * third) as f32);
    assert_ne!(out[2], 1.0);
}

#[test]
fn the_avx2_quantizer_gives_the_portable_bits() {
    let mut s = 0x1234_5678u32;
    let mut next = || {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (s >> 8) as f32 / (1 << 24) as f32 - 0.5
    };
    for len in [1usize, 7, 8, 37, 64, 100] {
        let x: Vec<f32> = (0..len * 32).map(|_| next() * 5.0).collect();
        let mut r = QuantRow::default();
        quantize_row_32(&x, 32, &mut r);
        let g = quantize_row(&x, 32);
        assert_eq!((g.q, g.d, g.s_err), (r.q, r.d, r.s_err));
    }
}
