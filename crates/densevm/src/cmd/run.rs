//! `densevm run`: build a VM from the command line and run it.

use clap::Args;

/// Arguments of `densevm run`.
#[derive(Args, Debug)]
pub struct RunArgs {}

/// Runs the VM; returns the guest-requested exit code.
pub fn main(_args: RunArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
