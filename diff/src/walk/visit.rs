//! What a walk emits, and the delegate that hears it (gitoxide's tree-diff
//! `Visit` / `Action` / `Recorder`): the positions one tree holds alone, then
//! every judged row in forward order. [`Recorder`] builds the [`DiffReport`];
//! the controls are delegates of their own ([`crate::controls`]).

use crate::divergence;
use crate::report::{Counts, DiffOutcome, DiffReport, Row, Status, TreeInfo, SCHEMA};
use crate::tree::Tree;
use capture::TapId;

pub use crate::report::Side;

/// One thing a walk found.
#[derive(Debug)]
pub enum Change<'a> {
    /// A position (a one-position key) that only `side` holds: never compared.
    OnlyIn {
        /// The tree holding it.
        side: Side,
        /// The position.
        key: TapId<'a>,
    },
    /// A judged (layer, stage), in forward order, cause and growth set;
    /// handed over, not lent (a large diff's rows are most of its memory).
    Row(Box<Row>),
}

/// What the walk does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Go on.
    Continue,
    /// Stop: nothing more is emitted and the walk returns.
    Cancel,
}

/// A delegate of a walk.
pub trait Visit {
    /// Hears one change.
    fn visit(&mut self, change: Change<'_>) -> Action;
}

/// What a walk says beside what it emits.
#[derive(Debug, Clone, Default)]
pub struct Walked {
    /// The roots are equal: every tensor bitwise identical, nothing emitted.
    pub identical: bool,
    /// A delegate cancelled the walk.
    pub cancelled: bool,
    /// Positions, taps and bytes (the row counts are the recorder's).
    pub counts: Counts,
    /// Where the runs' input tokens part.
    pub inputs_split: Option<crate::inputs::InputSplit>,
}

/// The delegate that keeps everything: [`Recorder::report`] makes the
/// [`DiffReport`].
#[derive(Default)]
pub struct Recorder {
    rows: Vec<Row>,
    only_in_a: Vec<capture::Key>,
    only_in_b: Vec<capture::Key>,
}

impl Visit for Recorder {
    fn visit(&mut self, change: Change<'_>) -> Action {
        match change {
            Change::OnlyIn { side: Side::A, key } => self.only_in_a.push(key.to_key()),
            Change::OnlyIn { side: Side::B, key } => self.only_in_b.push(key.to_key()),
            Change::Row(row) => self.rows.push(*row),
        }
        Action::Continue
    }
}

impl Recorder {
    /// The report of a walk of `a` and `b` (and `truth`) that this recorder heard.
    pub fn report(
        self,
        walked: Walked,
        (a, b, truth): (&dyn Tree, &dyn Tree, Option<&dyn Tree>),
        opts: &super::Options,
    ) -> DiffReport {
        let rows = self.rows;
        let mut counts = walked.counts;
        counts.rows_red = rows.iter().filter(|r| r.status.is_red()).count() as u64;
        counts.rows_degenerate = rows
            .iter()
            .filter(|r| r.status == Status::Degenerate)
            .count() as u64;
        counts.rows_unreadable = rows
            .iter()
            .filter(|r| r.status == Status::Unreadable)
            .count() as u64;
        let mut report = DiffReport {
            schema: SCHEMA,
            a: info(a),
            b: info(b),
            truth: truth.map(info),
            tolerance: opts.tolerance.clone(),
            outcome: DiffOutcome::Identical,
            first_divergence: divergence::first_divergence(&rows),
            first_inexact: divergence::first_inexact(&rows),
            growth_ranking: divergence::ranking(&rows),
            rows,
            common_only: opts.common_only,
            only_in_a: self.only_in_a,
            only_in_b: self.only_in_b,
            inputs_split: walked.inputs_split,
            counts,
            controls: Vec::new(),
            notes: Vec::new(),
        };
        if !walked.identical {
            crate::truth::count(&mut report);
            report.outcome = DiffOutcome::WithinTolerance;
            super::outcome::conclude(&mut report);
        }
        report
    }
}

fn info(tree: &dyn Tree) -> TreeInfo {
    let (m, l) = (tree.head(), tree.listing());
    TreeInfo {
        path: tree.path().display().to_string(),
        root: m.root.clone(),
        taps: l.len(),
        bytes: l.total_bytes(),
        model: m.run.model.clone(),
        backend: m.run.backend.clone(),
        precision: m.run.precision.clone(),
    }
}
