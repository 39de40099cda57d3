//! `taptree diff` of tensor-parallel trees: each ranked tree is compared
//! through its unsharded view (`diff::unshard`), and the first diverging
//! row is explained by rank.

use capture::TreeReader;
use diff::report::{Note, PartialsLeftOut};
use diff::unshard::{rank_count, rank_notes, Unsharded};
use diff::Tree;

/// Whether any tap of `t` carries a rank (a tree opened from its index's
/// records has none: an index holds no rank).
fn is_ranked(t: &TreeReader) -> bool {
    match t.listing() {
        capture::Entries::Owned(_) => diff::unshard::is_ranked(t.manifest()),
        capture::Entries::Records(_) => false,
    }
}

/// The unsharded views of the ranked trees among A, B and the truth.
pub struct Views<'t> {
    a: Option<Unsharded<'t>>,
    b: Option<Unsharded<'t>>,
    truth: Option<Unsharded<'t>>,
}

impl<'t> Views<'t> {
    /// Views of whichever trees carry ranks; says in `notes` what is left out.
    pub fn new(
        (a, b): (&'t TreeReader, &'t TreeReader),
        truth: Option<&'t TreeReader>,
        notes: &mut Vec<Note>,
    ) -> anyhow::Result<Views<'t>> {
        let (ra, rb) = (is_ranked(a), is_ranked(b));
        // Partial sums are compared rank by rank only when both sides have
        // them over the same ranks (TP=2's rank 1 sums other columns than TP=4's).
        let keep = ra && rb && rank_count(a.manifest()) == rank_count(b.manifest());
        let view = |t: &'t TreeReader, ranked: bool| -> anyhow::Result<Option<Unsharded<'t>>> {
            Ok(match ranked {
                true => Some(Unsharded::new(t, keep)?),
                false => None,
            })
        };
        let views = Views {
            a: view(a, ra)?,
            b: view(b, rb)?,
            truth: match truth {
                Some(t) => view(t, is_ranked(t))?,
                None => None,
            },
        };
        if ra || rb {
            let tp = |t: &TreeReader| t.head_fields().run.extra.get("tp").cloned();
            notes.push(Note::TensorParallel {
                tp_a: tp(a),
                tp_b: tp(b),
            });
            if !keep {
                let why = match ra && rb {
                    true => PartialsLeftOut::OtherRanks,
                    false => PartialsLeftOut::NoRanks,
                };
                notes.push(Note::PartialsNotCompared { why });
            }
        }
        Ok(views)
    }

    /// A, B and the truth as the walk should see them.
    pub fn trees<'s>(
        &'s self,
        (a, b): (&'s TreeReader, &'s TreeReader),
        truth: Option<&'s TreeReader>,
    ) -> (&'s dyn Tree, &'s dyn Tree, Option<&'s dyn Tree>) {
        let pick = |v: &'s Option<Unsharded<'t>>, t: &'s TreeReader| -> &'s dyn Tree {
            match v {
                Some(v) => v,
                None => t,
            }
        };
        (
            pick(&self.a, a),
            pick(&self.b, b),
            truth.map(|t| pick(&self.truth, t)),
        )
    }

    /// Notes on the first diverging row from the ranks, when either tree has them.
    pub fn explain(
        &self,
        report: &diff::DiffReport,
        (a, b): (&TreeReader, &TreeReader),
        notes: &mut Vec<Note>,
    ) -> anyhow::Result<()> {
        if self.a.is_none() && self.b.is_none() {
            return Ok(());
        }
        let Some(row) = report.first_divergence.map(|i| &report.rows[i]) else {
            return Ok(());
        };
        let (va, vb, _) = self.trees((a, b), None);
        notes.extend(rank_notes((a, b), (va, vb), row.layer, &row.stage)?);
        Ok(())
    }
}
