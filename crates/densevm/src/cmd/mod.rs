//! One module per top-level subcommand.

pub mod image;
pub mod kernel;
pub mod ninep;
pub mod run;
