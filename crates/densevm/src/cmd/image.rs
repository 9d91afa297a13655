//! `densevm image` (not implemented yet).

use clap::Args;

/// Arguments of `densevm image`.
#[derive(Args, Debug)]
pub struct ImageArgs {}

/// Runs the subcommand; returns the process exit code.
pub fn main(_args: ImageArgs) -> anyhow::Result<i32> {
    anyhow::bail!("this subcommand is not implemented yet")
}
