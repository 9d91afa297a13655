//! `densevm fleet`: a host daemon that runs many densevm VMs, each its own `densevm run`
//! process, and moves memory between them and the host through their balloons.
//!
//! - [`policy`]: the memory policy, a pure function of the host, the VMs and the state
//!   carried between ticks (docs/fleet.md has the rules and their numbers).
pub mod policy;
