//! Tolerance expressions: when two tensors count as agreeing.
//!
//! Grammar (`&` binds tighter than `|`, as in Rust; parentheses group):
//!
//! ```text
//! expr  := and ('|' and)*
//! and   := atom ('&' atom)*
//! atom  := '(' expr ')' | 'bitwise' | METRIC OP NUMBER
//! OP    := '<=' | '>=' | '<' | '>' | '=='
//! METRIC:= cos | abs | rel | rmse | nmse | sqnr | ulp | eq | argmax
//! ```
//!
//! `eq` is the fraction of bitwise-equal elements, `argmax` the fraction of
//! rows whose argmax agrees; `bitwise` means every element bitwise equal.
//! Whatever the expression, a NaN/Inf mismatch is red, and an undefined
//! metric (ULP across different dtypes) fails its comparison.
//!
//! The default is [`DEFAULT`]: `cos>=0.999 & nmse<=1e-4`. Cosine alone is
//! blind to scale (x and 1.03·x have cosine 1); NMSE ≤ 1e-4 is a relative
//! RMS error of at most 1%, so a magnitude error of a few percent fails, while
//! 8-bit activation quantization of well-behaved rows (NMSE about 1e-5) passes.

use crate::metrics::{Degeneracy, Metrics};
use std::fmt;

/// The tolerance used when none is given.
pub const DEFAULT: &str = "cos>=0.999 & nmse<=1e-4";

/// A parse error; `part` is the offending piece of `input`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tolerance {input:?}: {part:?}: {reason}")]
pub struct ParseError {
    /// The whole expression as given.
    pub input: String,
    /// The piece that failed.
    pub part: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A metric a tolerance expression compares (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// `cos`: cosine similarity.
    Cos,
    /// `abs`: max absolute difference.
    Abs,
    /// `rel`: max relative difference.
    Rel,
    /// `rmse`: root mean square error.
    Rmse,
    /// `nmse`: error energy over A's energy.
    Nmse,
    /// `sqnr`: `−10 log10(nmse)`, dB.
    Sqnr,
    /// `ulp`: max ULP distance; undefined across dtypes.
    Ulp,
    /// `eq`: the fraction of bitwise-equal elements.
    Eq,
    /// `argmax`: the fraction of rows whose argmax agrees.
    Argmax,
}

impl Metric {
    const ALL: [(&'static str, Metric); 9] = [
        ("cos", Metric::Cos),
        ("abs", Metric::Abs),
        ("rel", Metric::Rel),
        ("rmse", Metric::Rmse),
        ("nmse", Metric::Nmse),
        ("sqnr", Metric::Sqnr),
        ("ulp", Metric::Ulp),
        ("eq", Metric::Eq),
        ("argmax", Metric::Argmax),
    ];

    /// The metric's name in a tolerance (`cos`, `nmse`, ...).
    pub fn name(self) -> &'static str {
        Metric::ALL.iter().find(|(_, m)| *m == self).unwrap().0
    }

    /// The metric's value, None where it is undefined.
    pub fn value(self, m: &Metrics) -> Option<f64> {
        Some(match self {
            Metric::Cos => m.cos,
            Metric::Abs => m.max_abs,
            Metric::Rel => m.max_rel,
            Metric::Rmse => m.rmse,
            Metric::Nmse => m.nmse,
            Metric::Sqnr => m.sqnr_db,
            Metric::Ulp => m.max_ulp? as f64,
            Metric::Eq => {
                if m.n == 0 {
                    1.0
                } else {
                    m.bitwise_equal as f64 / m.n as f64
                }
            }
            Metric::Argmax => {
                if m.rows == 0 {
                    1.0
                } else {
                    m.argmax_agree as f64 / m.rows as f64
                }
            }
        })
    }
}

/// A comparison operator of a tolerance expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<=`: the metric is at most the number.
    Le,
    /// `>=`: the metric is at least the number.
    Ge,
    /// `<`: the metric is below the number.
    Lt,
    /// `>`: the metric is above the number.
    Gt,
    /// `==`: the metric equals the number exactly.
    Eq,
}

impl Op {
    /// The operator as written (`<=`, `>=`, ...).
    pub fn text(self) -> &'static str {
        match self {
            Op::Le => "<=",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Gt => ">",
            Op::Eq => "==",
        }
    }
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// `bitwise`: every element bitwise equal.
    Bitwise,
    /// `METRIC OP NUMBER`.
    Cmp(Metric, Op, f64),
    /// Every term holds (`&`).
    And(Vec<Expr>),
    /// Some term holds (`|`).
    Or(Vec<Expr>),
}

/// A tolerance: the expression and the text it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Tolerance {
    text: String,
    expr: Expr,
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Default for Tolerance {
    fn default() -> Tolerance {
        Tolerance::parse(DEFAULT).expect("the default tolerance parses")
    }
}

