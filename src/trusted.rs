//! Trusted `verify A B` settled from the two manifests' heads alone: shared
//! by the `taptree` front (src/front.rs), which settles it before parsing
//! any argument, and by `verify` (src/cli/verify.rs), so that both print
//! the same bytes.

use capture::{ManifestHead, TreeReader};
use std::io::{self, Write};
use std::path::Path;

/// The head both trees share when their roots are equal, each manifest
/// checked whole against its index's sealed checksums first (both at once);
/// `Ok(None)` when the roots differ, which takes the full comparison.
pub fn identical_heads(a: &Path, b: &Path) -> capture::Result<Option<ManifestHead>> {
    let (ha, hb) = std::thread::scope(|s| {
        let ha = s.spawn(|| TreeReader::head(a));
        let hb = TreeReader::head(b);
        (ha.join().expect("a manifest head thread panicked"), hb)
    });
    let (ha, hb) = (ha?, hb?);
    Ok((ha.root == hb.root).then_some(ha))
}

/// Reports two trees whose roots are equal as identical: exit 0.
pub fn report_identical(head: &ManifestHead) -> anyhow::Result<u8> {
    crate::exit::report(crate::exit::OK, |out| print_identical(out, head))
}

/// Writes the verdict for two trees whose roots are equal.
fn print_identical(out: &mut dyn Write, head: &ManifestHead) -> io::Result<()> {
    writeln!(
        out,
        "bitwise identical: {} tensors, {} bytes, root {}",
        head.taps, head.bytes, head.root
    )?;
    writeln!(out, "(manifests trusted; --rehash rereads every tensor)")?;
    out.flush()
}
