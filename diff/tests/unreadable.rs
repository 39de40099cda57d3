//! One tap that cannot be read (a damaged file under an intact manifest) is
//! a reported, counted row, not the end of the diff; and a damaged tree is
//! never agreement.

mod support;

use capture::Manifest;
use diff::report::{DiffOutcome, Status};
use diff::tree::{Tensor, Tree};
use diff::Options;
use std::path::Path;
use support::{taps, MemTree, Shape};

/// `inner` with entry `bad` failing to read, as a truncated file does.
struct Damaged<'a> {
    inner: &'a MemTree,
    bad: usize,
}

impl Tree for Damaged<'_> {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn manifest(&self) -> &Manifest {
        self.inner.manifest()
    }
    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        if index == self.bad {
            let e = &self.inner.manifest().entries[index];
            return Err(capture::Error::CorruptTap {
                path: self.inner.path().join(&e.path),
                reason: "file is 100 bytes shorter than its header says".into(),
            });
        }
        self.inner.read(index)
    }
}

fn entry_of(tree: &MemTree, name: &str) -> usize {
    let m = tree.manifest();
    m.entries
        .iter()
        .position(|e| e.key.to_string() == name)
        .unwrap_or_else(|| panic!("no tap {name}"))
}

#[test]
fn an_unreadable_tap_is_a_counted_row_and_the_diff_goes_on() {
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            // Every tap of B differs a little: each one has to be read.
            for v in &mut t.values {
                *v *= 1.0 + 1e-6;
            }
        }),
    );
    let bad = entry_of(&b, "L1/ffn_up@2");
    let damaged = Damaged { inner: &b, bad };
    let r = diff::diff(&a, &damaged, None, &Options::default()).unwrap();
    let unreadable: Vec<_> = r
        .rows
        .iter()
        .filter(|r| r.status == Status::Unreadable)
        .collect();
    assert_eq!(unreadable.len(), 1, "{}", diff::render::summary(&r));
    let row = unreadable[0];
    assert_eq!(row.name(), "L1/ffn_up");
    let why = row.unreadable.as_ref().unwrap().to_string();
    assert!(
        why.contains("L001/ffn_up.p2-3") && why.contains("shorter"),
        "{why}"
    );
    assert!(row.positions.iter().any(|p| p.pos == 2 && !p.pass));
    assert_eq!(r.counts.rows_unreadable, 1);
    // Every other row was still compared.
    let rows = r.rows.len();
    assert_eq!(
        r.rows.iter().filter(|r| r.status == Status::Pass).count(),
        rows - 1
    );
    // Never agreement, never a verdict.
    assert_eq!(r.outcome, DiffOutcome::Unreadable);
    let summary = diff::render::summary(&r);
    assert!(summary.starts_with("could not read 1 of"), "{summary}");
    assert!(summary.contains("L1/ffn_up"), "{summary}");
    let table = diff::render::table::render(&r, &Default::default());
    assert!(table.contains("UNREADABLE"), "{table}");
    assert!(table.contains("could not read: "), "{table}");
    let json = diff::render::json::render(&r);
    assert!(json.contains("\"outcome\": \"unreadable\""), "{json}");
    assert!(json.contains("\"rows_unreadable\": 1"), "{json}");

    // The same trees unharmed: every row passes, and the outcome says so.
    let r = diff::diff(&a, &b, None, &Options::default()).unwrap();
    assert_eq!(r.outcome, DiffOutcome::WithinTolerance);
    assert_eq!(r.counts.rows_unreadable, 0);
    assert!(!diff::render::json::render(&r).contains("rows_unreadable"));
}

#[test]
fn an_unreadable_tap_equal_by_hash_is_never_read_and_never_reported() {
    // Equal hashes settle a tap without reading it: a damaged file there is
    // `verify --rehash`'s to find, not the diff's.
    let a = MemTree::new("a", taps(&Shape::default(), |_| {}));
    let b = MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            if t.key.to_string() == "L2/o_proj@1" {
                t.values[0] += 0.5;
            }
        }),
    );
    let bad = entry_of(&b, "L0/ffn_up@2");
    let r = diff::diff(&a, &Damaged { inner: &b, bad }, None, &Options::default()).unwrap();
    assert_eq!(r.outcome, DiffOutcome::Diverged);
    assert_eq!(r.counts.rows_unreadable, 0);
}
