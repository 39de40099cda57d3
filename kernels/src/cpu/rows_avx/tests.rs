/// The four rows' min terms add each block's term in block order, as one
/// output at a time does, at every count of blocks around the register's
/// width; a changed minimum moves only its row.
#[test]
fn min_terms_of_four_rows_keep_the_block_order() {
    if !super::block_loops() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let val = |i: usize, s: u32| {
        ((i as u32).wrapping_mul(2654435761).wrapping_add(s) >> 8) as f32 / (1 << 20) as f32
    };
    for nb in [1, 3, 4, 5, 8, 18, 19] {
        let mut m: Vec<Vec<f32>> = (0..4)
            .map(|j| (0..nb).map(|b| val(b, j) - 8.0).collect())
            .collect();
        let e: Vec<f32> = (0..nb).map(|b| val(b, 9) * 0.1 + 0.5).collect();
        let acc = [1.5f32, -2.25, 10.0, 0.0];
        let one_by_one = |m: &[Vec<f32>]| {
            let mut a = acc;
            for (b, eb) in e.iter().enumerate() {
                for (j, aj) in a.iter_mut().enumerate() {
                    *aj += m[j][b] * *eb;
                }
            }
            a.map(f32::to_bits)
        };
        let rows = |m: &[Vec<f32>]| -> [Vec<f32>; 4] { std::array::from_fn(|j| m[j].clone()) };
        let run = |m: &[Vec<f32>]| {
            let r = rows(m);
            // SAFETY: AVX checked above; every row `nb` long.
            unsafe { super::min_terms_w4(acc, [&r[0], &r[1], &r[2], &r[3]], &e) }.map(f32::to_bits)
        };
        assert_eq!(run(&m), one_by_one(&m), "{nb} blocks");
        let before = run(&m);
        m[2][nb - 1] += 1.0;
        let after = run(&m);
        for j in 0..4 {
            assert_eq!(before[j] != after[j], j == 2, "{nb} blocks, row {j}");
        }
    }
}

/// The span's min terms (eight blocks' products transposed into place) give
/// each group of four rows [`super::min_terms_w4`]'s bits at every count of
/// blocks around the eight; a changed minimum moves only its row.
#[test]
fn min_terms_of_a_span_give_each_groups_bits() {
    if !super::block_loops() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let val = |i: usize, s: usize| {
        ((i as u32).wrapping_mul(2654435761).wrapping_add(s as u32) >> 8) as f32 / (1 << 20) as f32
    };
    for nb in [1, 7, 8, 9, 16, 18, 48] {
        let rows = 12;
        let mut m: Vec<f32> = (0..rows * nb).map(|i| val(i, 1) - 8.0).collect();
        let e: Vec<f32> = (0..nb).map(|b| val(b, 9) * 0.1 - 0.5).collect();
        let acc: Vec<f32> = (0..rows).map(|j| val(j, 5) * 3.0).collect();
        let span = |m: &[f32]| {
            let mut out = acc.clone();
            // SAFETY: AVX checked above; `m` holds `rows` rows of `nb`.
            unsafe { super::min_terms_rows(&mut out, m, &e) };
            out.into_iter().map(f32::to_bits).collect::<Vec<_>>()
        };
        let groups: Vec<u32> = (0..rows / 4)
            .flat_map(|g| {
                let r: [&[f32]; 4] = std::array::from_fn(|j| &m[(4 * g + j) * nb..][..nb]);
                let a = [0, 1, 2, 3].map(|j| acc[4 * g + j]);
                // SAFETY: as above.
                unsafe { super::min_terms_w4(a, r, &e) }.map(f32::to_bits)
            })
            .collect();
        let before = span(&m);
        assert_eq!(before, groups, "{nb} blocks");
        m[5 * nb + nb - 1] += 1.0;
        let after = span(&m);
        for (j, (x, y)) in before.iter().zip(&after).enumerate() {
            assert_eq!(x != y, j == 5, "{nb} blocks, row {j}");
        }
    }
}
