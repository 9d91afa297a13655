//! The statistics queue's buffer (virtio 1.2 §5.5.6.3): packed `{le16 tag; le64 val}`
//! entries. Linux 6.1 sends tags 0–9 (those it has: hugetlb ones only with
//! `CONFIG_HUGETLB_PAGE`, the event counters only with `CONFIG_VM_EVENT_COUNTERS`); 6.12
//! added 10–15 (OOM kills, allocation stalls, scans and reclaims). Unknown tags are ignored;
//! a later entry with the same tag wins.

use super::PAGES_PER_MIB;
use serde::{Deserialize, Serialize};

/// Bytes per entry (`struct virtio_balloon_stat` is packed).
pub const ENTRY_LEN: usize = 10;
/// Most entries the device reads from one buffer (Linux sends at most 16): a longer buffer
/// is refused.
pub const MAX_ENTRIES: usize = 64;

/// Statistics tags.
pub mod tag {
    /// Bytes swapped in.
    pub const SWAP_IN: u16 = 0;
    /// Bytes swapped out.
    pub const SWAP_OUT: u16 = 1;
    /// Major page faults.
    pub const MAJFLT: u16 = 2;
    /// Minor page faults.
    pub const MINFLT: u16 = 3;
    /// Free memory, bytes.
    pub const MEMFREE: u16 = 4;
    /// Total memory, bytes.
    pub const MEMTOT: u16 = 5;
    /// Available memory (`MemAvailable`), bytes.
    pub const AVAIL: u16 = 6;
    /// Disk caches, bytes.
    pub const CACHES: u16 = 7;
    /// Hugetlb page allocations.
    pub const HTLB_PGALLOC: u16 = 8;
    /// Hugetlb page allocation failures.
    pub const HTLB_PGFAIL: u16 = 9;
    /// OOM killer invocations (Linux 6.12+).
    pub const OOM_KILL: u16 = 10;
    /// Allocation stalls (Linux 6.12+).
    pub const ALLOC_STALL: u16 = 11;
    /// Pages scanned by kswapd (Linux 6.12+).
    pub const ASYNC_SCAN: u16 = 12;
    /// Pages scanned directly (Linux 6.12+).
    pub const DIRECT_SCAN: u16 = 13;
    /// Pages reclaimed by kswapd (Linux 6.12+).
    pub const ASYNC_RECLAIM: u16 = 14;
    /// Pages reclaimed directly (Linux 6.12+).
    pub const DIRECT_RECLAIM: u16 = 15;
}

/// The guest's values, each present only when the guest sent it.
// No `deny_unknown_fields`: flattened into [`BalloonStats`], which serde cannot combine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStats {
    /// Bytes swapped in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Bytes swapped out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Free memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// Total memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Available memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// Disk caches, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// Hugetlb page allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    /// Hugetlb allocation failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
    /// OOM killer invocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<u64>,
    /// Allocation stalls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_stall: Option<u64>,
    /// Pages scanned by kswapd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_scan: Option<u64>,
    /// Pages scanned directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_scan: Option<u64>,
    /// Pages reclaimed by kswapd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_reclaim: Option<u64>,
    /// Pages reclaimed directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_reclaim: Option<u64>,
}

impl GuestStats {
    /// Records one entry; false for a tag this device does not know (ignored).
    pub fn set(&mut self, tag: u16, val: u64) -> bool {
        let field = match tag {
            tag::SWAP_IN => &mut self.swap_in,
            tag::SWAP_OUT => &mut self.swap_out,
            tag::MAJFLT => &mut self.major_faults,
            tag::MINFLT => &mut self.minor_faults,
            tag::MEMFREE => &mut self.free_memory,
            tag::MEMTOT => &mut self.total_memory,
            tag::AVAIL => &mut self.available_memory,
            tag::CACHES => &mut self.disk_caches,
            tag::HTLB_PGALLOC => &mut self.hugetlb_allocations,
            tag::HTLB_PGFAIL => &mut self.hugetlb_failures,
            tag::OOM_KILL => &mut self.oom_kill,
            tag::ALLOC_STALL => &mut self.alloc_stall,
            tag::ASYNC_SCAN => &mut self.async_scan,
            tag::DIRECT_SCAN => &mut self.direct_scan,
            tag::ASYNC_RECLAIM => &mut self.async_reclaim,
            tag::DIRECT_RECLAIM => &mut self.direct_reclaim,
            _ => return false,
        };
        *field = Some(val);
        true
    }
}

/// `GET /balloon/statistics` (Firecracker's shape): the target and `actual` with the
/// guest's latest values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonStats {
    /// The target, pages.
    pub target_pages: u32,
    /// The balloon's size as the driver wrote it, pages.
    pub actual_pages: u32,
    /// The target, MiB (rounded down).
    pub target_mib: u32,
    /// `actual`, MiB (rounded down).
    pub actual_mib: u32,
    /// The guest's values.
    #[serde(flatten)]
    pub guest: GuestStats,
}

impl BalloonStats {
    /// The statistics for a target and `actual` of these many pages.
    pub fn new(target_pages: u32, actual_pages: u32, guest: GuestStats) -> Self {
        Self {
            target_pages,
            actual_pages,
            target_mib: target_pages / PAGES_PER_MIB,
            actual_mib: actual_pages / PAGES_PER_MIB,
            guest,
        }
    }
}

/// Why a statistics buffer was refused (the device keeps the previous values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StatsError {
    /// The buffer's length is not a whole number of entries.
    #[error("{0} bytes is not a whole number of 10-byte entries")]
    Length(usize),
    /// More entries than [`MAX_ENTRIES`].
    #[error("more than {MAX_ENTRIES} entries")]
    TooLong,
    /// A device-writable buffer, or one outside guest memory.
    #[error("the buffer is not a readable buffer in guest memory")]
    Buffer,
}

/// Parses a whole statistics buffer.
pub fn parse(bytes: &[u8]) -> Result<GuestStats, StatsError> {
    if bytes.len() % ENTRY_LEN != 0 {
        return Err(StatsError::Length(bytes.len()));
    }
    if bytes.len() / ENTRY_LEN > MAX_ENTRIES {
        return Err(StatsError::TooLong);
    }
    let mut stats = GuestStats::default();
    for e in bytes.chunks_exact(ENTRY_LEN) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let mut val = [0u8; 8];
        val.copy_from_slice(&e[2..]);
        stats.set(tag, u64::from_le_bytes(val));
    }
    Ok(stats)
}

/// Reads and parses the buffer of a statistics chain: only device-readable buffers, at
/// most [`MAX_ENTRIES`] entries.
pub fn read_chain<M>(
    chain: virtio_queue::DescriptorChain<M>,
    mem: &crate::Mem,
) -> Result<GuestStats, StatsError>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    let mut bytes = Vec::new();
    for desc in chain {
        if desc.is_write_only() {
            return Err(StatsError::Buffer);
        }
        let len = desc.len() as usize;
        if bytes.len() + len > MAX_ENTRIES * ENTRY_LEN {
            return Err(StatsError::TooLong);
        }
        let at = bytes.len();
        bytes.resize(at + len, 0);
        vm_memory::Bytes::read_slice(mem, &mut bytes[at..], desc.addr())
            .map_err(|_| StatsError::Buffer)?;
    }
    parse(&bytes)
}
