//! Measurement knobs: environment variables that set a count the kernels
//! use (tasks per thread, row parts, the chained decode's window) so that
//! a bench can try other values without a rebuild. A knob set to
//! something that is not a count in its range is said on stderr and the
//! default is used: a measurement that silently ran the default would
//! report the wrong thing.

use std::ops::RangeInclusive;
use std::sync::OnceLock;

/// A count knob: read from its variable once, on first use.
pub(crate) struct Count {
    var: &'static str,
    range: RangeInclusive<usize>,
    default: usize,
    value: OnceLock<usize>,
}

impl Count {
    /// The knob `var`: a count in `range`, `default` where unset or wrong.
    pub(crate) const fn new(
        var: &'static str,
        range: RangeInclusive<usize>,
        default: usize,
    ) -> Count {
        Count {
            var,
            range,
            default,
            value: OnceLock::new(),
        }
    }

    /// The knob's count ([`count`] of its variable, read the first time).
    pub(crate) fn get(&self) -> usize {
        *self
            .value
            .get_or_init(|| count(self.var, self.range.clone(), self.default))
    }
}

/// The count in environment variable `var` if it holds one in `range`,
/// else `default` (with a warning on stderr where `var` is set).
fn count(var: &str, range: RangeInclusive<usize>, default: usize) -> usize {
    let value = std::env::var(var).ok();
    let (n, warning) = parse(var, value.as_deref(), range, default);
    if let Some(w) = warning {
        eprintln!("{w}");
    }
    n
}

/// [`count`] of the value `value` (`None`: unset), and what to say of it.
fn parse(
    var: &str,
    value: Option<&str>,
    range: RangeInclusive<usize>,
    default: usize,
) -> (usize, Option<String>) {
    let Some(v) = value else {
        return (default, None);
    };
    match v.parse::<usize>() {
        Ok(n) if range.contains(&n) => (n, None),
        _ => (
            default,
            Some(format!(
                "taptree: {var}={v:?}: expected a count from {} to {}; using {default}",
                range.start(),
                range.end()
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_knob_outside_its_range_is_said_and_the_default_used() {
        assert_eq!(parse("K", None, 1..=64, 8), (8, None));
        assert_eq!(parse("K", Some("1"), 1..=64, 8), (1, None));
        assert_eq!(parse("K", Some("64"), 1..=64, 8), (64, None));
        for bad in ["0", "65", "-1", "", "two", " 3"] {
            let (n, warning) = parse("K", Some(bad), 1..=64, 8);
            assert_eq!(n, 8, "{bad:?}");
            let w = warning.unwrap_or_default();
            assert!(
                w.contains("K=") && w.contains("1 to 64") && w.contains("using 8"),
                "{bad:?}: {w}"
            );
        }
    }
}
