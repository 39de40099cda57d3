//! Metrics and tolerances: properties, known ULP steps, and the edge cases
//! (zero norm, empty, NaN, ±Inf, -0.0 vs 0.0).

use capture::DType;
use diff::metrics::compare;
use diff::tolerance::{Tolerance, DEFAULT};
use proptest::prelude::*;

fn f32s(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn cmp32(a: &[f32], b: &[f32]) -> diff::Metrics {
    compare(&f32s(a), DType::F32, &f32s(b), DType::F32).metrics()
}

fn next_up(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY {
        x
    } else if x == 0.0 {
        f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() + 1)
    } else {
        f32::from_bits(x.to_bits() - 1)
    }
}

proptest! {
    #[test]
    fn x_against_itself_is_exact(x in prop::collection::vec(-1e30f32..1e30, 0..300)) {
        let m = cmp32(&x, &x);
        prop_assert_eq!(m.max_ulp, Some(0));
        prop_assert_eq!(m.bitwise_equal, x.len() as u64);
        prop_assert_eq!(m.max_abs, 0.0);
        prop_assert_eq!(m.nmse, 0.0);
        prop_assert!((m.cos - 1.0).abs() < 1e-12, "cos {}", m.cos);
        prop_assert!(Tolerance::bitwise().passes(&m));
        prop_assert!(Tolerance::default().passes(&m));
    }

    #[test]
    fn cosine_ignores_scale_and_nmse_does_not(
        x in prop::collection::vec(0.1f32..10.0, 2..200),
        s in 1.02f32..2.0,
    ) {
        let y: Vec<f32> = x.iter().map(|v| v * s).collect();
        let m = cmp32(&x, &y);
        prop_assert!(m.cos > 0.999_999);
        let expect = ((s as f64) - 1.0).powi(2);
        prop_assert!((m.nmse - expect).abs() < 1e-4 * expect.max(1e-3), "nmse {} vs {}", m.nmse, expect);
        prop_assert!(!Tolerance::default().passes(&m), "a {}% scale passes the default", (s - 1.0) * 100.0);
    }

    #[test]
    fn k_steps_up_is_k_ulps(x in -1e6f32..1e6, k in 0u32..50) {
        let mut y = x;
        for _ in 0..k { y = next_up(y); }
        let m = cmp32(&[x, 1.0], &[y, 1.0]);
        // Stepping up from -0.0 to the first subnormal is one step from 0.0.
        prop_assert_eq!(m.max_ulp, Some(k as u64));
    }

    #[test]
    fn metrics_are_symmetric_where_they_should_be(
        pair in prop::collection::vec((-100f32..100.0, -100f32..100.0), 1..100)
    ) {
        let (a, b): (Vec<f32>, Vec<f32>) = pair.into_iter().unzip();
        let (ab, ba) = (cmp32(&a, &b), cmp32(&b, &a));
        prop_assert!((ab.cos - ba.cos).abs() < 1e-12);
        prop_assert_eq!(ab.max_abs, ba.max_abs);
        prop_assert_eq!(ab.max_rel, ba.max_rel);
        prop_assert_eq!(ab.max_ulp, ba.max_ulp);
        prop_assert!(ab.max_rel <= 2.0);
    }
}

#[test]
fn ulp_steps_across_zero_and_in_half_types() {
    let tiny = f32::from_bits(1);
    assert_eq!(cmp32(&[-tiny], &[tiny]).max_ulp, Some(2));
    assert_eq!(cmp32(&[1.0], &[next_up(1.0)]).max_ulp, Some(1));
    assert_eq!(
        cmp32(&[f32::MAX], &[f32::INFINITY]).max_ulp,
        Some(0),
        "inf is not finite: no ULP, a mismatch"
    );
    assert_eq!(cmp32(&[f32::MAX], &[f32::INFINITY]).nonfinite_mismatch, 1);

    let h = |x: &[half::f16]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let one = half::f16::ONE;
    let up3 = half::f16::from_bits(one.to_bits() + 3);
    let m = compare(&h(&[one]), DType::F16, &h(&[up3]), DType::F16).metrics();
    assert_eq!(m.max_ulp, Some(3));
    let b = |x: &[half::bf16]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let (p, n) = (half::bf16::from_f32(1.0), half::bf16::from_f32(-1.0));
    let m = compare(&b(&[p]), DType::BF16, &b(&[n]), DType::BF16).metrics();
    // 1.0 is 0x3f80: 0x3f80 steps above zero on each side.
    assert_eq!(m.max_ulp, Some(2 * 0x3f80));
    let d = |x: &[f64]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let m = compare(
        &d(&[1.0]),
        DType::F64,
        &d(&[f64::from_bits(1.0f64.to_bits() + 7)]),
        DType::F64,
    )
    .metrics();
    assert_eq!(m.max_ulp, Some(7));
    // Across dtypes ULP is undefined, and an ulp tolerance cannot pass.
    let m = compare(&d(&[1.0]), DType::F64, &f32s(&[1.0]), DType::F32).metrics();
    assert_eq!((m.max_ulp, m.cos, m.bitwise_equal), (None, 1.0, 0));
    assert!(!Tolerance::parse("ulp<=1000").unwrap().passes(&m));
}

