//! `taptree ls` (not implemented yet).

/// Arguments of `taptree ls`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`taptree ls` is not implemented yet")
}
