//! The fleet API's JSON bodies. Request bodies reject unknown fields (a typo is a 400
//! naming it).

use serde::{Deserialize, Serialize};

use crate::policy::{HostMode, HostSample, PolicyConfig, Priority};

/// `POST /vms`: a VM to start, booted from a kernel (or the probe guest) or restored from
/// a snapshot directory. Device strings are `densevm run`'s `--disk` and `--share` values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmCreate {
    /// The VM's id (letters, digits, `.`, `_`, `-`; at most 64); default `vm-N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A Linux kernel (`--kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Its initrd (`--initrd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    /// Its command line (`--cmdline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// The probe guest with this script (`--probe`), instead of a kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// Start from this snapshot directory (`--restore`), instead of booting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<String>,
    /// Guest RAM in MiB (`--memory`); for a restore, the snapshot's RAM size.
    pub memory_mib: u64,
    /// vCPUs (`--cpus`), default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// `--disk` values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<String>,
    /// `--share` values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<String>,
    /// `--rng`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rng: bool,
    /// Priority class, default normal.
    #[serde(default)]
    pub priority: Priority,
    /// Least guest memory the policy leaves it, MiB (default a quarter of its RAM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_mib: Option<u64>,
    /// Most guest memory it may have, MiB (default all its RAM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mib: Option<u64>,
    /// A DRAM budget for its RAM, MiB (`densevm run --memory-budget`, docs/tiering.md): at
    /// least 4 and at most its RAM. With `restore`, RAM of its own read from the snapshot
    /// on first access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mib: Option<u64>,
    /// `--net` values (`tap=NAME[,mac=MAC]`, docs/networking.md); each tap serves one VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<String>,
    /// A virtio-vsock device with this guest CID (3 or more), its host socket
    /// `vsock.sock` in the VM's directory (`--vsock cid=N,uds=...`, docs/vsock.md): what
    /// `POST /vms/{id}/exec` reaches the guest agent through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_cid: Option<u32>,
    /// With `restore`: put the snapshot's network interfaces on other taps (Firecracker's
    /// snapshot-load `network_overrides`; `densevm run --net-override IFACE=TAP`), so that
    /// several VMs restored from one snapshot each get a tap of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_overrides: Vec<densevm_api::types::NetworkOverride>,
}

/// `POST /vms/{id}/exec`: a command to run in the guest through its agent (docs/vsock.md).
/// The answer comes when the command ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmExec {
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// `NAME=VALUE` entries; none: the agent's default PATH and HOME.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// The command's whole stdin (none: empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Kill the command (and its process group) after this many seconds; it then ends
    /// `timed_out` with exit code 124. At most an hour, the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// The agent's vsock port (default 52).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

/// The answer to `POST /vms/{id}/exec`: how the command ended and what it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// Its exit code (128 + signal when killed, 124 on timeout, 126/127 when it could
    /// not start).
    pub exit_code: i32,
    /// `exited`, `signaled`, `timed_out` or `not_started`.
    pub status: String,
    /// The agent's word on it (signal name, why it could not start); may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Its stdout (UTF-8; other bytes replaced), at most 16 MiB.
    pub stdout: String,
    /// Its stderr, likewise.
    pub stderr: String,
    /// Whether output past 16 MiB was dropped.
    pub truncated: bool,
    /// From the request to the command's end, milliseconds.
    pub duration_ms: u64,
}

/// `PATCH /vms/{id}`: what to change (absent fields stay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmPatch {
    /// A new priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// A new least guest memory, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_mib: Option<u64>,
    /// A new most guest memory, MiB (the cgroup's `memory.max` follows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mib: Option<u64>,
    /// A balloon target, MiB (RAM minus it must stay within min..=max).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon_mib: Option<u64>,
    /// A new DRAM budget, MiB (a VM created with `memory_budget_mib` only): sent to the
    /// VM's `PATCH /memory-tier` at once; the policy lowers it no further than its floor
    /// and raises it back to this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mib: Option<u64>,
}

