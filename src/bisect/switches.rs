//! `bisect switches`: which runtime switches, alone or together, make a run
//! leave tolerance of the reference.
//!
//! Arms: all off (each switch at its first value), each switch alone on, all
//! on. When no single switch is red but all on is, delta debugging finds a
//! minimal culprit set; every arm it asks for goes through the same cache.

use super::ddmin::ddmin;
use super::judge::{FirstOp, Judge, JudgeError};
use super::runner::{Got, Runner, StepError, Workdir};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// One switch: an environment variable and its off and on values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Switch {
    pub name: String,
    pub off: String,
    pub on: String,
}

/// A `--switch` argument that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SwitchParseError {
    #[error("--switch {arg:?}: expected NAME=OFF,ON (for example TAPTREE_ACT_ATTN=f32,q8)")]
    Shape { arg: String },
    #[error("--switch {arg:?}: {name:?} is not an environment variable name")]
    Name { arg: String, name: String },
    #[error("--switch {arg:?}: off and on are the same value")]
    SameValues { arg: String },
    #[error("--switch {name}: given twice")]
    Duplicate { name: String },
}

impl Switch {
    /// `NAME=OFF,ON`.
    pub fn parse(arg: &str) -> Result<Switch, SwitchParseError> {
        let shape = || SwitchParseError::Shape {
            arg: arg.to_string(),
        };
        let (name, values) = arg.split_once('=').ok_or_else(shape)?;
        let values: Vec<&str> = values.split(',').collect();
        let [off, on] = values[..] else {
            return Err(shape());
        };
        let valid_name = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(SwitchParseError::Name {
                arg: arg.to_string(),
                name: name.to_string(),
            });
        }
        if off == on {
            return Err(SwitchParseError::SameValues {
                arg: arg.to_string(),
            });
        }
        Ok(Switch {
            name: name.to_string(),
            off: off.to_string(),
            on: on.to_string(),
        })
    }

    /// Parses every argument; a name given twice is an error.
    pub fn parse_all(args: &[String]) -> Result<Vec<Switch>, SwitchParseError> {
        let mut out: Vec<Switch> = Vec::new();
        for arg in args {
            let s = Switch::parse(arg)?;
            if out.iter().any(|o| o.name == s.name) {
                return Err(SwitchParseError::Duplicate { name: s.name });
            }
            out.push(s);
        }
        Ok(out)
    }
}

/// What to bisect.
#[derive(Debug, Clone)]
pub struct Request {
    pub switches: Vec<Switch>,
    pub judge: Judge,
    pub command: String,
    /// Where the command runs.
    pub cwd: PathBuf,
    /// Where arm trees are cached across runs; none: for this run only.
    pub cache: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SwitchesError {
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Judge(#[from] JudgeError),
    #[error("could not create a temporary arm cache: {0}")]
    Tempdir(std::io::Error),
}

/// Why an arm was run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmKind {
    AllOff,
    Single,
    AllOn,
    /// Asked by delta debugging.
    Ddmin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmVerdict {
    Green,
    Red,
    /// The command exited 125 for this arm: treated as not red.
    Skip,
}

/// One arm and its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchArm {
    pub kind: ArmKind,
    /// The switches on (`NAME=ON`); the others are at their off value.
    pub on: Vec<String>,
    pub verdict: ArmVerdict,
    pub cached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_op: Option<FirstOp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logits_min_cos: Option<f64>,
    /// The first op not bitwise equal to the reference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_change: Option<String>,
}

impl SwitchArm {
    /// `all off`, `all on`, or the switches on.
    pub fn label(&self) -> String {
        match self.kind {
            ArmKind::AllOff => "all off".into(),
            ArmKind::AllOn => "all on".into(),
            _ => self.on.join(" "),
        }
    }
}

/// The answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Answer {
    /// No arm leaves tolerance.
    NoDivergence,
    /// All off already diverges: the switches cannot explain it.
    BaselineRed { first_op: Option<FirstOp> },
    /// Switches that are red on their own, each with its first diverging op,
    /// the earliest in forward order first: that one causes the first
    /// divergence.
    Single { culprits: Vec<Culprit> },
    /// No switch is red alone; this minimal set is red together.
    Set { culprit: Culprit },
    /// All on could not be captured (exit 125) and no single switch is red.
    Undecided,
}

