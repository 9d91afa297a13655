//! Guest-physical memory: named regions, how each is backed on the host, and their
//! registration as KVM memory slots.

use std::fs::File;
use std::sync::Arc;
use thiserror::Error;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// How a region's host memory is provided.
#[derive(Debug)]
pub enum Backing {
    /// Private anonymous memory (zero-filled on first touch, never reserved up front).
    Anonymous,
    /// A `MAP_PRIVATE` mapping of a file: pages the guest only reads stay shared with
    /// every other mapping of the same file in the host page cache.
    FilePrivate {
        /// The file to map.
        file: Arc<File>,
        /// Byte offset of the region in the file (page aligned).
        offset: u64,
    },
    /// Memory mapped and owned by another component (e.g. the pmem mapping service,
    /// which serves its faults). It must stay mapped for as long as the VM exists.
    External {
        /// Host virtual address of the mapping (page aligned).
        host_addr: u64,
    },
}

/// One guest-physical region to create.
#[derive(Debug)]
pub struct RegionSpec {
    /// Name shown in reports and used by the probe (`ram`, `kernel.text`, `pmem0`, ...).
    pub name: String,
    /// Guest-physical start (page aligned).
    pub gpa: u64,
    /// Size in bytes (page aligned).
    pub size: u64,
    /// Host backing.
    pub backing: Backing,
}

/// A created region: where it lives in the guest and in the VMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// Region name.
    pub name: String,
    /// Guest-physical start.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
    /// Host virtual address of the mapping.
    pub host_addr: u64,
    /// Whether it maps a file.
    pub file_backed: bool,
}

/// Failure to set up guest memory.
#[derive(Debug, Error)]
pub enum MemoryError {
    /// A region is not page aligned or is empty.
    #[error("guest region `{name}` at {gpa:#x}+{size:#x} is empty or not 4 KiB aligned")]
    Unaligned {
        /// Region name.
        name: String,
        /// Start.
        gpa: u64,
        /// Size.
        size: u64,
    },
    /// Two regions overlap.
    #[error("guest regions `{0}` and `{1}` overlap")]
    Overlap(String, String),
    /// The host mapping failed.
    #[error("cannot map guest region `{name}` ({size} bytes): {source}")]
    Map {
        /// Region name.
        name: String,
        /// Size.
        size: u64,
        /// Cause.
        source: vm_memory::mmap::MmapRegionError,
    },
    /// vm-memory rejected the region set.
    #[error("invalid guest memory layout: {0}")]
    Layout(String),
}

/// The guest's memory: the vm-memory view devices and loaders use, plus region metadata.
pub struct GuestMemory {
    mem: GuestMemoryMmap,
    regions: Vec<RegionInfo>,
}

const PAGE: u64 = 4096;

impl GuestMemory {
    /// Maps every region. Regions are sorted by address and must not overlap.
    pub fn new(mut specs: Vec<RegionSpec>) -> Result<Self, MemoryError> {
        specs.sort_by_key(|s| s.gpa);
        for s in &specs {
            if s.size == 0 || s.gpa % PAGE != 0 || s.size % PAGE != 0 {
                return Err(MemoryError::Unaligned {
                    name: s.name.clone(),
                    gpa: s.gpa,
                    size: s.size,
                });
            }
        }
        for w in specs.windows(2) {
            if w[0].gpa + w[0].size > w[1].gpa {
                return Err(MemoryError::Overlap(w[0].name.clone(), w[1].name.clone()));
            }
        }
        let mut regions = Vec::with_capacity(specs.len());
        let mut infos = Vec::with_capacity(specs.len());
        for spec in specs {
            let builder = MmapRegionBuilder::new(spec.size as usize)
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE);
            let (builder, file_backed) = match &spec.backing {
                Backing::Anonymous => (
                    builder.with_mmap_flags(
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    ),
                    false,
                ),
                Backing::FilePrivate { file, offset } => (
                    builder
                        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                        .with_file_offset(FileOffset::from_arc(file.clone(), *offset)),
                    true,
                ),
                Backing::External { .. } => (builder, true),
            };
            let mapping = match &spec.backing {
                Backing::External { host_addr } => {
                    // SAFETY: the owner of an External region guarantees that
                    // [host_addr, host_addr + size) is a live read-write mapping that
                    // outlives the VM (documented on `Backing::External`).
                    unsafe {
                        vm_memory::MmapRegion::build_raw(
                            *host_addr as *mut u8,
                            spec.size as usize,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED,
                        )
                    }
                }
                _ => builder.build(),
            }
            .map_err(|source| MemoryError::Map {
                name: spec.name.clone(),
                size: spec.size,
                source,
            })?;
            let host_addr = mapping.as_ptr() as u64;
            let region = GuestRegionMmap::new(mapping, GuestAddress(spec.gpa))
                .ok_or_else(|| MemoryError::Layout(format!("region `{}` overflows", spec.name)))?;
            regions.push(region);
            infos.push(RegionInfo {
                name: spec.name,
                gpa: spec.gpa,
                size: spec.size,
                host_addr,
                file_backed,
            });
        }
        let mem = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| MemoryError::Layout(e.to_string()))?;
        Ok(Self {
            mem,
            regions: infos,
        })
    }

    /// The vm-memory view of guest memory.
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Region metadata, sorted by guest address.
    pub fn regions(&self) -> &[RegionInfo] {
        &self.regions
    }

    /// The region with this name.
    pub fn region(&self, name: &str) -> Option<&RegionInfo> {
        self.regions.iter().find(|r| r.name == name)
    }

    /// End of the highest region.
    pub fn end(&self) -> u64 {
        self.regions.last().map_or(0, |r| r.gpa + r.size)
    }
}

