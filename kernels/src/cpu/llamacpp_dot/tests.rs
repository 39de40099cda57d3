use super::super::llamacpp::quantize_row;
use super::super::matmul::{apply_group, matmul_with_mins, Act, Linear};
use super::super::qmatrix::{QMatrix, Weight};
use super::*;

/// A deterministic stream of u32s.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }
    /// A finite f16's bits: normal or subnormal, either sign, up to ~2^e.
    fn f16_bits(&mut self, max_exp: u16) -> u16 {
        let exp = (self.next() as u16) % (max_exp + 1);
        let frac = (self.next() as u16) & 0x3ff;
        let sign = (self.next() as u16 & 1) << 15;
        sign | (exp << 10) | frac
    }
    fn f32(&mut self, scale: f32) -> f32 {
        (self.next() as f32 / u32::MAX as f32 - 0.5) * 2.0 * scale
    }
}

/// `rows` rows of `blocks` random blocks of `ty` (Q4_1 or Q8_0): scales
/// and minimums over f16's range (subnormals included), every quant value
/// (Q8_0's -128 too).
fn weight_bytes(ty: GgmlType, rows: usize, blocks: usize, rng: &mut Lcg) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * blocks {
        out.extend_from_slice(&rng.f16_bits(18).to_le_bytes());
        if ty == GgmlType::Q4_1 {
            out.extend_from_slice(&rng.f16_bits(18).to_le_bytes());
        }
        let n = if ty == GgmlType::Q4_1 { 16 } else { 32 };
        out.extend((0..n).map(|_| rng.next() as u8));
    }
    out
}

/// An activation row through llama.cpp's quantizer, with an outlier block.
fn act_row(blocks: usize, rng: &mut Lcg) -> ActBlocks {
    let mut x: Vec<f32> = (0..blocks * 32).map(|_| rng.f32(3.0)).collect();
    x[5] = 900.0;
    ActBlocks::of(&quantize_row(&x, 32))
}

/// Activation blocks made by hand: quants at ±127 and every value between,
/// scales and sums anywhere in f16's range.
fn act_extreme(blocks: usize, rng: &mut Lcg) -> ActBlocks {
    ActBlocks {
        qs: (0..blocks * 32)
            .map(|i| match i % 7 {
                0 => 127,
                1 => -127,
                _ => ((rng.next() % 255) as i32 - 127) as i8,
            })
            .collect(),
        d: (0..blocks)
            .map(|_| f16::from_bits(rng.f16_bits(18)).to_f32())
            .collect(),
        s: (0..blocks)
            .map(|_| f16::from_bits(rng.f16_bits(20)).to_f32())
            .collect(),
    }
}

fn f16_of(b: &[u8], i: usize) -> f64 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f64()
}

/// The dot in f64 (exact up to f64's rounding): what every order rounds.
fn exact(ty: GgmlType, w: &[u8], a: &ActBlocks) -> f64 {
    let mut y = 0f64;
    for (b, blk) in w.chunks_exact(ty.type_size()).enumerate() {
        let qa = &a.qs[b * 32..][..32];
        let qw: Vec<i32> = match ty {
            GgmlType::Q4_1 => {
                let q = &blk[4..20];
                (0..32)
                    .map(|i| (if i < 16 { q[i] & 15 } else { q[i - 16] >> 4 }) as i32)
                    .collect()
            }
            _ => blk[2..34].iter().map(|q| *q as i8 as i32).collect(),
        };
        let isum: i32 = qw.iter().zip(qa).map(|(w, a)| w * *a as i32).sum();
        y += f16_of(blk, 0) * a.d[b] as f64 * isum as f64;
        if ty == GgmlType::Q4_1 {
            y += f16_of(blk, 2) * a.s[b] as f64;
        }
    }
    y
}

