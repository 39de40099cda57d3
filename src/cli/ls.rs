//! `taptree ls TREE`: the taps of a tree in forward order.

use capture::{Selection, TreeReader};
use std::path::PathBuf;

/// List a tree's taps in forward order: key, dtype, shape, short hash.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tree (a directory written by a capture).
    pub tree: PathBuf,
    /// Only taps matching this selection (`stage=ffn_*;layer=20..30;pos=0`);
    /// a multi-position tap is listed when any of its positions matches.
    #[arg(long, value_name = "SELECTION")]
    pub select: Option<String>,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let selection = match &args.select {
        Some(s) => Selection::parse(s)?,
        None => Selection::all(),
    };
    let tree = TreeReader::open(&args.tree)?;
    let m = tree.manifest();
    let shown: Vec<_> = m
        .entries
        .iter()
        .filter(|e| selection.wants(e.key.id()))
        .collect();
    if shown.is_empty() && !m.entries.is_empty() && !selection.is_all() {
        let mut stages: Vec<&str> = m.entries.iter().map(|e| e.key.stage.as_str()).collect();
        stages.sort_unstable();
        stages.dedup();
        anyhow::bail!(
            "{}: --select {:?} matches no tap of this tree (its stages: {})",
            args.tree.display(),
            selection.to_string(),
            stages.join(", ")
        );
    }
    if args.json {
        let entries: Vec<_> = shown
            .iter()
            .map(|e| {
                serde_json::json!({
                    "key": e.key.to_string(),
                    "stage": e.key.stage,
                    "layer": e.key.layer,
                    "pos": [e.key.pos.start, e.key.pos.end],
                    "slot": e.key.slot,
                    "dtype": e.dtype,
                    "shape": e.shape,
                    "blake3": e.blake3,
                    "bytes": e.bytes,
                    "path": e.path,
                })
            })
            .collect();
        let out = serde_json::json!({
            "tree": args.tree,
            "format_version": m.format_version,
            "root": m.root,
            "taps": m.entries.len(),
            "bytes": m.bytes_of_entries(),
            "run": m.run,
            "entries": entries,
        });
        return crate::exit::report(crate::exit::OK, |w| crate::exit::json(w, &out));
    }
    let mut describe = vec![
        m.run.backend.as_str(),
        m.run.precision.as_str(),
        m.run.model.as_str(),
    ];
    describe.retain(|s| !s.is_empty());
    let mut out = format!(
        "{}: {} taps, {} bytes, root {} (format {}{}{})\n",
        args.tree.display(),
        m.entries.len(),
        m.bytes_of_entries(),
        m.root,
        m.format_version,
        if describe.is_empty() { "" } else { "; " },
        describe.join(" ")
    );
    let keys: Vec<String> = shown.iter().map(|e| e.key.to_string()).collect();
    let shapes: Vec<String> = shown.iter().map(|e| format!("{:?}", e.shape)).collect();
    let key_w = keys.iter().map(String::len).max().unwrap_or(0);
    let shape_w = shapes.iter().map(String::len).max().unwrap_or(0);
    for ((e, key), shape) in shown.iter().zip(&keys).zip(&shapes) {
        out.push_str(&format!(
            "{key:<key_w$}  {:<4}  {shape:<shape_w$}  {}\n",
            e.dtype.name(),
            &e.blake3[..e.blake3.len().min(12)]
        ));
    }
    if shown.len() < m.entries.len() {
        out.push_str(&format!(
            "({} of {} taps shown)\n",
            shown.len(),
            m.entries.len()
        ));
    }
    crate::exit::report(crate::exit::OK, |w| w.write_all(out.as_bytes()))
}
