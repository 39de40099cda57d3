//! Binary search for the first red candidate of a range, with skips.
//!
//! Index 0 is the good endpoint and the last index the bad one. The endpoints
//! are probed only when the answer rests on them: the answer is always a pair
//! of *observed* neighbours, a green one and the red one after it (skipped
//! candidates aside). So a good endpoint that is red, or a bad one that is
//! green, is caught exactly when it would have mattered, and a range whose
//! answer lies strictly inside costs no endpoint captures at all.

/// What probing one candidate said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Within tolerance of the reference.
    Green,
    /// Diverges from the reference.
    Red,
    /// Cannot be tested (the capture command exited 125).
    Skip,
}

/// The answer of a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchOutcome {
    /// `index` is red and the candidate before it green: the first bad one.
    FirstBad { index: usize },
    /// Skipped candidates sit between the last green and the first red: the
    /// first bad one is one of `candidates` (ascending; the last is red).
    Ambiguous { candidates: Vec<usize> },
    /// The good endpoint diverges from the reference.
    GoodIsRed,
    /// The bad endpoint is within tolerance of the reference.
    BadIsGreen,
    /// An endpoint the answer rests on could not be tested.
    EndpointSkipped { index: usize },
}

/// Finds the first red index in `0..len` (`len >= 2`), assuming index 0 green
/// and `len - 1` red until the answer rests on them, or, with `check_endpoints`,
/// probing both before anything else. `probe` is called at most once per
/// index.
pub fn first_bad<E>(
    len: usize,
    check_endpoints: bool,
    mut probe: impl FnMut(usize) -> Result<Probe, E>,
) -> Result<SearchOutcome, E> {
    assert!(len >= 2, "a range needs a good and a bad endpoint");
    let (mut lo, mut hi) = (0usize, len - 1);
    let (mut lo_seen, mut hi_seen) = (false, false);
    if check_endpoints {
        match probe(lo)? {
            Probe::Green => lo_seen = true,
            Probe::Red => return Ok(SearchOutcome::GoodIsRed),
            Probe::Skip => return Ok(SearchOutcome::EndpointSkipped { index: lo }),
        }
        match probe(hi)? {
            Probe::Red => hi_seen = true,
            Probe::Green => return Ok(SearchOutcome::BadIsGreen),
            Probe::Skip => return Ok(SearchOutcome::EndpointSkipped { index: hi }),
        }
    }
    let mut skipped: Vec<usize> = Vec::new();
    loop {
        match pick(lo, hi, &skipped) {
            Some(mid) => match probe(mid)? {
                Probe::Green => (lo, lo_seen) = (mid, true),
                Probe::Red => (hi, hi_seen) = (mid, true),
                Probe::Skip => skipped.push(mid),
            },
            None => {
                if !lo_seen {
                    match probe(lo)? {
                        Probe::Green => {}
                        Probe::Red => return Ok(SearchOutcome::GoodIsRed),
                        Probe::Skip => return Ok(SearchOutcome::EndpointSkipped { index: lo }),
                    }
                }
                if !hi_seen {
                    match probe(hi)? {
                        Probe::Red => {}
                        Probe::Green => return Ok(SearchOutcome::BadIsGreen),
                        Probe::Skip => return Ok(SearchOutcome::EndpointSkipped { index: hi }),
                    }
                }
                let mut between: Vec<usize> = skipped
                    .iter()
                    .copied()
                    .filter(|&i| lo < i && i < hi)
                    .collect();
                if between.is_empty() {
                    return Ok(SearchOutcome::FirstBad { index: hi });
                }
                between.sort_unstable();
                between.push(hi);
                return Ok(SearchOutcome::Ambiguous {
                    candidates: between,
                });
            }
        }
    }
}

