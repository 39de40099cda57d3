//! Step 4, judge: one [`Row`] per (layer, stage) from its segments' states:
//! per-position metrics under the tolerance, the worst position, the
//! status, and with a truth which side is closer to it.

use super::merge::Segment;
use super::read::SegState;

/// (T-vs-A, T-vs-B) at one position of a compared segment, read on demand;
/// `Err` says why a tap could not be read.
pub(crate) type TruthAt<'t> =
    dyn Fn(&Segment, u32) -> Result<Option<(Acc, Acc)>, crate::report::Unreadable> + Sync + 't;
use crate::metrics::{Acc, Metrics};
use crate::report::{Closer, EqualRun, Position, Reason, Row, Status, TruthVerdict};
use crate::tolerance::Tolerance;
use capture::Entries;

/// The row of `layer`/`stage` from its segments (in key order) and their states.
pub(crate) fn build_row(
    (layer, stage): super::RowKey,
    segments: &[Segment],
    states: &[SegState],
    la: Entries,
    tol: &Tolerance,
    truth_at: Option<&TruthAt>,
) -> Row {
    // Reports name A's own slot even when slots were paired.
    let slot_of = |seg: &Segment| la.slot(seg.a.entry());
    let equal = equal_runs(segments, states, &slot_of);
    let mut row = Row {
        layer,
        stage,
        status: Status::Equal,
        reasons: Vec::new(),
        cause: None,
        worst: 0,
        total: Acc::default().metrics(),
        positions: Vec::new(),
        equal,
        skipped: states.iter().all(|s| matches!(s, SegState::Skipped(_))),
        growth: None,
        truth: None,
        hint: None,
        unreadable: None,
    };
    if row.skipped {
        // Every position equal by hash: one line stands for them all.
        let (n, count) = segments
            .iter()
            .zip(states)
            .map(|(seg, s)| match s {
                SegState::Skipped(n) => (n * u64::from(seg.len), u64::from(seg.len)),
                _ => (0, 0),
            })
            .fold((0, 0), |(n, c), (x, y)| (n + x, c + y));
        let acc = Acc::identical(n, count);
        row.total = acc.metrics();
        row.positions = vec![Position {
            pos: segments[0].key.3,
            slot: slot_of(&segments[0]),
            pass: true,
            metrics: acc.metrics(),
        }];
        return row;
    }
    let Gathered {
        positions,
        origins,
        total,
        mismatch,
        unreadable,
    } = gather(segments, states, &slot_of, tol);
    row.unreadable = unreadable;
    let worst = worst(&positions);
    // With a truth every row says which side is closer to it at its worst
    // position, green rows too: the only position whose truth is read.
    let truth = match (truth_at, origins[worst]) {
        (Some(at), Some((seg, j))) => at(&segments[seg], j).unwrap_or_else(|why| {
            row.unreadable.get_or_insert(why);
            None
        }),
        _ => None,
    };
    row.status = status(&positions, mismatch.is_some(), row.unreadable.is_some());
    if let Some(m) = mismatch {
        row.reasons.push(m);
    }
    if row.status == Status::Fail {
        row.reasons.extend(tol.failing(&positions[worst].metrics));
    }
    if row.status == Status::Degenerate {
        let p = positions
            .iter()
            .find(|p| p.metrics.degenerate_a.is_some() || p.metrics.degenerate_b.is_some())
            .unwrap();
        row.reasons.push(Reason::Degenerate {
            pos: p.pos,
            slot: p.slot,
            a: p.metrics.degenerate_a,
            b: p.metrics.degenerate_b,
        });
    }
    if truth_at.is_some() {
        let w = &positions[worst];
        row.truth = Some(match &truth {
            Some((ta, tb)) => verdict(w.pos, w.slot, &ta.metrics(), &tb.metrics()),
            None => TruthVerdict {
                pos: w.pos,
                slot: w.slot,
                error_a: f64::NAN,
                error_b: f64::NAN,
                max_abs_a: f64::NAN,
                max_abs_b: f64::NAN,
                closer: Closer::Unknown,
            },
        });
    }
    row.worst = worst;
    row.total = total.metrics();
    row.positions = positions;
    row
}

/// The positions of a row that were read (or fail as equal), in order, each
/// with where it was compared (segment, offset); their merged total; the
/// row's mismatch and why a tap could not be read, if so.
struct Gathered {
    positions: Vec<Position>,
    origins: Vec<Option<(usize, u32)>>,
    total: Acc,
    mismatch: Option<Reason>,
    unreadable: Option<crate::report::Unreadable>,
}