impl Tolerance {
    /// Exact agreement: every element bitwise equal.
    pub fn bitwise() -> Tolerance {
        Tolerance {
            text: "bitwise".into(),
            expr: Expr::Bitwise,
        }
    }

    /// Parses the grammar of the module doc; the error names the offending piece.
    pub fn parse(input: &str) -> Result<Tolerance, ParseError> {
        let mut p = Parser {
            input,
            pos: 0,
            depth: 0,
        };
        p.skip_ws();
        if p.pos == input.len() {
            return Err(p.error(input, "empty tolerance"));
        }
        let expr = p.or()?;
        p.skip_ws();
        if p.pos != input.len() {
            let rest = &input[p.pos..];
            return Err(p.error(rest, "unexpected text (combine with & or |)"));
        }
        Ok(Tolerance {
            text: input.trim().to_string(),
            expr,
        })
    }

    /// The parsed expression.
    pub fn expr(&self) -> &Expr {
        &self.expr
    }

    /// Whether `m` is within tolerance. A NaN/Inf mismatch never is.
    pub fn passes(&self, m: &Metrics) -> bool {
        m.nonfinite_mismatch == 0 && eval(&self.expr, m)
    }

    /// The comparisons that fail on `m` (`nmse=3.1e-3 > 1e-4`), for the report.
    pub fn failing(&self, m: &Metrics) -> Vec<Reason> {
        let mut out = Vec::new();
        if m.nonfinite_mismatch > 0 {
            out.push(Reason::NonfiniteMismatch {
                elements: m.nonfinite_mismatch,
            });
        }
        collect_failing(&self.expr, m, &mut out);
        out
    }
}

fn eval(e: &Expr, m: &Metrics) -> bool {
    match e {
        Expr::Bitwise => m.bitwise(),
        Expr::Cmp(metric, op, t) => match metric.value(m) {
            None => false,
            Some(v) => match op {
                Op::Le => v <= *t,
                Op::Ge => v >= *t,
                Op::Lt => v < *t,
                Op::Gt => v > *t,
                Op::Eq => v == *t,
            },
        },
        Expr::And(xs) => xs.iter().all(|x| eval(x, m)),
        Expr::Or(xs) => xs.iter().any(|x| eval(x, m)),
    }
}

fn collect_failing(e: &Expr, m: &Metrics, out: &mut Vec<Reason>) {
    if eval(e, m) {
        return;
    }
    match e {
        Expr::Bitwise => out.push(Reason::NotBitwise {
            differ: m.n - m.bitwise_equal,
            of: m.n,
        }),
        Expr::Cmp(metric, op, t) => match metric.value(m) {
            None => out.push(Reason::Undefined { metric: *metric }),
            Some(v) => out.push(Reason::Fails {
                metric: *metric,
                value: v,
                op: *op,
                bound: *t,
            }),
        },
        Expr::And(xs) | Expr::Or(xs) => xs.iter().for_each(|x| collect_failing(x, m, out)),
    }
}

/// Four significant digits, the way the table prints numbers.
pub fn short(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        format!("{v}")
    } else if (1e-3..1e5).contains(&v.abs()) {
        let digits = (3 - v.abs().log10().floor() as i32).max(0) as usize;
        format!("{v:.digits$}")
    } else {
        format!("{v:.3e}")
    }
}

struct Parser<'a> {
    input: &'a str,
    pos: usize,
    /// Parentheses open at `pos`: bounded, so that no input can exhaust
    /// the stack of this parser or of the evaluation of what it builds.
    depth: usize,
}

/// How deep parentheses may nest in a tolerance.
pub const MAX_DEPTH: usize = 32;

impl<'a> Parser<'a> {
    fn error(&self, part: &str, reason: &str) -> ParseError {
        // The message stays one readable line whatever the input's length.
        let clip = |s: &str| match s.char_indices().nth(60) {
            Some((end, _)) => format!("{}...", &s[..end]),
            None => s.to_string(),
        };
        ParseError {
            input: clip(self.input),
            part: clip(part),
            reason: reason.to_string(),
        }
    }

    fn skip_ws(&mut self) {
        while self.rest().starts_with(char::is_whitespace) {
            self.pos += self.rest().chars().next().unwrap().len_utf8();
        }
    }

    fn rest(&self) -> &'a str {
        &self.input[self.pos..]
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Result<Expr, ParseError> {
        let mut xs = vec![self.and()?];
        while self.eat("|") {
            // `||` reads the same as `|`.
            self.eat("|");
            xs.push(self.and()?);
        }
        Ok(if xs.len() == 1 {
            xs.pop().unwrap()
        } else {
            Expr::Or(xs)
        })
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let mut xs = vec![self.atom()?];
        while self.eat("&") {
            self.eat("&");
            xs.push(self.atom()?);
        }
        Ok(if xs.len() == 1 {
            xs.pop().unwrap()
        } else {
            Expr::And(xs)
        })
    }

