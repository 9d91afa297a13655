//! `densevm fleet`: a host daemon that runs many densevm VMs, each its own `densevm run`
//! process, and moves memory between them and the host through their balloons
//! (docs/fleet.md).
//!
//! - [`policy`]: the memory policy, a pure function of the host, the VMs and the state
//!   carried between ticks (the rules and their numbers are in its docs).
//! - [`registry`]: the VMs: create, list, inspect, change, delete; reaping; adoption of
//!   VMs an earlier daemon started.
//! - [`spec`]: a create request's checks and the `densevm run` arguments it becomes.
//! - [`launcher`]: starting a VM ([`launcher::ProcessLauncher`] runs `densevm run`; tests
//!   use fakes).
//! - [`cgroup`]: cgroup v2 `memory.max` per VM, when a memory controller is usable.
//! - [`host`]: `/proc` readers (MemAvailable, PSI, smaps_rollup, CPU time).
//! - [`daemon`]: the tick (measure, decide, apply, count) and the serving loop: one thread
//!   for the API, one for the ticks, no async runtime.
//! - [`api`]: the REST routes; [`metrics`]: the Prometheus text; [`client`]: the client.

pub mod api;
pub mod cgroup;
pub mod client;
pub mod daemon;
pub mod exec;
pub mod host;
pub mod launcher;
pub mod metrics;
pub mod policy;
pub mod registry;
pub mod spec;
pub mod types;

pub use client::FleetClient;
pub use daemon::Fleet;