#[test]
fn negative_zero_equals_zero_but_not_bitwise() {
    let m = cmp32(&[-0.0, 1.0], &[0.0, 1.0]);
    assert_eq!((m.max_ulp, m.max_abs, m.bitwise_equal), (Some(0), 0.0, 1));
    assert!(Tolerance::parse("ulp<=0").unwrap().passes(&m));
    assert!(!Tolerance::bitwise().passes(&m));
}

#[test]
fn zero_norm_and_empty() {
    let m = cmp32(&[0.0; 8], &[0.0; 8]);
    assert_eq!((m.cos, m.nmse, m.max_rel), (1.0, 0.0, 0.0));
    assert_eq!(m.degenerate_a, Some(diff::metrics::Degeneracy::AllZero));
    let m = cmp32(&[0.0; 8], &[1.0; 8]);
    assert_eq!(m.cos, 0.0);
    assert_eq!(m.nmse, f64::INFINITY);
    assert!(!Tolerance::default().passes(&m));
    let m = cmp32(&[1.0, 2.0], &[0.0, 0.0]);
    assert_eq!((m.cos, m.nmse), (0.0, 1.0));
    let m = cmp32(&[], &[]);
    assert_eq!((m.n, m.cos, m.nmse, m.max_ulp), (0, 1.0, 0.0, Some(0)));
    assert_eq!(m.degenerate_a, None);
}

#[test]
fn nonfinite_pairs() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let m = cmp32(&[nan, 1.0], &[nan, 1.0]);
    assert_eq!(
        (m.nonfinite_mismatch, m.nonfinite_a, m.nonfinite_b),
        (0, 1, 1)
    );
    assert!(
        Tolerance::default().passes(&m),
        "equal NaN placement is agreement on the rest"
    );
    let m = cmp32(&[nan, 1.0], &[0.5, 1.0]);
    assert_eq!(m.nonfinite_mismatch, 1);
    assert!(!Tolerance::parse("cos>=-1").unwrap().passes(&m));
    let m = cmp32(&[inf, 1.0], &[-inf, 1.0]);
    assert_eq!(m.nonfinite_mismatch, 1);
    let m = cmp32(&[inf, 1.0], &[inf, 1.0]);
    assert_eq!((m.nonfinite_mismatch, m.bitwise_equal), (0, 2));
    let m = cmp32(&[nan, nan], &[nan, nan]);
    assert_eq!(
        m.degenerate_a,
        Some(diff::metrics::Degeneracy::AllNonfinite)
    );
}

#[test]
fn known_values() {
    let m = cmp32(&[1.0, 0.0], &[0.0, 1.0]);
    assert_eq!((m.cos, m.max_abs, m.max_rel), (0.0, 1.0, 1.0));
    assert!((m.rmse - 1.0).abs() < 1e-15);
    let m = cmp32(&[3.0, 4.0], &[3.0, 4.5]);
    assert!((m.nmse - 0.25 / 25.0).abs() < 1e-15);
    assert!((m.sqnr_db - 20.0).abs() < 1e-12);
    assert!((m.max_rel - 0.5 / 4.5).abs() < 1e-7);
    // argmax per row: index 1 on both sides, then not.
    assert_eq!(cmp32(&[1.0, 5.0, 2.0], &[1.0, 4.0, 2.0]).argmax_agree, 1);
    assert_eq!(cmp32(&[1.0, 5.0, 2.0], &[1.0, 4.0, 6.0]).argmax_agree, 0);
    let m = cmp32(&[0.5; 4], &[0.5; 4]);
    assert_eq!(m.degenerate_a, Some(diff::metrics::Degeneracy::Constant));
}

#[test]
fn tolerance_precedence_and_errors() {
    let m = cmp32(&[1.0, 2.0], &[1.0, 2.1]);
    // & binds tighter than |: (abs<=1e-3 & cos>=0) | rel<=0.1
    assert!(Tolerance::parse("abs<=1e-3 & cos>=0 | rel<=0.1")
        .unwrap()
        .passes(&m));
    assert!(!Tolerance::parse("abs<=1e-3 & (cos>=0 | rel<=0.1)")
        .unwrap()
        .passes(&m));
    assert!(Tolerance::parse("abs<=1e-3|rel<=1e-1").unwrap().passes(&m));
    assert!(Tolerance::parse(DEFAULT).is_ok());
    let e = Tolerance::parse("cos>=0.999 & nsme<=1e-4").unwrap_err();
    assert_eq!(e.part, "nsme<=1e-4");
    assert!(e.to_string().contains("unknown metric \"nsme\""), "{e}");
    let e = Tolerance::parse("cos>=abc").unwrap_err();
    assert_eq!(e.part, "cos>=abc");
    let e = Tolerance::parse("cos=>0.9").unwrap_err();
    assert!(e.reason.starts_with("expected <="), "{e}");
    let e = Tolerance::parse("(cos>=0.9").unwrap_err();
    assert!(e.reason.contains("unclosed"), "{e}");
    assert!(Tolerance::parse("").is_err());
    assert!(Tolerance::parse("cos>=0.9 abs<=1").is_err());
    let t = Tolerance::parse("cos>=0.999 & nmse<=1e-4").unwrap();
    let failing = t.failing(&cmp32(&[1.0, 1.0], &[1.1, 1.1]));
    let worded: Vec<String> = failing.iter().map(diff::render::reason).collect();
    assert_eq!(worded, ["nmse=0.01000 not <=0.0001"]);
}

