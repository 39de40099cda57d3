//! The rank notes of a tensor-parallel diff: which rank's shard holds a
//! difference (each full tensor read once per view, however many shards
//! slice it), and which rank's partial sum an all-reduced tap lacks (the
//! partial sums found in one pass over the entries).

mod support;

use capture::{DType, Key, Shard};
use diff::report::{Note, ReduceFault, Side};
use diff::tree::Tensor;
use diff::Tree;
use std::path::Path;
use std::sync::Mutex;
use support::{MemTree, Tap};

/// A tree that counts the reads of each of its entries.
struct Counting(MemTree, Mutex<Vec<usize>>);

impl Counting {
    fn new(t: MemTree) -> Counting {
        let n = t.manifest().entries.len();
        Counting(t, Mutex::new(vec![0; n]))
    }
    fn reads(&self) -> Vec<usize> {
        self.1.lock().unwrap().clone()
    }
}

impl Tree for Counting {
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn manifest(&self) -> &capture::Manifest {
        self.0.manifest()
    }
    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        self.1.lock().unwrap()[index] += 1;
        self.0.read(index)
    }
}

fn tap(key: Key, width: usize, values: Vec<f64>) -> Tap {
    Tap {
        key,
        width,
        dtype: DType::F64,
        values,
    }
}

const RANKS: u32 = 4;
const WIDTH: u32 = 8;

/// Rank `r`'s shard of `x` at position `pos`: columns `2r..2r+2` of 8.
fn shard(pos: u32, r: u32) -> Tap {
    let s = Shard {
        axis: 1,
        start: 2 * r,
        end: 2 * r + 2,
        full: WIDTH,
    };
    let key = Key::new("x", Some(0), pos..pos + 1).with_rank(Some(r), Some(s));
    tap(key, 2, vec![0.0; 2])
}

/// The unsharded view: `x` at positions 0 and 1, with `bump` added to
/// column `col` at position 1.
fn view(name: &str, col: usize, bump: f64) -> Counting {
    let full = (0..2)
        .map(|pos| {
            let mut v: Vec<f64> = (0..WIDTH).map(f64::from).collect();
            if pos == 1 {
                v[col] += bump;
            }
            tap(Key::new("x", Some(0), pos..pos + 1), WIDTH as usize, v)
        })
        .collect();
    Counting::new(MemTree::new(name, full))
}

#[test]
fn the_shard_holding_a_difference_is_named_and_each_full_tensor_read_once() {
    let ranked = || {
        MemTree::new(
            "r",
            (0..2)
                .flat_map(|p| (0..RANKS).map(move |r| shard(p, r)))
                .collect(),
        )
    };
    let (a, b) = (ranked(), ranked());
    // Column 5 is rank 2's (columns 4..6).
    let (va, vb) = (view("va", 5, 0.0), view("vb", 5, 0.25));
    let notes = diff::unshard::rank_notes((&a, &b), (&va, &vb), Some(0), "x").unwrap();
    let Some(Note::Shards { tree, shards, .. }) = notes.first() else {
        panic!("{notes:?}")
    };
    assert_eq!(*tree, Side::A);
    let by_rank: Vec<(u32, f64)> = shards.iter().map(|s| (s.rank, s.max_abs)).collect();
    assert_eq!(by_rank, vec![(0, 0.0), (1, 0.0), (2, 0.25), (3, 0.0)]);
    // Both trees' notes (A's and B's) read each full tensor of each view
    // once: four shards slice each of them.
    assert_eq!(va.reads(), vec![2, 2]);
    assert_eq!(vb.reads(), vec![2, 2]);
}

#[test]
fn the_rank_missing_from_an_all_reduced_tap_is_named() {
    // Positions 0..3; `x` is the sum of the 4 ranks' `x_partial`, except
    // at position 1, where rank 2's is left out. A partial of another slot
    // and a sharded one are not partial sums of these taps.
    let mut taps = Vec::new();
    for pos in 0..3u32 {
        let part = |r: u32| vec![f64::from(r + pos), 1.0];
        let mut sum = vec![0.0, 0.0];
        for r in 0..RANKS {
            let key = Key::new("x_partial", Some(0), pos..pos + 1).with_rank(Some(r), None);
            taps.push(tap(key, 2, part(r)));
            if !(pos == 1 && r == 2) {
                sum.iter_mut().zip(part(r)).for_each(|(s, p)| *s += p);
            }
        }
        taps.push(tap(Key::new("x", Some(0), pos..pos + 1), 2, sum));
    }
    let other_slot = Key::new("x_partial", Some(0), 1..2)
        .with_slot(Some(3))
        .with_rank(Some(9), None);
    taps.push(tap(other_slot, 2, vec![100.0, 100.0]));
    let t = MemTree::new("t", taps);
    let plain = MemTree::new("p", Vec::new());
    let notes = diff::unshard::rank_notes((&t, &plain), (&plain, &plain), Some(0), "x").unwrap();
    match notes.as_slice() {
        [Note::AllReduce {
            tree: Side::A,
            taps: 1,
            first: 1,
            end: 2,
            fault:
                ReduceFault::MissingRank {
                    rank: 2,
                    partial_stage,
                },
            ..
        }] => assert_eq!(partial_stage, "x_partial"),
        other => panic!("{other:?}"),
    }
}

/// A tree that is no tree read from disk (whose open refuses empty shards)
/// is refused by the view as well: a shard of no width between two others
/// is exit 2 naming its rank, not a read in chunks of no bytes.
#[test]
fn a_shard_of_no_width_is_refused_not_read() {
    let cut = |r: u32, start: u32, end: u32| {
        let s = Shard {
            axis: 1,
            start,
            end,
            full: WIDTH,
        };
        let key = Key::new("x", Some(0), 0..1).with_rank(Some(r), Some(s));
        tap(
            key,
            (end - start) as usize,
            vec![1.0; (end - start) as usize],
        )
    };
    let t = MemTree::new("t", vec![cut(0, 0, 4), cut(1, 4, 4), cut(2, 4, WIDTH)]);
    let err = diff::unshard::Unsharded::new(&t, false)
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("rank 1: shard 1:4-4/8 is empty"),
        "{err}"
    );
}

/// The number of ranks of a tree naming rank `u32::MAX` is one more than
/// that, not 0 (the sum wrapped, or panicked in a debug build).
#[test]
fn the_rank_count_of_the_last_rank_does_not_wrap() {
    let ranked = |r: u32| {
        let key = Key::new("x_partial", Some(0), 0..1).with_rank(Some(r), None);
        MemTree::new("t", vec![tap(key, 2, vec![1.0, 2.0])])
    };
    let count = |t: &MemTree| diff::unshard::rank_count(t.manifest());
    assert_eq!(count(&ranked(u32::MAX)), 1 << 32);
    assert_eq!(count(&ranked(1)), 2);
    assert_eq!(count(&MemTree::new("p", Vec::new())), 0);
}
