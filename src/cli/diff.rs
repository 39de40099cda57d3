//! `taptree diff` (not implemented yet).

/// Arguments of `taptree diff`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`taptree diff` is not implemented yet")
}
