//! `taptree stat` (not implemented yet).

/// Arguments of `taptree stat`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`taptree stat` is not implemented yet")
}
