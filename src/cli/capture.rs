//! `taptree capture` (not implemented yet).

/// Arguments of `taptree capture`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`taptree capture` is not implemented yet")
}