/// A set of switches and where it makes the run diverge.
#[derive(Debug, Clone, Serialize)]
pub struct Culprit {
    pub switches: Vec<String>,
    pub first_op: Option<FirstOp>,
    pub logits_min_cos: Option<f64>,
    /// The first op not bitwise equal to the reference.
    pub first_change: Option<String>,
}

/// Everything a bisect over switches found.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchesReport {
    pub switches: Vec<Switch>,
    pub reference: PathBuf,
    pub tolerance: String,
    /// In the order run: all off, singles, all on, then delta debugging's.
    pub arms: Vec<SwitchArm>,
    pub answer: Answer,
    pub captures_run: usize,
    pub cache_hits: usize,
}

/// Runs the arms; `on_arm` sees each arm as it completes (`planned` is the
/// number of arms known so far, for a progress bar).
pub fn bisect(
    req: &Request,
    mut on_arm: impl FnMut(&SwitchArm, usize),
) -> Result<SwitchesReport, SwitchesError> {
    let temp;
    let cache_dir = match &req.cache {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("taptree-arms-")
                .tempdir()
                .map_err(SwitchesError::Tempdir)?;
            temp.path().to_path_buf()
        }
    };
    let mut arms = Arms {
        req,
        runner: Runner::new(&cache_dir, &req.command),
        seen: HashMap::new(),
        arms: Vec::new(),
    };
    let n = req.switches.len();
    let mut planned = if n > 1 { n + 2 } else { 2 };
    let all: Vec<usize> = (0..n).collect();

    let off = arms.run(&[], ArmKind::AllOff, &mut on_arm, planned)?;
    if off.verdict == ArmVerdict::Red {
        return Ok(arms.report(Answer::BaselineRed {
            first_op: off.first_op,
        }));
    }
    let mut singles = Vec::new();
    for i in 0..n {
        singles.push(arms.run(&[i], ArmKind::Single, &mut on_arm, planned)?);
    }
    let all_on = if n > 1 {
        arms.run(&all, ArmKind::AllOn, &mut on_arm, planned)?
    } else {
        singles[0].clone()
    };
    let mut culprits: Vec<Culprit> = singles
        .iter()
        .filter(|a| a.verdict == ArmVerdict::Red)
        .map(culprit)
        .collect();
    // Stable: switches whose first divergences coincide keep argument order.
    culprits.sort_by_key(|c| c.first_op.as_ref().map_or(usize::MAX, |op| op.row));
    if !culprits.is_empty() {
        return Ok(arms.report(Answer::Single { culprits }));
    }
    match all_on.verdict {
        ArmVerdict::Green => return Ok(arms.report(Answer::NoDivergence)),
        ArmVerdict::Skip => return Ok(arms.report(Answer::Undecided)),
        ArmVerdict::Red => {}
    }
    let minimal = ddmin(&all, |subset: &[usize]| -> Result<bool, SwitchesError> {
        // The bar grows by the arms delta debugging adds, not by those it
        // asks again.
        if !arms.seen.contains_key(subset) {
            planned += 1;
        }
        let arm = arms.run(subset, ArmKind::Ddmin, &mut on_arm, planned)?;
        Ok(arm.verdict == ArmVerdict::Red)
    })?;
    let arm = arms.run(&minimal, ArmKind::Ddmin, &mut on_arm, planned)?;
    Ok(arms.report(Answer::Set {
        culprit: culprit(&arm),
    }))
}

fn culprit(arm: &SwitchArm) -> Culprit {
    Culprit {
        switches: arm.on.clone(),
        first_op: arm.first_op.clone(),
        logits_min_cos: arm.logits_min_cos,
        first_change: arm.first_change.clone(),
    }
}

