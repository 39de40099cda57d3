//! Delta debugging (Zeller and Hildebrandt's ddmin): from a set of switches
//! that together cause a divergence, a minimal subset that still does.
//!
//! The result is 1-minimal: removing any one of its elements makes the
//! divergence go away. Tests are asked of subsets in a deterministic order, so
//! a caller that caches verdicts by subset reuses them across runs.

/// Reduces `items` (whose full set tests red) to a 1-minimal red subset.
/// `test(subset)` returns true when the subset is red. Order is preserved.
pub fn ddmin<T: Clone, E>(
    items: &[T],
    mut test: impl FnMut(&[T]) -> Result<bool, E>,
) -> Result<Vec<T>, E> {
    let mut current: Vec<T> = items.to_vec();
    let mut granularity = 2usize;
    while current.len() >= 2 {
        let chunks = split(&current, granularity);
        let mut reduced = None;
        for chunk in &chunks {
            if test(chunk)? {
                reduced = Some((chunk.clone(), 2));
                break;
            }
        }
        // With two chunks each complement is the other chunk: already asked.
        if reduced.is_none() && granularity > 2 {
            for skip in 0..chunks.len() {
                let complement: Vec<T> = chunks
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != skip)
                    .flat_map(|(_, c)| c.iter().cloned())
                    .collect();
                if test(&complement)? {
                    reduced = Some((complement, (granularity - 1).max(2)));
                    break;
                }
            }
        }
        match reduced {
            Some((next, g)) => {
                current = next;
                granularity = g;
            }
            None if granularity >= current.len() => break,
            None => granularity = (granularity * 2).min(current.len()),
        }
    }
    Ok(current)
}

/// `items` cut into `n` contiguous chunks whose sizes differ by at most one.
fn split<T: Clone>(items: &[T], n: usize) -> Vec<Vec<T>> {
    let n = n.min(items.len()).max(1);
    let (base, extra) = (items.len() / n, items.len() % n);
    let mut chunks = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let len = base + usize::from(i < extra);
        chunks.push(items[start..start + len].to_vec());
        start += len;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::convert::Infallible;

    /// ddmin over `0..n` where a subset is red when it holds all of `culprits`;
    /// returns the answer and the number of tests asked.
    fn reduce(n: usize, culprits: &[usize]) -> (Vec<usize>, usize) {
        let items: Vec<usize> = (0..n).collect();
        let mut asked = 0;
        let answer = ddmin::<_, Infallible>(&items, |subset| {
            asked += 1;
            Ok(culprits.iter().all(|c| subset.contains(c)))
        })
        .unwrap();
        (answer, asked)
    }

    #[test]
    fn names_a_pair_that_only_diverges_together() {
        assert_eq!(reduce(4, &[1, 2]).0, vec![1, 2]);
        assert_eq!(reduce(8, &[2, 5]).0, vec![2, 5]);
        assert_eq!(reduce(2, &[0, 1]).0, vec![0, 1]);
    }

    #[test]
    fn names_a_single_culprit_and_a_triple() {
        assert_eq!(reduce(7, &[6]).0, vec![6]);
        assert_eq!(reduce(9, &[0, 4, 8]).0, vec![0, 4, 8]);
        assert_eq!(reduce(1, &[0]).0, vec![0]);
    }

    #[test]
    fn result_is_one_minimal_for_any_red_rule() {
        // Red when the subset holds {1,3} or {4}: whichever ddmin lands on,
        // dropping any element must turn it green.
        let red = |s: &[usize]| {
            let s: BTreeSet<_> = s.iter().copied().collect();
            (s.contains(&1) && s.contains(&3)) || s.contains(&4)
        };
        let items: Vec<usize> = (0..6).collect();
        let answer = ddmin::<_, Infallible>(&items, |s| Ok(red(s))).unwrap();
        assert!(red(&answer));
        for i in 0..answer.len() {
            let mut less = answer.clone();
            less.remove(i);
            assert!(!red(&less), "{answer:?} is not 1-minimal");
        }
    }

    #[test]
    fn split_is_balanced() {
        assert_eq!(split(&[1, 2, 3, 4, 5], 2), vec![vec![1, 2, 3], vec![4, 5]]);
        assert_eq!(split(&[1, 2], 4), vec![vec![1], vec![2]]);
    }
}
