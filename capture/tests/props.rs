//! Properties over generated inputs: the tap-file parser never panics and
//! never accepts a damaged file as the original; selections agree with their
//! definition; hashes depend on exactly what the format says.

use capture::hashes::{tree_hashes, VerdictInputs};
use capture::manifest::path_of;
use capture::tapfile::{encode_header, parse};
use capture::{DType, Entry, Key, Selection};
use proptest::prelude::*;

fn tap_file(key: &Key, rows: usize, width: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..rows * width * 4).map(|i| (i * 7 % 251) as u8).collect();
    let mut f = encode_header(key, DType::F32, &[rows, width], data.len());
    f.extend_from_slice(&data);
    f
}

proptest! {
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&bytes);
    }

    #[test]
    fn header_damage_is_refused_or_changes_what_the_reader_compares(
        width in 0usize..9,
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let key = Key::new("ffn_up", Some(3), 2..4);
        let good = tap_file(&key, 2, width);
        let original = parse(&good).unwrap();
        let mut bad = good.clone();
        // Damage anywhere in the length prefix or the header (data damage is
        // the hash's job, checked by TreeReader::verify).
        let i = at.index(original.data_start);
        bad[i] ^= flip;
        if let Ok(h) = parse(&bad) {
            let unchanged = h.key == original.key
                && h.shape == original.shape
                && h.dtype == original.dtype
                && h.data_start == original.data_start;
            // A reader compares key, dtype and shape with the manifest, so
            // a change there is caught. An unchanged reading is only allowed
            // when the byte was informational: the `taptree.*` metadata
            // (never read back) or whitespace padding.
            if unchanged {
                let header = String::from_utf8_lossy(&good[8..original.data_start]).into_owned();
                let informational = |name: &str| {
                    let start = header.find(name).unwrap() + 8;
                    let end = start + header[start - 8..].find("\",\"").unwrap();
                    (start..end).contains(&i)
                };
                let padding = i >= 8 + header.trim_end().len();
                prop_assert!(
                    informational("\"taptree.format\"") || informational("\"taptree.key\"") || padding,
                    "byte {} of {:?} changed without effect", i, header
                );
            }
        }
    }

    #[test]
    fn truncation_is_always_refused(width in 1usize..9, cut in 1usize..64) {
        let f = tap_file(&Key::new("x", None, 0..1), 1, width);
        let cut = cut.min(f.len());
        prop_assert!(parse(&f[..f.len() - cut]).is_err());
    }

    #[test]
    fn selected_runs_are_exactly_the_selected_positions(
        lo in 0u32..20, len in 1u32..20, sel_a in 0u32..30, sel_len in 1u32..10, single in 0u32..40,
    ) {
        let text = format!("pos={}..{},{}", sel_a, sel_a + sel_len, single);
        let sel = Selection::parse(&text).unwrap();
        let pos = lo..lo + len;
        let from_runs: Vec<u32> = sel.selected_runs(pos.clone()).flatten().collect();
        let expected: Vec<u32> = pos
            .clone()
            .filter(|p| (sel_a..sel_a + sel_len).contains(p) || *p == single)
            .collect();
        prop_assert_eq!(&from_runs, &expected);
        // Runs are maximal: consecutive runs never touch.
        let runs: Vec<_> = sel.selected_runs(pos.clone()).collect();
        for w in runs.windows(2) {
            prop_assert!(w[0].end < w[1].start);
        }
        prop_assert_eq!(sel.wants(capture::TapId::new("any", None, pos, None)), !expected.is_empty());
    }

    #[test]
    fn the_root_sees_every_hashed_field_and_nothing_else(
        layer in 0u32..4, start in 0u32..50, rows in 1u32..4, hash in "[0-9a-f]{64}",
    ) {
        let key = Key::new("q_proj", Some(layer), start..start + rows);
        let entry = Entry {
            path: path_of(&key),
            key,
            dtype: DType::F32,
            shape: vec![rows as usize, 4],
            blake3: hash,
            bytes: rows as u64 * 16,
            header_blake3: None,
        };
        let run = capture::RunInfo::default();
        let inputs = VerdictInputs { selection: "all", run: &run, stages: &[] };
        let tree_hashes = |entries: &[Entry]| tree_hashes(entries, &inputs);
        let root = tree_hashes(std::slice::from_ref(&entry)).1;
        let mut moved = entry.clone();
        moved.path = "elsewhere".into();
        moved.bytes += 1;
        prop_assert_eq!(&tree_hashes(&[moved]).1, &root, "path and bytes are not hashed");
        let mut later = entry.clone();
        later.key.pos = start + 1..start + rows + 1;
        prop_assert_ne!(&tree_hashes(&[later]).1, &root);
        let mut other_layer = entry.clone();
        other_layer.key.layer = Some(layer + 1);
        prop_assert_ne!(&tree_hashes(&[other_layer]).1, &root);
        let mut global = entry;
        global.key.layer = None;
        prop_assert_ne!(&tree_hashes(&[global]).1, &root);
    }
}