struct Arms<'a> {
    req: &'a Request,
    runner: Runner,
    /// Arms already run in this bisect, by the set of switches on.
    seen: HashMap<Vec<usize>, SwitchArm>,
    arms: Vec<SwitchArm>,
}

impl Arms<'_> {
    /// The arm with exactly the switches `on` (indices, ascending) on.
    fn run(
        &mut self,
        on: &[usize],
        kind: ArmKind,
        on_arm: &mut impl FnMut(&SwitchArm, usize),
        planned: usize,
    ) -> Result<SwitchArm, SwitchesError> {
        if let Some(arm) = self.seen.get(on) {
            return Ok(arm.clone());
        }
        let switches = &self.req.switches;
        let env: BTreeMap<String, String> = switches
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let value = if on.contains(&i) { &s.on } else { &s.off };
                (s.name.clone(), value.clone())
            })
            .collect();
        let on_names: Vec<String> = on
            .iter()
            .map(|&i| format!("{}={}", switches[i].name, switches[i].on))
            .collect();
        // The key is the whole assignment, so it stays valid when switches
        // are added to or dropped from a later bisect.
        let assignment: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        let key = blake3::hash(assignment.as_bytes()).to_hex()[..16].to_string();
        let what = if on_names.is_empty() {
            "arm all off".to_string()
        } else {
            format!("arm {}", on_names.join(" "))
        };
        let cwd = self.req.cwd.clone();
        let got = self
            .runner
            .get(&key, &what, &env, || Ok(Workdir::Dir(cwd)))?;
        let arm = match got {
            Got::Skip { cached } => SwitchArm {
                kind,
                on: on_names,
                verdict: ArmVerdict::Skip,
                cached,
                first_op: None,
                logits_min_cos: None,
                first_change: None,
            },
            Got::Tree { path, cached } => {
                let v = self.req.judge.judge(&path)?;
                SwitchArm {
                    kind,
                    on: on_names,
                    verdict: if v.red {
                        ArmVerdict::Red
                    } else {
                        ArmVerdict::Green
                    },
                    cached,
                    first_op: v.first_op,
                    logits_min_cos: v.logits_min_cos,
                    first_change: v.first_change,
                }
            }
        };
        on_arm(&arm, planned);
        self.seen.insert(on.to_vec(), arm.clone());
        self.arms.push(arm.clone());
        Ok(arm)
    }

    fn report(self, answer: Answer) -> SwitchesReport {
        SwitchesReport {
            switches: self.req.switches.clone(),
            reference: self.req.judge.reference.clone(),
            tolerance: self.req.judge.tolerance.to_string(),
            arms: self.arms,
            answer,
            captures_run: self.runner.runs,
            cache_hits: self.runner.hits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_switches() {
        assert_eq!(
            Switch::parse("TAPTREE_ACT_ATTN=f32,q8").unwrap(),
            Switch {
                name: "TAPTREE_ACT_ATTN".into(),
                off: "f32".into(),
                on: "q8".into()
            }
        );
        assert!(matches!(
            Switch::parse("X=a"),
            Err(SwitchParseError::Shape { .. })
        ));
        assert!(matches!(
            Switch::parse("X=a,b,c"),
            Err(SwitchParseError::Shape { .. })
        ));
        assert!(matches!(
            Switch::parse("1X=a,b"),
            Err(SwitchParseError::Name { .. })
        ));
        assert!(matches!(
            Switch::parse("A-B=a,b"),
            Err(SwitchParseError::Name { .. })
        ));
        assert!(matches!(
            Switch::parse("X=a,a"),
            Err(SwitchParseError::SameValues { .. })
        ));
        // An empty off value is allowed: "unset-like" empty string.
        assert_eq!(Switch::parse("X=,1").unwrap().off, "");
        let dup = Switch::parse_all(&["X=a,b".into(), "X=c,d".into()]).unwrap_err();
        assert_eq!(dup.to_string(), "--switch X: given twice");
    }
}
