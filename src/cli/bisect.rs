//! `taptree bisect` (not implemented yet).

/// Arguments of `taptree bisect`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`taptree bisect` is not implemented yet")
}