#[test]
fn the_block_sum_s_is_recovered_exactly() {
    let mut rng = Lcg(3);
    for k in 0..400 {
        let scale = [1e-6, 0.01, 1.0, 300.0, 5e4][k % 5];
        let x: Vec<f32> = (0..64).map(|_| rng.f32(scale)).collect();
        let a = ActBlocks::of(&quantize_row(&x, 32));
        for (b, blk) in x.chunks_exact(32).enumerate() {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sum: i32 = a.qs[b * 32..][..32].iter().map(|&q| q as i32).sum();
            let s = f16::from_f32(amax / 127.0 * sum as f32).to_f32();
            assert_eq!(a.s[b].to_bits(), s.to_bits(), "row {k} block {b}");
            assert_eq!(a.d[b], f16::from_f32(amax / 127.0).to_f32());
        }
    }
}

#[test]
fn the_portable_dot_is_the_exact_dot_to_rounding() {
    let mut rng = Lcg(5);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for _ in 0..200 {
            let w = weight_bytes(ty, 1, 18, &mut rng);
            let a = act_row(18, &mut rng);
            let (got, want) = (dot(ty, &w, &a) as f64, exact(ty, &w, &a));
            let scale: f64 = w
                .chunks_exact(ty.type_size())
                .enumerate()
                .map(|(b, blk)| f16_of(blk, 0).abs() * a.d[b] as f64 * 32.0 * 15.0 * 127.0)
                .sum::<f64>()
                + 1e-30;
            assert!((got - want).abs() <= 1e-5 * scale, "{ty}: {got} vs {want}");
        }
    }
}

/// Every tile shape the matmul runs, on every input kind, against the
/// portable loop, bit for bit (where this CPU has the AVX2 tiles).
#[test]
fn the_avx2_tiles_give_the_portable_bits() {
    if !simd() {
        eprintln!("skipped: this CPU lacks AVX2, F16C or FMA (the portable loop alone runs)");
        return;
    }
    let mut rng = Lcg(7);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for round in 0..60 {
            let nb = [1, 2, 18, 48][round % 4];
            let w = weight_bytes(ty, 4, nb, &mut rng);
            let rows: Vec<&[u8]> = w.chunks_exact(ty.row_bytes(nb * 32)).collect();
            let acts: Vec<ActBlocks> = (0..4)
                .map(|i| {
                    if (round + i) % 3 == 0 {
                        act_extreme(nb, &mut rng)
                    } else {
                        act_row(nb, &mut rng)
                    }
                })
                .collect();
            let a4 = [&acts[0], &acts[1], &acts[2], &acts[3]];
            let want: Vec<Vec<u32>> = rows
                .iter()
                .map(|r| acts.iter().map(|a| dot(ty, r, a).to_bits()).collect())
                .collect();
            let bits = |v: f32| v.to_bits();
            // SAFETY: AVX2, F16C and FMA checked; whole blocks, nb per row.
            unsafe {
                use super::avx::tile as t;
                let y = t(ty, [rows[0], rows[1], rows[2], rows[3]], [&acts[1]]);
                for j in 0..4 {
                    assert_eq!(bits(y[j][0]), want[j][1], "{ty} 4x1 row {j}");
                }
                let y = t(ty, [rows[2], rows[3]], a4);
                for (j, yj) in y.iter().enumerate() {
                    assert_eq!(yj.map(bits).to_vec(), want[2 + j], "{ty} 2x4");
                }
                let y = t(ty, [rows[1]], a4);
                assert_eq!(y[0].map(bits).to_vec(), want[1], "{ty} 1x4");
                let y = t(ty, [rows[0]], [&acts[3]]);
                assert_eq!(bits(y[0][0]), want[0][3], "{ty} 1x1");
            }
        }
    }
}

/// Q4_1 block `blk`'s eight integer lane sums against quants `qa`.
fn q4_1_lanes(blk: &[u8], qa: &[i8]) -> [i32; 8] {
    let mut sum = [0i32; 8];
    for (i, q) in blk[4..20].iter().enumerate() {
        sum[i / 4] += (q & 15) as i32 * qa[i] as i32;
        sum[4 + i / 4] += (q >> 4) as i32 * qa[16 + i] as i32;
    }
    sum
}