/// Whether a VM's process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmStatus {
    /// Its process runs.
    Running,
    /// Its process ended (`exit` says how); listed until deleted.
    Exited,
}

/// The guest's last balloon statistics, MiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMemory {
    /// Balloon size reached.
    pub balloon_actual_mib: u64,
    /// Guest's total memory.
    pub total_mib: u64,
    /// Unused.
    pub free_mib: u64,
    /// Usable without swapping.
    pub available_mib: u64,
    /// Page cache.
    pub caches_mib: u64,
}

/// A VM's memory tier at the last tick (its `GET /memory-tier`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierMemory {
    /// The budget the VM reported, MiB.
    pub budget_mib: u64,
    /// Guest RAM resident in DRAM, KiB.
    pub resident_kib: u64,
    /// Pages in the compressed store.
    pub compressed_pages: u64,
    /// DRAM the compressed store takes, KiB.
    pub compressed_kib: u64,
    /// Pages in the swap file.
    pub swap_pages: u64,
    /// Pages that left RAM (zero, clean copies of a restored VM's snapshot, compressed and
    /// to the swap file).
    pub evicted: u64,
    /// Accesses to pages out of RAM, served by bringing them back.
    pub missing_faults: u64,
    /// Accesses to armed pages (the cold-page detector's samples).
    pub minor_faults: u64,
    /// CPU time of the tier's service thread, microseconds.
    pub service_cpu_us: u64,
}

/// A VM: `GET /vms/{id}`, an element of `GET /vms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmInfo {
    /// Its id.
    pub id: String,
    /// Running or exited.
    pub status: VmStatus,
    /// How the process ended (exit code or signal), once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
    /// The VMM's process id.
    pub pid: u32,
    /// Priority class.
    pub priority: Priority,
    /// Guest RAM.
    pub memory_mib: u64,
    /// Least guest memory.
    pub min_mib: u64,
    /// Most guest memory.
    pub max_mib: u64,
    /// Balloon target last set.
    pub balloon_mib: u64,
    /// The VM's own API socket.
    pub api_sock: String,
    /// Its console output file.
    pub console: String,
    /// Its console input socket.
    pub console_sock: String,
    /// Its cgroup, when the fleet has a memory controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// VMM resident set, KiB (last tick).
    pub rss_kib: u64,
    /// VMM proportional set, KiB (last tick).
    pub pss_kib: u64,
    /// CPU over the last tick, percent of one CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
    /// The guest's statistics, when its balloon reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<GuestMemory>,
    /// Why the balloon cannot be read or set, when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon_error: Option<String>,
    /// Its DRAM budget now, MiB (under `memory_budget_user_mib` while the policy has
    /// lowered it), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mib: Option<u64>,
    /// The budget the user set (at creation or by `PATCH`), MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_user_mib: Option<u64>,
    /// The tier's counters at the last tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierMemory>,
    /// Why the tier cannot be read or its budget set, when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_error: Option<String>,
    /// How it was created.
    pub spec: VmCreate,
}

/// The fleet's memory limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupInfo {
    /// Whether each VM runs under its own `memory.max`.
    pub enabled: bool,
    /// The fleet's parent cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What is missing, when not enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// VMM overhead added to each VM's max for `memory.max`, MiB.
    pub overhead_mib: u64,
}

/// `GET /`: the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetInfo {
    /// "densevm-fleet".
    pub app_name: String,
    /// densevm's version.
    pub version: String,
    /// Where VM sockets, consoles and records live.
    pub state_dir: String,
    /// VMs running.
    pub running: usize,
    /// VMs exited, not yet deleted.
    pub exited: usize,
    /// The cgroup hard stop, or why there is none.
    pub cgroup: CgroupInfo,
    /// The policy's numbers.
    pub policy: PolicyConfig,
    /// The host at the last tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostSample>,
    /// The host's band at the last tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<HostMode>,
    /// Ticks run.
    pub ticks: u64,
    /// Things an operator should know (a missing hard stop, no PSI, no balloons).
    pub warnings: Vec<String>,
}
