//! The `tree` target's resealing: an edited manifest written back into its
//! tree as a writer would write it, every hash, the seal and the index
//! redone, so that only what the edits mean is left to catch.

use capture::{manifest, Manifest};
use std::path::Path;

/// Writes `m` into `tree` as a writer would, every hash redone: the
/// directory hashes and root from the entries, the manifest in the
/// writer's field order (its head first) and sealed, and its index
/// rewritten (or removed, for a version without one). A tree with ranks
/// is written as format 2.2, as a writer writes it (its index would hold no
/// rank); what it was written as is returned. `Err` where the edited
/// manifest cannot be written at all (an index cannot hold it).
pub fn reseal(tree: &Path, m: &mut Manifest) -> Result<String, String> {
    let ranked = m
        .entries
        .iter()
        .any(|e| e.key.rank.is_some() || e.key.shard.is_some());
    if ranked && capture::index::has_index(&m.format_version) {
        m.format_version = manifest::FORMAT_VERSION_RANKED.to_string();
    }
    let (dirs, root) = m.hashes();
    m.dirs = dirs;
    m.root = root;
    let bytes = m
        .entries
        .iter()
        .map(|e| e.bytes)
        .fold(0u64, u64::wrapping_add);
    let text = format!(
        "{{\"format\":{},\"format_version\":{},\"root\":{},\"taps\":{},\"bytes\":{bytes},\"manifest_blake3\":\"{}\",\"run\":{},\"selection\":{},\"stages\":{},\"dirs\":{},\"entries\":{}}}\n",
        json(&m.format),
        json(&m.format_version),
        json(&m.root),
        m.entries.len(),
        manifest::UNSEALED,
        json(&m.run),
        json(&m.selection),
        json(&m.stages),
        json(&m.dirs),
        json(&m.entries),
    );
    let mut text = text.into_bytes();
    if !manifest::seal(&mut text) {
        return Err("no manifest_blake3 to seal".into());
    }
    std::fs::write(tree.join(manifest::MANIFEST_FILE), &text).map_err(|e| e.to_string())?;
    let index = tree.join(capture::index::INDEX_FILE);
    if capture::index::has_index(&m.format_version) {
        capture::index::rewrite(tree).map_err(|e| e.to_string())?;
    } else {
        match std::fs::remove_file(&index) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.to_string()),
            _ => {}
        }
    }
    Ok(format!("written as format {}", m.format_version))
}

/// A manifest field as JSON text (the manifest's own types always serialize).
fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("the manifest's types serialize")
}
