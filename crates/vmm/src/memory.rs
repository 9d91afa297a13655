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
    /// What backs it.
    pub kind: RegionKind,
}

/// What backs a created region (the [`Backing`] without its resources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// Private anonymous guest RAM.
    Anonymous,
    /// A private mapping of a boot image (kernel segment, initrd).
    FilePrivate,
    /// Memory owned by another component (pmem).
    External,
}

/// Which guest regions the host kernel's same-page merging (KSM) may scan.
///
/// Marking costs nothing by itself: pages are only merged while `ksmd` runs
/// (`/sys/kernel/mm/ksm/run` = 1), and a merged page is copied again on its next write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MergePolicy {
    /// Nothing is marked.
    Off,
    /// The boot-image windows: the pages a guest kernel patches or clears at boot become
    /// private copies, identical in every VM booted from the same files, so KSM can fold
    /// them back into one.
    #[default]
    BootImages,
    /// Boot images and all anonymous guest RAM.
    All,
}

impl MergePolicy {
    /// Whether regions of this kind are marked mergeable.
    pub fn covers(self, kind: RegionKind) -> bool {
        match (self, kind) {
            (_, RegionKind::External) | (MergePolicy::Off, _) => false,
            (MergePolicy::BootImages, kind) => kind == RegionKind::FilePrivate,
            (MergePolicy::All, _) => true,
        }
    }
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
    /// madvise(MADV_MERGEABLE) failed.
    #[error("cannot mark guest region `{name}` for same-page merging: {source} (is the host kernel built with CONFIG_KSM? run with --merge off otherwise)")]
    Merge {
        /// Region name.
        name: String,
        /// Cause.
        source: std::io::Error,
    },
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
            let kind = match &spec.backing {
                Backing::Anonymous => RegionKind::Anonymous,
                Backing::FilePrivate { .. } => RegionKind::FilePrivate,
                Backing::External { .. } => RegionKind::External,
            };
            let builder = match &spec.backing {
                Backing::Anonymous => builder
                    .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE),
                Backing::FilePrivate { file, offset } => builder
                    .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                    .with_file_offset(FileOffset::from_arc(file.clone(), *offset)),
                Backing::External { .. } => builder,
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
                kind,
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

    /// Marks every region `policy` covers as mergeable by KSM; returns how many bytes
    /// were marked.
    pub fn advise_merge(&self, policy: MergePolicy) -> Result<u64, MemoryError> {
        let mut marked = 0;
        for r in self.regions.iter().filter(|r| policy.covers(r.kind)) {
            // SAFETY: [host_addr, host_addr + size) is a mapping this object created and
            // owns; MADV_MERGEABLE only changes how the kernel may share its pages and
            // never their contents as seen by the process or the guest.
            let rc = unsafe {
                libc::madvise(
                    r.host_addr as *mut libc::c_void,
                    r.size as usize,
                    libc::MADV_MERGEABLE,
                )
            };
            if rc != 0 {
                return Err(MemoryError::Merge {
                    name: r.name.clone(),
                    source: std::io::Error::last_os_error(),
                });
            }
            marked += r.size;
        }
        Ok(marked)
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

    /// The VmFlags line of the smaps entry that contains `addr`.
    fn vm_flags(addr: u64) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let contains = |line: &str| {
            let range = line.split_whitespace().next().unwrap_or("");
            let Some((lo, hi)) = range.split_once('-') else {
                return false;
            };
            match (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                (Ok(lo), Ok(hi)) => lo <= addr && addr < hi,
                _ => false,
            }
        };
        smaps
            .lines()
            .skip_while(|l| !contains(l))
            .find(|l| l.starts_with("VmFlags:"))
            .unwrap_or_else(|| panic!("no smaps entry contains {addr:#x}"))
            .to_string()
    }

    #[test]
    fn merge_policy_marks_only_the_regions_it_covers() {
        let exe = Arc::new(File::open("/proc/self/exe").unwrap());
        let specs = || {
            vec![
                RegionSpec {
                    name: "ram".into(),
                    gpa: 0,
                    size: 0x10_0000,
                    backing: Backing::Anonymous,
                },
                RegionSpec {
                    name: "kernel.0".into(),
                    gpa: 0x10_0000,
                    size: 0x1000,
                    backing: Backing::FilePrivate {
                        file: exe.clone(),
                        offset: 0,
                    },
                },
            ]
        };
        for (policy, ram, kernel) in [
            (MergePolicy::Off, false, false),
            (MergePolicy::BootImages, false, true),
            (MergePolicy::All, true, true),
        ] {
            let memory = GuestMemory::new(specs()).unwrap();
            let marked = memory.advise_merge(policy).unwrap();
            let expect = u64::from(ram) * 0x10_0000 + u64::from(kernel) * 0x1000;
            assert_eq!(marked, expect, "{policy:?}");
            for (name, want) in [("ram", ram), ("kernel.0", kernel)] {
                let r = memory.region(name).unwrap();
                let flags = vm_flags(r.host_addr);
                assert_eq!(
                    flags.split_whitespace().any(|f| f == "mg"),
                    want,
                    "{policy:?} {name}: {flags}"
                );
            }
        }
        assert!(!MergePolicy::All.covers(RegionKind::External));
    }
}