/// The plain definition, element by element, for the differential test.
fn reference(a: &[f32], b: &[f32]) -> diff::Metrics {
    let (mut sab, mut saa, mut sbb, mut sdd) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let (mut max_abs, mut max_rel, mut max_ulp) = (0.0f64, 0.0f64, 0u64);
    let (mut eq, mut nfm, mut finite) = (0u64, 0u64, 0u64);
    let (mut arg_a, mut arg_b) = (None::<usize>, None::<usize>);
    let ord = |v: f32| {
        let i = v.to_bits() as i32 as i64;
        if i < 0 {
            i32::MIN as i64 - i
        } else {
            i
        }
    };
    for i in 0..a.len() {
        let (x, y) = (a[i] as f64, b[i] as f64);
        eq += (a[i].to_bits() == b[i].to_bits()) as u64;
        if x.is_finite() && y.is_finite() {
            finite += 1;
            sab += x * y;
            saa += x * x;
            sbb += y * y;
            sdd += (x - y) * (x - y);
            max_abs = max_abs.max((x - y).abs());
            let m = x.abs().max(y.abs());
            if m > 0.0 {
                max_rel = max_rel.max((x - y).abs() / m);
            }
            max_ulp = max_ulp.max((ord(a[i]) - ord(b[i])).unsigned_abs());
            if arg_a.is_none_or(|j| x > a[j] as f64) {
                arg_a = Some(i);
            }
            if arg_b.is_none_or(|j| y > b[j] as f64) {
                arg_b = Some(i);
            }
        } else if !((x.is_nan() && y.is_nan()) || (x.is_infinite() && x == y)) {
            nfm += 1;
        }
    }
    let _ = finite;
    let cos = if saa == 0.0 && sbb == 0.0 {
        1.0
    } else if saa == 0.0 || sbb == 0.0 {
        0.0
    } else {
        sab / (saa.sqrt() * sbb.sqrt())
    };
    let mut m = cmp32(&[], &[]);
    m.n = a.len() as u64;
    m.cos = cos.clamp(-1.0, 1.0);
    m.max_abs = max_abs;
    m.max_rel = max_rel;
    m.nmse = if sdd == 0.0 { 0.0 } else { sdd / saa };
    m.max_ulp = Some(max_ulp);
    m.bitwise_equal = eq;
    m.nonfinite_mismatch = nfm;
    m.argmax_agree = (arg_a == arg_b) as u64;
    m
}

fn special() -> impl Strategy<Value = f32> {
    prop_oneof![
        20 => -4.0f32..4.0,
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(1e30f32),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// The blocked fast path (64 elements, 8 lanes) against the plain
    /// definition, at lengths around the block boundaries and with nonfinite
    /// values falling into any block.
    #[test]
    fn blocked_pass_matches_the_plain_definition(
        len in prop_oneof![Just(63usize), Just(64), Just(65), Just(127), Just(128), Just(129), Just(576), 0usize..300],
        seed_a in prop::collection::vec(-4.0f32..4.0, 600),
        noise in prop::collection::vec(prop_oneof![8 => Just(0.0f32), 2 => -1e-3f32..1e-3], 600),
        // A few special values (NaN, ±Inf, ±0, huge) planted on either side.
        planted in prop::collection::vec((0usize..600, special(), any::<bool>()), 0..4),
    ) {
        let mut a: Vec<f32> = seed_a[..len].to_vec();
        let mut b: Vec<f32> = a.iter().zip(&noise).map(|(x, n)| x + n).collect();
        for (at, v, side) in planted {
            if at < len {
                if side { a[at] = v } else { b[at] = v }
            }
        }
        let got = cmp32(&a, &b);
        let want = reference(&a, &b);
        prop_assert_eq!(got.n, want.n);
        prop_assert!((got.cos - want.cos).abs() <= 1e-9, "cos {} vs {}", got.cos, want.cos);
        prop_assert_eq!(got.max_abs, want.max_abs);
        prop_assert!((got.max_rel - want.max_rel).abs() <= 1e-15 * want.max_rel.max(1.0));
        let tol = 1e-9 * want.nmse.abs().max(1e-300);
        prop_assert!((got.nmse - want.nmse).abs() <= tol || (got.nmse.is_infinite() && want.nmse.is_infinite()), "nmse {} vs {}", got.nmse, want.nmse);
        prop_assert_eq!(got.max_ulp, want.max_ulp);
        prop_assert_eq!(got.bitwise_equal, want.bitwise_equal);
        prop_assert_eq!(got.nonfinite_mismatch, want.nonfinite_mismatch);
        prop_assert_eq!(got.argmax_agree, want.argmax_agree);
    }
}
