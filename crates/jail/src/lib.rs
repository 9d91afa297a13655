//! A jailed launch for `densevm run --jail DIR --uid N --gid N` (Firecracker's jailer,
//! built into the VMM): the process forks into new PID, mount and IPC namespaces (and a
//! network namespace: a new empty one, a named one, or the host's), builds a root at DIR
//! on a private tmpfs holding only what the VM's configuration references (bind mounts at
//! the same absolute paths, a few device nodes owned by the VM's uid), pivots into it,
//! joins a cgroup of its own and drops every privilege before the guest runs
//! (docs/security.md, `## Jailed launch`).
//!
//! - [`plan`]: the pure part: flags checked, the list of paths and devices a VM may reach
//!   computed from what its configuration names ([`Plan`]), printable as JSON.
//! - [`cgroup`]: where the VM's cgroup goes (v1 controllers or v2), creating, joining and
//!   removing it.
//! - [`enter`]: the system calls: fork, namespaces, mounts, `pivot_root`, privilege drop;
//!   the outer process waits, forwards SIGTERM/SIGINT and exits with the VM's code.

pub mod cgroup;
pub mod enter;
pub mod plan;

pub use enter::{launch, Launched};
pub use plan::{Bind, BindKind, Device, JailFlags, JailSpec, Netns, Plan, PlanBuilder};

/// Why a jail could not be set up; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A flag combination or value is not allowed.
    #[error("{0}")]
    Invalid(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

impl JailError {
    pub(crate) fn sys(what: impl Into<String>) -> Self {
        JailError::Sys {
            what: what.into(),
            source: std::io::Error::last_os_error(),
        }
    }
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        JailError::Sys {
            what: what.into(),
            source,
        }
    }
}

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, JailError>;
