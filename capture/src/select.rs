//! Which taps a capture keeps: `stage=ffn_*;layer=20..30;pos=0`.
//!
//! Grammar: clauses separated by `;`, each `field=value[,value...]`.
//!
//! - `stage=` globs over stage names (`*` any run, `?` one character).
//! - `layer=`, `pos=`, `slot=` take `N`, `A..B` (half-open), `A..=B`, `A..`
//!   or `..B`. `layer=none` selects the global stages (embedding, logits),
//!   `slot=none` the taps of an unbatched forward.
//!
//! A field that is not named selects everything; a named field is a filter,
//! so `layer=29` keeps only layer 29 (add `none` to keep the global stages).
//! The empty string, `all` and `*` select everything. Anything malformed is an
//! error quoting the bad part: a typo never silently selects nothing.

use crate::error::{Error, Result};
use crate::key::TapId;
use std::fmt;
use std::ops::Range;

/// A parsed selection. `Selection::all()` keeps every tap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    text: String,
    stages: Option<Vec<String>>,
    layers: Option<Numbers>,
    pos: Option<Vec<Range<u32>>>,
    slots: Option<Numbers>,
}

/// Ranges of numbers plus, for `layer` and `slot`, whether "none" is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Numbers {
    ranges: Vec<Range<u32>>,
    none: bool,
}

impl Numbers {
    fn matches(&self, value: Option<u32>) -> bool {
        match value {
            None => self.none,
            Some(v) => self.ranges.iter().any(|r| r.contains(&v)),
        }
    }
}

impl Default for Selection {
    fn default() -> Self {
        Selection::all()
    }
}

impl Selection {
    /// Keeps every tap.
    pub fn all() -> Selection {
        Selection {
            text: String::new(),
            stages: None,
            layers: None,
            pos: None,
            slots: None,
        }
    }

    /// Whether this selection keeps every tap.
    pub fn is_all(&self) -> bool {
        self.stages.is_none() && self.layers.is_none() && self.pos.is_none() && self.slots.is_none()
    }

    /// Parses the selection grammar (see the module docs).
    pub fn parse(input: &str) -> Result<Selection> {
        let mut sel = Selection::all();
        sel.text = input.trim().to_string();
        let trimmed = input.trim();
        if trimmed.is_empty() || trimmed == "all" || trimmed == "*" {
            return Ok(sel);
        }
        let err = |part: &str, reason: String| Error::Selection {
            input: input.to_string(),
            part: part.to_string(),
            reason,
        };
        for clause in trimmed.split(';') {
            let clause = clause.trim();
            if clause.is_empty() {
                continue;
            }
            let Some((field, values)) = clause.split_once('=') else {
                return Err(err(
                    clause,
                    "expected field=value (fields: stage, layer, pos, slot)".into(),
                ));
            };
            let field = field.trim();
            let values: Vec<&str> = values.split(',').map(str::trim).collect();
            if values.iter().any(|v| v.is_empty()) {
                return Err(err(clause, "empty value".into()));
            }
            let duplicate = match field {
                "stage" => sel.stages.is_some(),
                "layer" => sel.layers.is_some(),
                "pos" => sel.pos.is_some(),
                "slot" => sel.slots.is_some(),
                _ => {
                    return Err(err(
                        field,
                        "unknown field (expected stage, layer, pos or slot)".into(),
                    ))
                }
            };
            if duplicate {
                return Err(err(clause, format!("field {field:?} given twice")));
            }
            match field {
                "stage" => {
                    for v in &values {
                        if let Some(c) = v
                            .chars()
                            .find(|c| !(c.is_ascii_alphanumeric() || "_-.*?".contains(*c)))
                        {
                            return Err(err(
                                v,
                                format!("character {c:?} is not allowed in a stage glob"),
                            ));
                        }
                    }
                    sel.stages = Some(values.iter().map(|v| v.to_string()).collect());
                }
                "pos" => {
                    let mut ranges = Vec::new();
                    for v in &values {
                        ranges.push(parse_range(v).map_err(|reason| err(v, reason))?);
                    }
                    sel.pos = Some(ranges);
                }
                _ => {
                    let mut numbers = Numbers {
                        ranges: Vec::new(),
                        none: false,
                    };
                    for v in &values {
                        if *v == "none" {
                            numbers.none = true;
                        } else {
                            numbers
                                .ranges
                                .push(parse_range(v).map_err(|reason| err(v, reason))?);
                        }
                    }
                    if field == "layer" {
                        sel.layers = Some(numbers);
                    } else {
                        sel.slots = Some(numbers);
                    }
                }
            }
        }
        Ok(sel)
    }