/// The control: the bitwise comparisons above see a change of rounding or
/// order. Each block's scaled lane sums added as a `mul` then an `add`
/// (two roundings, not one FMA), or the lanes reduced in the reference
/// forward's order, give other bits on these inputs. (The minimum term's
/// FMA is not such a case: `m * s`, a product of two f16s, is exact in f32.)
#[test]
fn another_order_gives_other_bits() {
    let mut rng = Lcg(11);
    let (mut unfused, mut reordered, mut total) = (0, 0, 0);
    for _ in 0..300 {
        let w = weight_bytes(GgmlType::Q4_1, 1, 18, &mut rng);
        let a = act_row(18, &mut rng);
        let want = dot(GgmlType::Q4_1, &w, &a);
        // Per lane: one FMA per block (the dot's), and a `mul` then an `add`.
        let (mut fused, mut twice, mut summs) = ([0f32; 8], [0f32; 8], 0f32);
        for (b, blk) in w.chunks_exact(20).enumerate() {
            let sum = q4_1_lanes(blk, &a.qs[b * 32..][..32]);
            summs = (f16_of(blk, 2) as f32).mul_add(a.s[b], summs);
            let dd = f16_of(blk, 0) as f32 * a.d[b];
            for ((f, t), s) in fused.iter_mut().zip(&mut twice).zip(sum) {
                *f = dd.mul_add(s as f32, *f);
                *t += dd * s as f32;
            }
        }
        assert_eq!(hsum8(fused) + summs, want, "the fused lanes are the dot's");
        unfused += (hsum8(twice) + summs != want) as usize;
        // The reference forward's reduction of the same lanes.
        let l = fused;
        let r = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        reordered += (r + summs != want) as usize;
        total += 1;
    }
    assert!(
        unfused > 0,
        "no input tells one rounding per block from two"
    );
    assert!(reordered > 0, "no input tells the two reductions apart");
    eprintln!("of {total}: {unfused} differ unfused, {reordered} reordered");
}

fn q_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let mut rng = Lcg(seed);
    QMatrix {
        rows,
        cols,
        ty,
        bytes: weight_bytes(ty, rows, cols / 32, &mut rng).into(),
    }
}

/// The matmul (decode and prefill shapes, groups, 1 to 3 threads) gives
/// each output as [`dot`] of its row's blocks gives it.
#[test]
fn the_matmul_gives_each_output_as_the_dot() {
    let (rows, cols) = (38, 96);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let q = q_matrix(ty, rows, cols, 13);
        let lin = Linear {
            m: Weight::Quant(q.clone()),
            mins: None,
            bias: None,
        };
        let mut rng = Lcg(17);
        for n in [1, 2, 3, 4, 5, 9, 37] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32(2.0)).collect();
            let want: Vec<u32> = (0..n)
                .flat_map(|r| {
                    let a = ActBlocks::of(&quantize_row(&x[r * cols..][..cols], 32));
                    let q = &q;
                    (0..rows).map(move |o| {
                        dot(
                            ty,
                            &q.bytes[o * ty.row_bytes(cols)..][..ty.row_bytes(cols)],
                            &a,
                        )
                        .to_bits()
                    })
                })
                .collect();
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (one, group) = pool.install(|| {
                    (
                        matmul_with_mins(&x, n, &q, None, Act::LlamaCpp),
                        apply_group(&[&lin, &lin], &x, n, Act::LlamaCpp),
                    )
                });
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&one), want, "{ty} n {n} on {threads} threads");
                assert_eq!(bits(&group[1]), want, "{ty} n {n} group");
            }
            // Plain q8 sums in the reference order: other bits.
            let q8 = matmul_with_mins(&x, n, &q, None, Act::Q8);
            assert!(q8.iter().zip(&want).any(|(a, b)| a.to_bits() != *b));
        }
    }
}
