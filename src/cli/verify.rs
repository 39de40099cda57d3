//! `taptree verify` (not implemented yet).

/// Arguments of `taptree verify`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`taptree verify` is not implemented yet")
}