    /// The stage globs that match none of `names` (a misspelt stage): a
    /// selection holding one selects nothing under that glob.
    pub fn unmatched_stage_globs<'a>(&'a self, names: &[&str]) -> Vec<&'a str> {
        self.stages
            .iter()
            .flatten()
            .filter(|g| !names.iter().any(|n| glob_match(g.as_bytes(), n.as_bytes())))
            .map(String::as_str)
            .collect()
    }

    /// Whether a tap with this identity has at least one selected row.
    pub fn wants(&self, id: TapId<'_>) -> bool {
        self.matches_identity(id) && self.selected_runs(id.pos()).next().is_some()
    }

    /// Stage, layer and slot filters (everything but positions).
    pub fn matches_identity(&self, id: TapId<'_>) -> bool {
        let TapId {
            stage, layer, slot, ..
        } = id;
        if let Some(globs) = &self.stages {
            if !globs
                .iter()
                .any(|g| glob_match(g.as_bytes(), stage.as_bytes()))
            {
                return false;
            }
        }
        if let Some(layers) = &self.layers {
            if !layers.matches(layer) {
                return false;
            }
        }
        if let Some(slots) = &self.slots {
            if !slots.matches(slot) {
                return false;
            }
        }
        true
    }

    /// The maximal runs of selected positions within `pos`, in order: a
    /// multi-row tap is sliced into one tap per run.
    pub fn selected_runs(&self, pos: Range<u32>) -> impl Iterator<Item = Range<u32>> + '_ {
        let mut next = pos.start;
        std::iter::from_fn(move || {
            let Some(ranges) = &self.pos else {
                if next < pos.end {
                    let run = next..pos.end;
                    next = pos.end;
                    return Some(run);
                }
                return None;
            };
            while next < pos.end {
                if ranges.iter().any(|r| r.contains(&next)) {
                    let start = next;
                    while next < pos.end && ranges.iter().any(|r| r.contains(&next)) {
                        next += 1;
                    }
                    return Some(start..next);
                }
                next += 1;
            }
            None
        })
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_all() {
            f.write_str("all")
        } else {
            f.write_str(&self.text)
        }
    }
}

fn parse_range(v: &str) -> std::result::Result<Range<u32>, String> {
    let num = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| format!("{s:?} is not a non-negative integer"))
    };
    let range = if let Some((a, b)) = v.split_once("..=") {
        let start = if a.is_empty() { 0 } else { num(a)? };
        let end = num(b)?;
        start..end.checked_add(1).ok_or("range end overflows")?
    } else if let Some((a, b)) = v.split_once("..") {
        let start = if a.is_empty() { 0 } else { num(a)? };
        let end = if b.is_empty() { u32::MAX } else { num(b)? };
        start..end
    } else {
        let n = num(v)?;
        n..n.checked_add(1).ok_or("value overflows")?
    };
    if range.is_empty() {
        return Err("empty range (ranges are half-open: A..B keeps A up to B-1)".into());
    }
    Ok(range)
}

