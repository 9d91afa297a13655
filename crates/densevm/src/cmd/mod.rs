//! One module per top-level subcommand.

pub mod balloon;
pub mod clones;
pub mod console;
pub mod devices;
pub mod exec;
pub mod fleet;
pub mod image;
pub mod jail;
pub mod kernel;
pub mod launcher;
pub mod ninep;
pub mod pmem;
pub mod run;
pub mod seccomp;
pub mod tier;
pub mod vm;
pub mod vm_api;
