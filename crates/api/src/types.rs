//! The JSON bodies of the API. Where Firecracker has the same resource, the names and
//! shapes are Firecracker's, so scripts written for it carry over; request bodies reject
//! unknown fields, so a typo is a 400 naming the field instead of a silently ignored key.

use serde::{Deserialize, Deserializer, Serialize};

/// The largest `count` of one `POST /clones`.
pub const MAX_CLONES: u32 = 256;

/// `GET /`: what this VMM is and what its VM is doing (Firecracker's `InstanceInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceInfo {
    /// The VM's id (`densevm run --id`, or one the VMM made up).
    pub id: String,
    /// Whether the VM has started, runs or is paused.
    pub state: InstanceState,
    /// The VMM's version.
    pub vmm_version: String,
    /// The VMM's name: "densevm".
    pub app_name: String,
}

/// The VM's state, with Firecracker's strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceState {
    /// Built, vCPUs not running yet.
    #[serde(rename = "Not started")]
    NotStarted,
    /// vCPUs running.
    Running,
    /// vCPUs parked by `PATCH /vm {"state": "Paused"}`.
    Paused,
}

/// `PATCH /vm`: pause or resume the vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmStateChange {
    /// The state wanted.
    pub state: VmState,
}

/// The states `PATCH /vm` can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmState {
    /// Park every vCPU outside `KVM_RUN`.
    Paused,
    /// Let the vCPUs run again.
    Resumed,
}

/// `PUT /snapshot/create` (Firecracker's `SnapshotCreateParams`, with densevm's reading of
/// the paths: `snapshot_path` is a directory that will hold `state` and `memory`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreate {
    /// Full (the default) or Template; Firecracker's "Diff" is refused.
    #[serde(default)]
    pub snapshot_type: SnapshotType,
    /// The directory the snapshot is written to (it will hold `state` and `memory`).
    pub snapshot_path: String,
    /// Accepted only so a Firecracker body gets a helpful 400: densevm keeps the memory
    /// file inside `snapshot_path`, so this must be absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_file_path: Option<String>,
}

/// What kind of snapshot to take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum SnapshotType {
    /// The VM's state and a copy of its RAM.
    #[default]
    Full,
    /// densevm's own name for a snapshot kept as a clone template on disk: written like
    /// `Full`; every `densevm run --restore DIR` maps its memory file copy-on-write, so
    /// pages no clone writes exist once in the host page cache. (Clones of a *running*
    /// VM without any copy: `POST /clones`.)
    Template,
}

impl<'de> Deserialize<'de> for SnapshotType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        match name.as_str() {
            "Full" => Ok(Self::Full),
            "Template" => Ok(Self::Template),
            "Diff" => Err(serde::de::Error::custom(
                "densevm has no diff snapshots: use \"Full\" (state and a copy of RAM) or \
                 \"Template\" (RAM frozen as a template for clones)",
            )),
            _ => Err(serde::de::Error::unknown_variant(
                &name,
                &["Full", "Template"],
            )),
        }
    }
}

/// `POST /clones`: clone the running VM `count` times. The VM pauses while its state is
/// written into `snapshot_path` and its RAM file is frozen as the clones' copy-on-write
/// template, then resumes; each clone is a `densevm run --restore` process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    /// How many clones, 1..=[`MAX_CLONES`].
    pub count: u32,
    /// A new (or empty) directory for the template's state and each clone's API socket
    /// and console file.
    pub snapshot_path: String,
    /// The tap each clone's network interface uses instead of the parent's (a tap serves
    /// one VM): one entry per `--net` of the VM (`iface_id` `net0`, `net1`, ...), required
    /// when it has any. `{index}` in `host_dev_name` becomes the clone's index, e.g.
    /// `"tap-c{index}"` for taps `tap-c0`, `tap-c1`, ... made beforehand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_overrides: Vec<NetworkOverride>,
    /// A DRAM budget for each clone's RAM, MiB (`densevm run --memory-budget`, at least 4):
    /// each clone then keeps its RAM in a file of its own, read from the template on first
    /// access and kept under the budget, instead of mapping the template copy-on-write
    /// (docs/tiering.md, "Restores").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mib: Option<u32>,
}

/// A network interface of a restored VM or clone put on another tap (Firecracker's
/// snapshot-load `network_overrides`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOverride {
    /// The interface: `net0` for the VM's first `--net`, `net1` for the second, ...
    pub iface_id: String,
    /// The tap it uses (for clones, `{index}` is replaced by the clone's index).
    pub host_dev_name: String,
}

impl NetworkOverride {
    /// The tap for clone `index`.
    pub fn for_clone(&self, index: u32) -> String {
        self.host_dev_name.replace("{index}", &index.to_string())
    }
}

/// The answer to `POST /clones`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneList {
    /// One entry per clone started.
    pub clones: Vec<CloneInfo>,
    /// Microseconds from the request's arrival until every clone's vCPUs ran (the answer
    /// comes later: the parent finishes freezing its RAM first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_us: Option<u64>,
}

/// One clone started by `POST /clones`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneInfo {
    /// 0-based index among the clones of this request.
    pub index: u32,
    /// The clone's VMM process id.
    pub pid: u32,
    /// The clone's own API socket.
    pub api_sock: String,
    /// Where the clone's console goes (a file or a pty path).
    pub console: String,
}

/// The body of every error response (Firecracker's error body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong and what to do about it.
    pub fault_message: String,
}

/// `PUT /balloon` and the answer to `GET /balloon` (Firecracker's `Balloon`): the balloon
/// device's target and options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Balloon {
    /// How much guest memory the balloon should hold (taken from the guest), in MiB.
    pub amount_mib: u32,
    /// Whether the guest may deflate the balloon itself when it would otherwise OOM-kill.
    pub deflate_on_oom: bool,
    /// How often the guest reports statistics, in seconds; 0 turns them off.
    #[serde(default)]
    pub stats_polling_interval_s: u32,
}