    fn atom(&mut self) -> Result<Expr, ParseError> {
        self.skip_ws();
        if self.eat("(") {
            let start = self.pos;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                let part = &self.input[start - 1..];
                let part = &part[..part.len().min(40)];
                return Err(self.error(
                    part,
                    &format!("parentheses nested more than {MAX_DEPTH} deep"),
                ));
            }
            let e = self.or()?;
            self.depth -= 1;
            if !self.eat(")") {
                let part = &self.input[start.saturating_sub(1)..];
                return Err(self.error(part, "unclosed parenthesis"));
            }
            return Ok(e);
        }
        let start = self.pos;
        let word_len = self
            .rest()
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(self.rest().len());
        let word = &self.rest()[..word_len];
        if word.is_empty() {
            let part = self.rest().split(['&', '|']).next().unwrap_or("");
            let part = if part.trim().is_empty() {
                self.rest()
            } else {
                part
            };
            return Err(self.error(
                part.trim(),
                "expected a metric (cos, abs, rel, rmse, nmse, sqnr, ulp, eq, argmax) or `bitwise`",
            ));
        }
        self.pos += word_len;
        if word == "bitwise" {
            return Ok(Expr::Bitwise);
        }
        let atom_text = || {
            let tail = &self.input[start..];
            tail.split(['&', '|', ')'])
                .next()
                .unwrap_or(tail)
                .trim()
                .to_string()
        };
        let Some(&(_, metric)) = Metric::ALL.iter().find(|(n, _)| *n == word) else {
            return Err(self.error(&atom_text(), &format!("unknown metric {word:?} (known: cos, abs, rel, rmse, nmse, sqnr, ulp, eq, argmax, bitwise)")));
        };
        self.skip_ws();
        let op = [
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("==", Op::Eq),
            ("<", Op::Lt),
            (">", Op::Gt),
        ]
        .into_iter()
        .find(|(t, _)| self.rest().starts_with(t));
        let Some((op_text, op)) = op else {
            return Err(self.error(&atom_text(), "expected <=, >=, <, > or == after the metric"));
        };
        self.pos += op_text.len();
        self.skip_ws();
        let num_len = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+'))
            .unwrap_or(self.rest().len());
        let num = &self.rest()[..num_len];
        let value: f64 = num
            .parse()
            .map_err(|_| self.error(&atom_text(), &format!("{num:?} is not a number")))?;
        if value.is_nan() {
            return Err(self.error(&atom_text(), "NaN is not a threshold"));
        }
        self.pos += num_len;
        Ok(Expr::Cmp(metric, op, value))
    }
}

/// Why a row is not green, as values; [`crate::render::reason`] words it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// A and B rows have different shapes (each without its position axis).
    ShapeMismatch {
        /// A's row shape.
        a: Vec<usize>,
        /// B's row shape.
        b: Vec<usize>,
    },
    /// The dtypes differ, and are not both float.
    DtypeMismatch {
        /// A's dtype.
        a: capture::DType,
        /// B's dtype.
        b: capture::DType,
    },
    /// At the worst position, elements nonfinite on one side only.
    NonfiniteMismatch {
        /// How many.
        elements: u64,
    },
    /// The tolerance is `bitwise` and elements differ.
    NotBitwise {
        /// Elements not bitwise equal.
        differ: u64,
        /// Elements compared.
        of: u64,
    },
    /// A comparison of the tolerance whose metric is undefined (dtypes differ).
    Undefined {
        /// The metric.
        metric: Metric,
    },
    /// A comparison of the tolerance that fails at the worst position.
    Fails {
        /// The metric.
        metric: Metric,
        /// Its value there.
        value: f64,
        /// The comparison.
        op: Op,
        /// The bound it fails.
        bound: f64,
    },
    /// Within tolerance, but a side is degenerate at this position.
    Degenerate {
        /// The position.
        pos: u32,
        /// Its slot.
        slot: Option<u32>,
        /// How A is degenerate there, if it is.
        a: Option<Degeneracy>,
        /// How B is degenerate there, if it is.
        b: Option<Degeneracy>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_parentheses_are_an_error_not_a_stack_overflow() {
        let deep = format!("{}cos>=0.9{}", "(".repeat(20_000), ")".repeat(20_000));
        let err = Tolerance::parse(&deep).unwrap_err();
        assert!(err.reason.contains("nested more than"), "{err}");
        assert!(err.to_string().len() < 300, "{err}");
        let ok = format!("{}cos>=0.9{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        Tolerance::parse(&ok).unwrap();
        let unclosed = "(".repeat(20_000);
        assert!(Tolerance::parse(&unclosed).is_err());
    }
}
