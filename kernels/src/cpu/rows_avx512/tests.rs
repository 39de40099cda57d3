//! The 512-bit loops against their AVX2 twins, bit for bit (run where the
//! CPU has AVX-512F and BW; they say they skipped elsewhere).

use super::*;
use model::quant::GgmlType;

/// A deterministic stream of u32s.
fn stream(seed: u64) -> impl FnMut() -> u32 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 32) as u32
    }
}

/// `rows` rows of `len` weights in random blocks of `ty`: random bytes,
/// with finite f16 scales (and minimums) of both signs, some subnormal.
fn blocks(ty: GgmlType, rows: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut next = stream(seed);
    let mut f16 = move || {
        let v = next();
        let x = match v % 8 {
            0 => (v >> 8) as f32 * 1e-12, // subnormal f16
            _ => ((v >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.1,
        };
        half::f16::from_f32(x).to_le_bytes()
    };
    let mut byte = stream(seed ^ 0xABCD);
    (0..rows)
        .map(|_| {
            let mut row = Vec::new();
            for _ in 0..len / 32 {
                let start = row.len();
                row.extend(f16());
                if ty == GgmlType::Q4_1 {
                    row.extend(f16());
                }
                while row.len() - start < ty.type_size() {
                    row.push(byte() as u8);
                }
            }
            row
        })
        .collect()
}

fn acts(len: usize, seed: u64, ints: bool) -> Vec<f32> {
    let mut next = stream(seed);
    (0..len)
        .map(|_| {
            let v = next();
            if ints {
                (v % 255) as f32 - 127.0
            } else {
                ((v >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 4.0
            }
        })
        .collect()
}

fn rows4<T>(w: &[Vec<T>]) -> [&[T]; 4] {
    [&w[0][..], &w[1][..], &w[2][..], &w[3][..]]
}

fn bits(v: [f32; 4]) -> [u32; 4] {
    v.map(f32::to_bits)
}

/// `vpshufb` on 64 bytes: per 128-bit lane, a control byte with its
/// top bit set gives 0, else the lane's byte at its low four bits.
fn shuffle_bytes(x: &[u8; 64], c: &[u8; 64]) -> [u8; 64] {
    std::array::from_fn(|i| {
        let lane = i / 16 * 16;
        if c[i] & 0x80 != 0 {
            0
        } else {
            x[lane + (c[i] & 0x0F) as usize]
        }
    })
}

#[test]
fn the_spread_controls_put_each_rows_bytes_in_order() {
    // Runs on every CPU: the controls' layout, not the instruction.
    let a: [u8; 16] = std::array::from_fn(|i| 0x10 + i as u8);
    let b: [u8; 16] = std::array::from_fn(|i| 0xA0 + i as u8);
    let x: [u8; 64] = std::array::from_fn(|i| if i < 32 { a[i % 16] } else { b[i % 16] });
    for (ctrl, first) in [(&SPREAD_FIRST.0, 0), (&SPREAD_SECOND.0, 8)] {
        let y = shuffle_bytes(&x, ctrl);
        let lanes: Vec<u32> = y
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let want: Vec<u32> = (0..8)
            .map(|i| a[first + i] as u32)
            .chain((0..8).map(|i| b[first + i] as u32))
            .collect();
        assert_eq!(lanes, want, "bytes {first}..{}", first + 8);
    }
}

#[test]
fn the_512_bit_loops_give_the_avx2_bits() {
    if !supported() {
        eprintln!("skipped: this CPU has no AVX-512F and BW (the AVX2 loops run instead)");
        assert!(
            !enabled(),
            "the 512-bit loops are never chosen without AVX-512F and BW"
        );
        return;
    }
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        for (i, len) in [32, 64, 96, 128, 160, 224, 576, 1536]
            .into_iter()
            .enumerate()
        {
            let w = blocks(ty, 4, len, 7 + i as u64);
            let wr = rows4(&w);
            let a = acts(len, 11 + i as u64, false);
            let q = acts(len, 13 + i as u64, true);
            let d = acts(len / 32, 17 + i as u64, false);
            // SAFETY: AVX-512F (and with it AVX2; F16C and FMA on every
            // such CPU) checked above; whole blocks of `len` weights.
            unsafe {
                let want = super::super::rows_avx::dot_w4_blocks(ty, &a, wr);
                let got = dot_w4_blocks(ty, &a, wr);
                assert_eq!(bits(got), bits(want), "{ty} f32 len {len}");
                let want = super::super::rows_avx::q8_w4_blocks(ty, &q, &d, wr);
                let got = q8_w4_blocks(ty, &q, &d, wr);
                assert_eq!(bits(got), bits(want), "{ty} q8 len {len}");
            }
        }
    }
}

#[test]
fn a_changed_weight_moves_only_its_row() {
    if !supported() {
        eprintln!("skipped: this CPU has no AVX-512F and BW");
        return;
    }
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        let w = blocks(ty, 4, 64, 3);
        let mut bad = w.clone();
        // A weight byte of row 1's second block: rows A and B share a register.
        bad[1][ty.type_size() + ty.type_size() - 1] ^= 0x11;
        let a = acts(64, 5, false);
        // SAFETY: as above.
        let (x, y) = unsafe {
            (
                dot_w4_blocks(ty, &a, rows4(&w)),
                dot_w4_blocks(ty, &a, rows4(&bad)),
            )
        };
        assert_ne!(x[1].to_bits(), y[1].to_bits(), "{ty}");
        assert_eq!(
            [x[0], x[2], x[3]].map(f32::to_bits),
            [y[0], y[2], y[3]].map(f32::to_bits)
        );
    }
}

#[test]
fn the_512_bit_prefill_loops_give_the_avx2_bits() {
    if !supported() {
        eprintln!("skipped: this CPU has no AVX-512F and BW (the AVX2 loops run instead)");
        return;
    }
    for (i, len) in [32, 64, 96, 160, 576, 1536].into_iter().enumerate() {
        let s = 100 * i as u64;
        let a: Vec<Vec<f32>> = (0..4).map(|r| acts(len, s + r, false)).collect();
        let q: Vec<Vec<f32>> = (0..4).map(|r| acts(len, s + 10 + r, true)).collect();
        let d: Vec<Vec<f32>> = (0..4).map(|r| acts(len / 32, s + 20 + r, false)).collect();
        let w: Vec<Vec<f32>> = (0..2).map(|r| acts(len, s + 30 + r, false)).collect();
        let (a, q, d, w) = (rows4(&a), rows4(&q), rows4(&d), [&w[0][..], &w[1][..]]);
        let b = |v: [[f32; 4]; 2]| v.map(bits);
        // SAFETY: AVX-512F checked above; lengths as each loop needs.
        unsafe {
            let want = super::super::rows_avx::dot4x2(a, w);
            assert_eq!(b(dot4x2(a, w)), b(want), "f32 len {len}");
            let want = super::super::rows_avx::q8_rows4x2(q, d, w, 32);
            assert_eq!(b(q8_rows4x2(q, d, w, 32)), b(want), "q8 len {len}");
        }
    }
}

#[test]
fn four_weight_rows_at_once_give_the_pairs_bits() {
    if !supported() {
        eprintln!("skipped: this CPU has no AVX-512F and BW (the AVX2 loops run instead)");
        return;
    }
    for (i, len) in [8, 32, 40, 576, 1536].into_iter().enumerate() {
        let s = 100 * i as u64;
        let a: Vec<Vec<f32>> = (0..4).map(|r| acts(len, s + r, false)).collect();
        let mut w: Vec<Vec<f32>> = (0..4).map(|r| acts(len, s + 30 + r, false)).collect();
        let a = rows4(&a);
        // SAFETY: AVX-512F checked above; every row `len` long.
        let (got, want) = unsafe {
            let w4 = rows4(&w);
            let [y0, y1] = super::super::rows_avx::dot4x2(a, [w4[0], w4[1]]);
            let [y2, y3] = super::super::rows_avx::dot4x2(a, [w4[2], w4[3]]);
            (dot4x4(a, w4), [y0, y1, y2, y3])
        };
        assert_eq!(got.map(bits), want.map(bits), "len {len}");
        // A changed weight of row 2 moves row 2's four sums and no other.
        w[2][len / 2] += 0.5;
        // SAFETY: as above.
        let moved = unsafe { dot4x4(a, rows4(&w)) };
        for (t, (m, g)) in moved.iter().zip(&got).enumerate() {
            assert_eq!(bits(*m) != bits(*g), t == 2, "len {len} weight row {t}");
        }
    }
}

#[test]
fn four_weight_rows_of_q8_at_once_give_the_pairs_bits() {
    if !supported() {
        eprintln!("skipped: this CPU has no AVX-512F and BW (the AVX2 loops run instead)");
        return;
    }
    // One block, an odd count and an even count of blocks of 32.
    for (i, len) in [32, 96, 576, 1536].into_iter().enumerate() {
        let s = 100 * i as u64;
        let q: Vec<Vec<f32>> = (0..4).map(|r| acts(len, s + 10 + r, true)).collect();
        let d: Vec<Vec<f32>> = (0..4).map(|r| acts(len / 32, s + 20 + r, false)).collect();
        let mut w: Vec<Vec<f32>> = (0..4).map(|r| acts(len, s + 30 + r, false)).collect();
        let (q, d) = (rows4(&q), rows4(&d));
        // SAFETY: AVX-512F checked above; every row `len` long, a scale per block.
        let (got, want) = unsafe {
            let w4 = rows4(&w);
            let [y0, y1] = super::super::rows_avx::q8_rows4x2(q, d, [w4[0], w4[1]], 32);
            let [y2, y3] = super::super::rows_avx::q8_rows4x2(q, d, [w4[2], w4[3]], 32);
            (q8_rows4x4(q, d, w4, 32), [y0, y1, y2, y3])
        };
        assert_eq!(got.map(bits), want.map(bits), "len {len}");
        // A changed weight of row 3 moves row 3's four sums and no other.
        w[3][len - 1] += 0.5;
        // SAFETY: as above.
        let moved = unsafe { q8_rows4x4(q, d, rows4(&w), 32) };
        for (t, (m, g)) in moved.iter().zip(&got).enumerate() {
            assert_eq!(bits(*m) != bits(*g), t == 3, "len {len} weight row {t}");
        }
    }
}

/// The span loops (every group of four rows of a task in one call) give
/// each group's own call's bits, on AVX2 and on 512-bit registers, float
/// and q8; changed weights move only their row's output.
#[test]
fn span_loops_give_each_groups_bits() {
    use super::super::rows_avx;
    if !rows_avx::block_loops() {
        eprintln!("skipped: this CPU has no AVX2, F16C and FMA");
        return;
    }
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        for (i, len) in [32, 96, 576].into_iter().enumerate() {
            let mut w = blocks(ty, 12, len, 40 + i as u64);
            let (a, q) = (acts(len, 3, false), acts(len, 4, true));
            let d: Vec<f32> = (0..len / 32).map(|b| 0.01 * (b as f32 + 1.5)).collect();
            // SAFETY (each block below): the CPU features checked above (and
            // by `supported`), whole blocks of `len` weights in every row.
            let groups = |w: &[Vec<u8>], q8: bool, wide: bool| -> Vec<u32> {
                w.chunks_exact(4)
                    .flat_map(|g| unsafe {
                        let g = rows4(g);
                        bits(match (q8, wide) {
                            (false, false) => rows_avx::dot_w4_blocks(ty, &a, g),
                            (false, true) => dot_w4_blocks(ty, &a, g),
                            (true, false) => rows_avx::q8_w4_blocks(ty, &q, &d, g),
                            (true, true) => q8_w4_blocks(ty, &q, &d, g),
                        })
                    })
                    .collect()
            };
            let span = |w: &[Vec<u8>], q8: bool, wide: bool| -> Vec<u32> {
                let all = w.concat();
                let mut out = vec![0f32; w.len()];
                unsafe {
                    match (q8, wide) {
                        (false, false) => rows_avx::dot_rows_blocks(ty, &a, &all, &mut out),
                        (false, true) => dot_rows_blocks(ty, &a, &all, &mut out),
                        (true, false) => rows_avx::q8_rows_blocks(ty, &q, &d, &all, &mut out),
                        (true, true) => q8_rows_blocks(ty, &q, &d, &all, &mut out),
                    }
                }
                out.into_iter().map(f32::to_bits).collect()
            };
            for q8 in [false, true] {
                for wide in [false, true].into_iter().filter(|&x| !x || supported()) {
                    let case = format!("{ty} len {len} q8 {q8} 512-bit {wide}");
                    let before = span(&w, q8, wide);
                    assert_eq!(before, groups(&w, q8, wide), "{case}");
                    let kept = std::mem::replace(&mut w[6], blocks(ty, 1, len, 99).remove(0));
                    let after = span(&w, q8, wide);
                    w[6] = kept;
                    for (j, (x, y)) in before.iter().zip(&after).enumerate() {
                        assert_eq!(x != y, j == 6, "{case}: row {j}");
                    }
                }
            }
        }
    }
}

/// The sixteen-row min terms give the four-row loop's bits, at counts of
/// blocks around the transposed sixteen and of rows past a multiple of
/// sixteen; a changed minimum moves only its row.
#[test]
fn min_terms_sixteen_rows_at_once_give_the_four_row_bits() {
    if !supported() {
        eprintln!("skipped: this CPU has no AVX-512F and BW");
        return;
    }
    let val = |i: usize, s: usize| {
        ((i as u32).wrapping_mul(2654435761).wrapping_add(s as u32) >> 8) as f32 / (1 << 20) as f32
    };
    for rows in [16, 20, 36] {
        for nb in [1, 15, 16, 17, 18, 33, 48] {
            let mut m: Vec<f32> = (0..rows * nb).map(|i| val(i, 1) - 8.0).collect();
            let e: Vec<f32> = (0..nb).map(|b| val(b, 9) * 0.1 - 0.5).collect();
            let acc: Vec<f32> = (0..rows).map(|j| val(j, 5) * 3.0).collect();
            let run = |m: &[f32], wide: bool| {
                let mut out = acc.clone();
                // SAFETY: AVX-512F checked above (AVX with it); `m` holds
                // `rows` rows of `nb`.
                unsafe {
                    if wide {
                        min_terms_rows(&mut out, m, &e)
                    } else {
                        super::super::rows_avx::min_terms_rows(&mut out, m, &e)
                    }
                }
                out.into_iter().map(f32::to_bits).collect::<Vec<_>>()
            };
            let case = format!("{rows} rows, {nb} blocks");
            let before = run(&m, true);
            assert_eq!(before, run(&m, false), "{case}");
            for j in [3, 17.min(rows - 1)] {
                m[j * nb + nb - 1] += 1.0;
                let after = run(&m, true);
                m[j * nb + nb - 1] -= 1.0;
                for (r, (x, y)) in before.iter().zip(&after).enumerate() {
                    assert_eq!(x != y, r == j, "{case}: changed row {j}, row {r}");
                }
            }
        }
    }
}