/// The answer to `GET /balloon`: Firecracker's [`Balloon`] fields (the target as
/// `amount_mib`), plus what densevm adds (each defaulted, so a Firecracker-shaped answer
/// reads too): free page reporting, and the balloon's size as the guest reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonInfo {
    /// The target: guest memory the balloon should hold, in MiB.
    pub amount_mib: u32,
    /// Whether the guest may deflate the balloon itself when it would otherwise OOM-kill.
    pub deflate_on_oom: bool,
    /// How often the guest reports statistics, in seconds; 0: not polled.
    #[serde(default)]
    pub stats_polling_interval_s: u32,
    /// Whether the guest reports the pages it frees (they go back to the host).
    #[serde(default)]
    pub free_page_reporting: bool,
    /// The target in 4 KiB pages.
    #[serde(default)]
    pub target_pages: u32,
    /// The balloon's size as the guest last wrote it (`actual`), in 4 KiB pages.
    #[serde(default)]
    pub actual_pages: u32,
    /// `actual_pages` in MiB (rounded down).
    #[serde(default)]
    pub actual_mib: u32,
}

/// `PATCH /balloon` (Firecracker's `BalloonUpdate`): a new target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    /// How much guest memory the balloon should hold, in MiB.
    pub amount_mib: u32,
}

/// `PATCH /balloon/statistics` (Firecracker's `BalloonStatsUpdate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    /// How often the guest reports statistics, in seconds; 0 turns them off.
    pub stats_polling_interval_s: u32,
}

/// The answer to `GET /balloon/statistics` (Firecracker's `BalloonStats`): the balloon's
/// target and actual size, and the guest's last memory statistics (each absent until the
/// guest reported it). Byte counts are bytes, event counts are totals since the guest booted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonStats {
    /// Target size, in 4 KiB pages.
    pub target_pages: u32,
    /// Size the guest has reached, in 4 KiB pages.
    pub actual_pages: u32,
    /// Target size, in MiB.
    pub target_mib: u32,
    /// Size the guest has reached, in MiB.
    pub actual_mib: u32,
    /// Memory swapped in, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Memory swapped out, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Memory the guest does not use at all, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// The guest's total memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Memory the guest could use without swapping (its MemAvailable), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// The guest's page cache (disk caches), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// Successful hugetlb page allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    /// Failed hugetlb page allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
}

/// `GET /vsock`: the VM's vsock device (`densevm run --vsock`), with Firecracker's field
/// names. Host programs connect to `uds_path` and write `CONNECT <port>\n`
/// (docs/vsock.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockInfo {
    /// The guest's context ID.
    pub guest_cid: u64,
    /// The unix socket of the device's host side.
    pub uds_path: String,
}

/// `PATCH /memory-tier`: a new DRAM budget for guest RAM (densevm's own resource:
/// Firecracker has no memory tiering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryTierUpdate {
    /// DRAM guest RAM may use (resident pages plus the compressed store), in MiB.
    pub budget_mib: u32,
}

/// `GET /memory-tier`: the budget and what the tier did (a VM started with
/// `densevm run --memory-budget`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryTierInfo {
    /// The budget, in MiB (rounded down).
    pub budget_mib: u64,
    /// Guest RAM resident in DRAM now, KiB.
    pub resident_kib: u64,
    /// Pages in the compressed store.
    pub compressed_pages: u64,
    /// DRAM the compressed store takes, KiB.
    pub compressed_kib: u64,
    /// Pages in the swap file.
    pub swap_pages: u64,
    /// Pages of a VM restored with a budget whose data is only in its snapshot's memory
    /// file (never read, or dropped unchanged).
    #[serde(default)]
    pub base_pages: u64,
    /// Zero pages that left RAM (kept as nothing).
    pub evicted_zero: u64,
    /// Pages of a VM restored with a budget that left RAM for nothing: they still held the
    /// snapshot's bytes, read from it again when needed.
    #[serde(default)]
    pub evicted_clean: u64,
    /// Pages that left RAM compressed.
    pub evicted_compressed: u64,
    /// Pages that left RAM for the swap file.
    pub evicted_swap: u64,
    /// Compressed pages moved on to the swap file.
    pub demoted: u64,
    /// Accesses to pages out of RAM (served by copying them back).
    pub missing_faults: u64,
    /// Of those, the ones served from the compressed store, the swap file and the
    /// snapshot (a restore); the rest were pages never written (zeros).
    #[serde(default)]
    pub faults_compressed: u64,
    /// See `faults_compressed`.
    #[serde(default)]
    pub faults_swap: u64,
    /// See `faults_compressed`.
    #[serde(default)]
    pub faults_base: u64,
    /// Of `faults_swap`, the pages sent to a reader thread beside the service thread (a VM
    /// with 4 vCPUs or more, or `readers=N`), so that several faults wait for the disk at
    /// once.
    #[serde(default)]
    pub swap_reads_behind: u64,
    /// Accesses to armed pages (the cold-page detector's samples).
    pub minor_faults: u64,
    /// Pages brought back ahead of access (sequential prefetch).
    pub prefetched: u64,
    /// Pages armed by the cold-page detector.
    pub armed: u64,
    /// Faults the service thread found while it polled for the next one after serving
    /// faults (no wake-up; `poll=off` or one CPU: 0).
    #[serde(default)]
    pub faults_polled: u64,
    /// CPU time the tier's service thread and its swap-file readers used, microseconds
    /// (polling included).
    pub service_cpu_us: u64,
}