/// The untested index nearest the middle of the open interval `(lo, hi)`,
/// alternating below and above a skipped middle as `git bisect` does.
fn pick(lo: usize, hi: usize, skipped: &[usize]) -> Option<usize> {
    if hi <= lo + 1 {
        return None;
    }
    let mid = lo + (hi - lo) / 2;
    let open = |i: usize| lo < i && i < hi && !skipped.contains(&i);
    for d in 0..(hi - lo) {
        if d <= mid && open(mid - d) {
            return Some(mid - d);
        }
        if open(mid + d) {
            return Some(mid + d);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// Runs a search over `len` candidates, red from `first_red` on, with
    /// `skips` untestable; returns the outcome and the probed indices.
    fn search(len: usize, first_red: usize, skips: &[usize]) -> (SearchOutcome, Vec<usize>) {
        search_checked(len, first_red, skips, false)
    }

    fn search_checked(
        len: usize,
        first_red: usize,
        skips: &[usize],
        check_endpoints: bool,
    ) -> (SearchOutcome, Vec<usize>) {
        let mut probed = Vec::new();
        let outcome = first_bad::<Infallible>(len, check_endpoints, |i| {
            assert!(!probed.contains(&i), "index {i} probed twice");
            probed.push(i);
            Ok(if skips.contains(&i) {
                Probe::Skip
            } else if i >= first_red {
                Probe::Red
            } else {
                Probe::Green
            })
        })
        .unwrap();
        (outcome, probed)
    }

    #[test]
    fn finds_every_boundary_of_a_32_range_in_at_most_5_probes_plus_an_endpoint() {
        for first_red in 1..32 {
            let (outcome, probed) = search(32, first_red, &[]);
            assert_eq!(outcome, SearchOutcome::FirstBad { index: first_red });
            // 31 possible answers take 5 probes; an answer next to an
            // endpoint also needs that endpoint observed.
            let endpoint = usize::from(first_red == 1 || first_red == 31);
            assert!(probed.len() <= 5 + endpoint, "{first_red}: {probed:?}");
            if endpoint == 0 {
                assert!(!probed.contains(&0) && !probed.contains(&31), "{probed:?}");
            }
        }
    }

    #[test]
    fn boundary_sizes() {
        // Two commits: the answer rests on both endpoints.
        let (outcome, probed) = search(2, 1, &[]);
        assert_eq!(outcome, SearchOutcome::FirstBad { index: 1 });
        assert_eq!(probed, vec![0, 1]);
        // Three: one probe inside, one endpoint.
        let (outcome, probed) = search(3, 1, &[]);
        assert_eq!(outcome, SearchOutcome::FirstBad { index: 1 });
        assert_eq!(probed, vec![1, 0]);
        let (outcome, _) = search(3, 2, &[]);
        assert_eq!(outcome, SearchOutcome::FirstBad { index: 2 });
    }

    #[test]
    fn endpoints_are_validated_when_the_answer_rests_on_them() {
        // Everything red: the good endpoint is red.
        assert_eq!(search(32, 0, &[]).0, SearchOutcome::GoodIsRed);
        // Everything green: the bad endpoint is green.
        assert_eq!(search(32, 99, &[]).0, SearchOutcome::BadIsGreen);
        assert_eq!(
            search(8, 0, &[0]).0,
            SearchOutcome::EndpointSkipped { index: 0 }
        );
    }

    #[test]
    fn checked_endpoints_are_probed_first_and_never_again() {
        let (outcome, probed) = search_checked(32, 18, &[], true);
        assert_eq!(outcome, SearchOutcome::FirstBad { index: 18 });
        assert_eq!(probed[..2], [0, 31]);
        assert!(probed.len() <= 7, "{probed:?}");
        // A red good endpoint stops at once, even where the middle is green.
        let (outcome, probed) = search_checked(32, 0, &[], true);
        assert_eq!(outcome, SearchOutcome::GoodIsRed);
        assert_eq!(probed, [0]);
        let (outcome, probed) = search_checked(32, 99, &[], true);
        assert_eq!(outcome, SearchOutcome::BadIsGreen);
        assert_eq!(probed, [0, 31]);
        let (outcome, _) = search_checked(32, 5, &[31], true);
        assert_eq!(outcome, SearchOutcome::EndpointSkipped { index: 31 });
    }

    #[test]
    fn skips_a_candidate_and_still_finds_the_answer() {
        // Index 23 is on the path to 18 and cannot be tested.
        let (outcome, probed) = search(32, 18, &[23]);
        assert_eq!(outcome, SearchOutcome::FirstBad { index: 18 });
        assert!(probed.contains(&23));
        assert!(probed.len() <= 6, "{probed:?}");
    }

    #[test]
    fn a_skip_next_to_the_answer_is_ambiguous() {
        // 17 untestable, 18 first red: the first bad one is 17 or 18.
        let (outcome, _) = search(32, 18, &[17]);
        assert_eq!(
            outcome,
            SearchOutcome::Ambiguous {
                candidates: vec![17, 18]
            }
        );
    }
}