fn gather(
    segments: &[Segment],
    states: &[SegState],
    slot_of: &dyn Fn(&Segment) -> Option<u32>,
    tol: &Tolerance,
) -> Gathered {
    let count: usize = segments
        .iter()
        .zip(states)
        .filter(|(_, s)| !matches!(s, SegState::Skipped(_)))
        .map(|(seg, _)| seg.len as usize)
        .sum();
    let mut positions = Vec::with_capacity(count);
    let mut total = Acc::default();
    let mut mismatch = None;
    let mut origins = Vec::with_capacity(count);
    let mut unreadable = None;
    for (si, (seg, state)) in segments.iter().zip(states).enumerate() {
        let slot = slot_of(seg);
        match state {
            // Positions equal by hash are counted, not listed (they are in
            // `equal`), unless identity itself fails the tolerance.
            SegState::Skipped(n) => {
                let acc = Acc::identical(*n, 1);
                let m = acc.metrics();
                let pass = tol.passes(&m);
                if pass {
                    total.merge(&Acc::identical(n * u64::from(seg.len), u64::from(seg.len)));
                    continue;
                }
                for j in 0..seg.len {
                    total.merge(&acc);
                    positions.push(Position {
                        pos: seg.key.3 + j,
                        slot,
                        pass,
                        metrics: m.clone(),
                    });
                    origins.push(None);
                }
            }
            SegState::Compared {
                mismatch: why,
                results,
            } => {
                if why.is_some() {
                    mismatch = why.clone();
                }
                for (j, acc) in (0..seg.len).zip(results) {
                    total.merge(acc);
                    let m = acc.metrics();
                    let pass = why.is_none() && tol.passes(&m);
                    positions.push(Position {
                        pos: seg.key.3 + j,
                        slot,
                        pass,
                        metrics: m,
                    });
                    origins.push(Some((si, j)));
                }
            }
            // Nothing is known of these positions: listed, never passing.
            SegState::Unreadable(why) => {
                unreadable.get_or_insert_with(|| why.clone());
                for j in 0..seg.len {
                    positions.push(Position {
                        pos: seg.key.3 + j,
                        slot,
                        pass: false,
                        metrics: Acc::default().metrics(),
                    });
                    origins.push(None);
                }
            }
        }
    }
    Gathered {
        positions,
        origins,
        total,
        mismatch,
        unreadable,
    }
}

/// Positions equal by hash, as runs of one slot.
fn equal_runs(
    segments: &[Segment],
    states: &[SegState],
    slot_of: &dyn Fn(&Segment) -> Option<u32>,
) -> Vec<EqualRun> {
    let mut equal: Vec<EqualRun> = Vec::new();
    for (seg, state) in segments.iter().zip(states) {
        if let SegState::Skipped(_) = state {
            let (slot, start, end) = (slot_of(seg), seg.key.3, seg.key.3 + seg.len);
            match equal.last_mut() {
                Some(r) if r.slot == slot && r.end == start => r.end = end,
                _ => equal.push(EqualRun { slot, start, end }),
            }
        }
    }
    equal
}

/// The worst position: failing first, then lowest cosine, then highest NMSE.
fn worst(positions: &[Position]) -> usize {
    (0..positions.len())
        .min_by(|&x, &y| {
            let (px, py) = (&positions[x], &positions[y]);
            px.pass
                .cmp(&py.pass)
                .then(px.metrics.cos.total_cmp(&py.metrics.cos))
                .then(py.metrics.nmse.total_cmp(&px.metrics.nmse))
                .then(x.cmp(&y))
        })
        .unwrap_or(0)
}

fn status(positions: &[Position], mismatch: bool, unreadable: bool) -> Status {
    let degenerate = positions
        .iter()
        .any(|p| p.metrics.degenerate_a.is_some() || p.metrics.degenerate_b.is_some());
    if unreadable {
        Status::Unreadable
    } else if mismatch {
        Status::Mismatch
    } else if positions.iter().any(|p| !p.pass) {
        Status::Fail
    } else if degenerate {
        Status::Degenerate
    } else if positions.iter().all(|p| p.metrics.bitwise()) {
        Status::Equal
    } else {
        Status::Pass
    }
}

/// Which of A and B is closer to the truth at one position.
fn verdict(pos: u32, slot: Option<u32>, ta: &Metrics, tb: &Metrics) -> TruthVerdict {
    let (ea, eb) = (ta.rel_rms, tb.rel_rms);
    let closer = if !(ea.is_finite() && eb.is_finite()) {
        match (ea.is_finite(), eb.is_finite()) {
            (true, false) => Closer::A,
            (false, true) => Closer::B,
            _ => Closer::Neither,
        }
    } else if ea.max(eb) <= 1.1 * ea.min(eb) {
        Closer::Neither
    } else if ea < eb {
        Closer::A
    } else {
        Closer::B
    };
    TruthVerdict {
        pos,
        slot,
        error_a: ea,
        error_b: eb,
        max_abs_a: ta.max_abs,
        max_abs_b: tb.max_abs,
        closer,
    }
}