/// Guest RAM: `low_end` bytes from address 0 and `high` bytes from `high_start`,
/// anonymous except where `windows` (regions with their own backing, e.g. a kernel
/// mapped from its file) cut into the low part. The anonymous pieces are named `ram`,
/// `ram.1`, ... and `ram.high`.
pub fn ram_with_windows(
    low_end: u64,
    high: u64,
    high_start: u64,
    mut windows: Vec<RegionSpec>,
) -> Vec<RegionSpec> {
    windows.sort_by_key(|w| w.gpa);
    let mut specs = Vec::with_capacity(2 * windows.len() + 2);
    let mut cursor = 0;
    let mut pieces = 0;
    let mut anon = |specs: &mut Vec<RegionSpec>, from: u64, to: u64| {
        if to > from {
            let name = if pieces == 0 {
                "ram".to_string()
            } else {
                format!("ram.{pieces}")
            };
            pieces += 1;
            specs.push(RegionSpec {
                name,
                gpa: from,
                size: to - from,
                backing: Backing::Anonymous,
            });
        }
    };
    for window in windows {
        anon(&mut specs, cursor, window.gpa);
        cursor = window.gpa + window.size;
        specs.push(window);
    }
    anon(&mut specs, cursor, low_end);
    if high > 0 {
        specs.push(RegionSpec {
            name: "ram.high".into(),
            gpa: high_start,
            size: high,
            backing: Backing::Anonymous,
        });
    }
    specs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_is_split_around_windows() {
        let f = Arc::new(File::open("/proc/self/exe").unwrap());
        let window = |name: &str, gpa, size| RegionSpec {
            name: name.into(),
            gpa,
            size,
            backing: Backing::FilePrivate {
                file: f.clone(),
                offset: 0,
            },
        };
        let windows = vec![
            window("b", 0x200_0000, 0x1000),
            window("a", 0x100_0000, 0x2000),
        ];
        let specs = ram_with_windows(0x400_0000, 0, 4 << 30, windows);
        let layout: Vec<_> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.gpa, s.size))
            .collect();
        assert_eq!(
            layout,
            [
                ("ram", 0, 0x100_0000),
                ("a", 0x100_0000, 0x2000),
                ("ram.1", 0x100_2000, 0xffe000),
                ("b", 0x200_0000, 0x1000),
                ("ram.2", 0x200_1000, 0x1fff000)
            ]
        );
        let plain = ram_with_windows(3 << 30, 1 << 30, 4 << 30, Vec::new());
        let layout: Vec<_> = plain
            .iter()
            .map(|s| (s.name.as_str(), s.gpa, s.size))
            .collect();
        assert_eq!(
            layout,
            [("ram", 0, 3 << 30), ("ram.high", 4 << 30, 1 << 30)]
        );
    }
}
