//! `taptree stat TREE [--at KEY]`: range, top dimensions, crushed blocks.

use crate::exit;
use capture::TreeReader;
use diff::controls::At;
use std::path::PathBuf;

/// Statistics of a tree's taps: range, top dimensions, crushed blocks.
///
/// Per tap and position: min, max, mean, std, the dimensions of largest |x|,
/// and per block of 256 (and 32) elements the ratio of the largest |x| to the
/// second largest. A block is "crushed" at a ratio of 8 or more: 8-bit
/// per-block quantization then leaves every other value of the block at most
/// 16 levels. This is the evidence for quantization error on outlier tokens.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tree.
    pub tree: PathBuf,
    /// Only this tap or position: `L3/ffn_down`, `L3/ffn_down@0`, `logits@2`.
    #[arg(long, value_name = "KEY")]
    pub at: Option<String>,
    /// JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let at = match &args.at {
        Some(s) => Some(s.parse::<At>().map_err(|_| {
            anyhow::anyhow!("--at {s:?}: expected a key like L3/ffn_down@2 or logits")
        })?),
        None => None,
    };
    let tree = TreeReader::open(&args.tree)?;
    let stat = diff::stat::stat(&tree, at.as_ref())?;
    let text = if args.json {
        diff::render::json::render_stat(&stat)
    } else {
        diff::render::table::render_stat(&stat)
    };
    exit::report(exit::OK, |w| w.write_all(text.as_bytes()))
}
