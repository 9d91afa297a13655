//! `densevm ninep` (not implemented yet).

use clap::Args;

/// Arguments of `densevm ninep`.
#[derive(Args, Debug)]
pub struct NinePArgs {}

/// Runs the subcommand; returns the process exit code.
pub fn main(_args: NinePArgs) -> anyhow::Result<i32> {
    anyhow::bail!("this subcommand is not implemented yet")
}
