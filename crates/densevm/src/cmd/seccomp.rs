//! `densevm run --seccomp on|off`: per-thread seccomp filters (docs/security.md,
//! "seccomp filters"; the lists are in crates/seccomp).

use densevm_seccomp::{Policy, ThreadKind};

/// `--seccomp`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seccomp {
    /// Every thread installs its kind's allow-list before the guest runs.
    On,
    /// No filters (debugging only; says so loudly). Clones started by this VM inherit it.
    Off,
    /// Filters that allow what they would deny and have the kernel log it (audit
    /// `type=1326` records in dmesg, with the syscall number; needs audit on, e.g. the
    /// `audit=1` boot parameter): for finding what a list lacks on another kernel or C
    /// library. Debugging only, like `off`; clones inherit it.
    Log,
}

impl Seccomp {
    /// The flag value clones of this VM are started with (they inherit `off` and `log`);
    /// `None` when it is the default.
    pub fn inherited(self) -> Option<&'static str> {
        match self {
            Seccomp::Off => Some("off"),
            Seccomp::Log => Some("log"),
            Seccomp::On => None,
        }
    }

    /// [`Seccomp::inherited`] of the mode this process set up.
    pub fn for_clones() -> Option<&'static str> {
        let mode = match densevm_seccomp::mode() {
            densevm_seccomp::Mode::Off => Seccomp::Off,
            densevm_seccomp::Mode::Log => Seccomp::Log,
            densevm_seccomp::Mode::On | densevm_seccomp::Mode::Unset => Seccomp::On,
        };
        mode.inherited()
    }
}

/// Parses `--seccomp-test-violation KIND`.
pub fn parse_kind(text: &str) -> Result<ThreadKind, String> {
    ThreadKind::from_name(text).ok_or_else(|| {
        let names: Vec<_> = ThreadKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown thread kind; one of {}", names.join(", "))
    })
}

/// Turns filtering on (or records that it is off) before `densevm run` starts any thread.
pub fn setup(mode: Seccomp, test_violation: Option<ThreadKind>) -> anyhow::Result<()> {
    match mode {
        Seccomp::On | Seccomp::Log => {
            let log_only = mode == Seccomp::Log;
            if log_only {
                eprintln!(
                    "densevm: WARNING: --seccomp log: the seccomp filters deny nothing; the kernel"
                );
                eprintln!("densevm: WARNING: logs each call they would deny (dmesg, audit type=1326, with");
                eprintln!(
                    "densevm: WARNING: audit on). Use it for debugging only (docs/security.md)."
                );
            }
            densevm_seccomp::enable(Policy { log_only }, test_violation)
                .map_err(|e| anyhow::anyhow!("cannot set up the seccomp filters: {e}"))
        }
        Seccomp::Off => {
            densevm_seccomp::disable();
            eprintln!("densevm: WARNING: ********************************************************");
            eprintln!("densevm: WARNING: --seccomp off: this VMM runs WITHOUT seccomp filters.");
            eprintln!("densevm: WARNING: A guest that escapes into it can make any system call.");
            eprintln!("densevm: WARNING: Use it for debugging only (docs/security.md).");
            eprintln!("densevm: WARNING: ********************************************************");
            Ok(())
        }
    }
}
