//! `densevm kernel` (not implemented yet).

use clap::Args;

/// Arguments of `densevm kernel`.
#[derive(Args, Debug)]
pub struct KernelArgs {}

/// Runs the subcommand; returns the process exit code.
pub fn main(_args: KernelArgs) -> anyhow::Result<i32> {
    anyhow::bail!("this subcommand is not implemented yet")
}
