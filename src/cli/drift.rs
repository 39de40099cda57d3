//! `taptree drift` (not implemented yet).

/// Arguments of `taptree drift`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`taptree drift` is not implemented yet")
}