/// `*` matches any run (including none), `?` exactly one byte.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_selects_everything() {
        for s in ["", "all", "*", "  "] {
            let sel = Selection::parse(s).unwrap();
            assert!(sel.is_all());
            assert!(sel.wants(TapId::new("anything", None, 0..1, None)));
        }
    }

    #[test]
    fn the_example_from_the_docs() {
        let sel = Selection::parse("stage=ffn_*;layer=20..30;pos=0").unwrap();
        assert!(sel.wants(TapId::new("ffn_down", Some(20), 0..1, None)));
        assert!(sel.wants(TapId::new("ffn_up", Some(29), 0..7, None)));
        assert!(
            !sel.wants(TapId::new("ffn_up", Some(30), 0..1, None)),
            "30 is past the half-open end"
        );
        assert!(!sel.wants(TapId::new("ffn_up", Some(19), 0..1, None)));
        assert!(!sel.wants(TapId::new("attn_norm", Some(25), 0..1, None)));
        assert!(
            !sel.wants(TapId::new("ffn_up", Some(25), 1..7, None)),
            "position 0 is not in 1..7"
        );
        assert!(
            !sel.wants(TapId::new("logits", None, 0..1, None)),
            "a layer filter drops global stages"
        );
    }

    #[test]
    fn none_keeps_global_stages_and_unbatched_taps() {
        let sel = Selection::parse("layer=none,3;slot=none").unwrap();
        assert!(sel.wants(TapId::new("logits", None, 0..1, None)));
        assert!(sel.wants(TapId::new("q_proj", Some(3), 0..1, None)));
        assert!(!sel.wants(TapId::new("q_proj", Some(3), 0..1, Some(0))));
        assert!(!sel.wants(TapId::new("q_proj", Some(4), 0..1, None)));
    }

    #[test]
    fn range_forms() {
        assert_eq!(parse_range("5").unwrap(), 5..6);
        assert_eq!(parse_range("2..4").unwrap(), 2..4);
        assert_eq!(parse_range("2..=4").unwrap(), 2..5);
        assert_eq!(parse_range("..3").unwrap(), 0..3);
        assert_eq!(parse_range("7..").unwrap(), 7..u32::MAX);
        assert!(parse_range("4..4").is_err());
        assert!(parse_range("5..2").is_err());
        assert!(parse_range("x").is_err());
        assert!(parse_range("4294967295..=4294967295").is_err());
    }

    #[test]
    fn malformed_selections_quote_the_bad_part() {
        let cases = [
            ("stage=ffn_*;lyr=3", "\"lyr\""),
            ("layer=3..x", "\"3..x\""),
            ("stage=ffn_*;garbage", "\"garbage\""),
            ("pos=", "\"pos=\""),
            ("layer=1;layer=2", "\"layer=2\""),
            ("stage=ffn/down", "\"ffn/down\""),
            ("pos=3..3", "\"3..3\""),
        ];
        for (input, part) in cases {
            let msg = Selection::parse(input).unwrap_err().to_string();
            assert!(msg.contains(part), "{input}: {msg} should quote {part}");
            assert!(msg.starts_with("selection "), "{msg}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"ffn_*", b"ffn_down"));
        assert!(glob_match(b"*_proj", b"q_proj"));
        assert!(glob_match(b"?_proj", b"k_proj"));
        assert!(!glob_match(b"?_proj", b"kk_proj"));
        assert!(glob_match(b"*", b""));
        assert!(glob_match(b"a*b*c", b"axxbyyc"));
        assert!(!glob_match(b"a*b*c", b"axxbyy"));
        assert!(!glob_match(b"ffn_*", b"attn"));
    }

    #[test]
    fn position_runs_slice_a_batched_tap() {
        let sel = Selection::parse("pos=0,2..4,6").unwrap();
        let runs: Vec<_> = sel.selected_runs(0..8).collect();
        assert_eq!(runs, vec![0..1, 2..4, 6..7]);
        let runs: Vec<_> = sel.selected_runs(3..6).collect();
        assert_eq!(runs, vec![3..4]);
        assert_eq!(sel.selected_runs(4..6).count(), 0);
        let all = Selection::all();
        assert_eq!(all.selected_runs(3..9).collect::<Vec<_>>(), vec![3..9]);
        assert_eq!(all.selected_runs(3..3).count(), 0);
    }
}
