//! Step 2, merge: the two sorted indexes walked side by side, a tap at a
//! time, into runs of positions both trees hold ([`Segment`]s), positions
//! one tree holds alone, and positions past where the runs' inputs part.

use super::index::{group, Loc, PosKey, Tap};

/// A run of matched positions held by one tap of each tree: positions
/// `key.3 .. key.3 + len`, at rows `a.row ..` of A's tap and `b.row ..` of
/// B's. Taps that hold the same positions in both trees (the usual case)
/// make one segment each.
#[derive(Clone, Copy)]
pub(crate) struct Segment {
    pub(crate) key: PosKey,
    pub(crate) len: u32,
    pub(crate) a: Loc,
    pub(crate) b: Loc,
}

impl Segment {
    /// The key of the segment's `j`th position.
    pub(crate) fn key(&self, j: u32) -> PosKey {
        (self.key.0, self.key.1, self.key.2, self.key.3 + j)
    }
}

/// What the merge found.
#[derive(Default)]
pub(crate) struct Merged {
    /// Runs of positions both trees hold, in key order.
    pub(crate) matched: Vec<Segment>,
    /// Positions only A holds, then only B (before the inputs' split).
    pub(crate) only_in_a: Vec<PosKey>,
    pub(crate) only_in_b: Vec<PosKey>,
    /// Positions both hold but past where their inputs part: not compared.
    pub(crate) inputs_differ: u64,
}

/// The positions of a tree not yet merged, a tap at a time: the current
/// tap's next position, its end, and where that position lives.
struct Cursor<'a> {
    order: std::slice::Iter<'a, Tap>,
    current: Option<(PosKey, u32, Loc)>,
}

impl<'a> Cursor<'a> {
    fn new(order: &'a [Tap]) -> Cursor<'a> {
        let mut c = Cursor {
            order: order.iter(),
            current: None,
        };
        c.current = c.pull();
        c
    }

    fn pull(&mut self) -> Option<(PosKey, u32, Loc)> {
        loop {
            let &Tap { key, entry, rows } = self.order.next()?;
            if rows > 0 {
                return Some((key, key.3 + rows, Loc { entry, row: 0 }));
            }
        }
    }

    /// Moves past `n` positions of the current tap.
    fn advance(&mut self, n: u32) {
        if let Some((key, end, loc)) = &mut self.current {
            key.3 += n;
            loc.row += n;
            if key.3 >= *end {
                self.current = self.pull();
            }
        }
    }
}

/// An empty vector with room for `n` segments whose pages were written
/// once on every core: the merge then fills memory already faulted in,
/// where one thread pushing into fresh pages took a fault every 4 KB (most
/// of the merge's time).
fn prefaulted(n: usize) -> Vec<Segment> {
    use rayon::prelude::*;
    let none = Loc { entry: 0, row: 0 };
    let mut v = Vec::new();
    (0..n)
        .into_par_iter()
        .map(|_| Segment {
            key: (0, None, None, 0),
            len: 0,
            a: none,
            b: none,
        })
        .collect_into_vec(&mut v);
    v.clear();
    v
}

/// Merges A's and B's indexes. `split_at(slot)` is the position of `slot`
/// from which the inputs differ, if they do: matched positions from there
/// on are counted, not compared, and lone ones are no news.
pub(crate) fn merge(
    oa: &[Tap],
    ob: &[Tap],
    split_at: &mut dyn FnMut(Option<u32>) -> Option<u32>,
) -> Merged {
    let mut out = Merged {
        matched: prefaulted(oa.len().max(ob.len())),
        ..Merged::default()
    };
    let (mut ca, mut cb) = (Cursor::new(oa), Cursor::new(ob));
    loop {
        let (x, y) = (ca.current, cb.current);
        // The side whose next positions are only its own, and how many.
        let lone = match (x, y) {
            (None, None) => break,
            (Some((ka, ea, la)), Some((kb, eb, lb))) if group(&ka) == group(&kb) => {
                if ka.3 < kb.3 {
                    Some((true, ka, ea.min(kb.3) - ka.3))
                } else if kb.3 < ka.3 {
                    Some((false, kb, eb.min(ka.3) - kb.3))
                } else {
                    let n = ea.min(eb) - ka.3;
                    // Past the inputs' split positions are counted, not compared.
                    let cut = match split_at(ka.2) {
                        Some(at) => at.saturating_sub(ka.3).min(n),
                        None => n,
                    };
                    if cut > 0 {
                        out.matched.push(Segment {
                            key: ka,
                            len: cut,
                            a: la,
                            b: lb,
                        });
                    }
                    out.inputs_differ += u64::from(n - cut);
                    ca.advance(n);
                    cb.advance(n);
                    None
                }
            }
            (Some((ka, ea, _)), y) if y.is_none_or(|(kb, _, _)| group(&ka) < group(&kb)) => {
                Some((true, ka, ea - ka.3))
            }
            (_, Some((kb, eb, _))) => Some((false, kb, eb - kb.3)),
            (Some(_), None) => unreachable!("a lone A is taken above"),
        };
        if let Some((in_a, k, n)) = lone {
            // Past the inputs' split a missing position is no news.
            let at = split_at(k.2);
            let list = if in_a {
                &mut out.only_in_a
            } else {
                &mut out.only_in_b
            };
            for p in k.3..k.3 + n {
                if at.is_none_or(|at| p < at) {
                    list.push((k.0, k.1, k.2, p));
                }
            }
            if in_a {
                ca.advance(n);
            } else {
                cb.advance(n);
            }
        }
    }
    out
}
