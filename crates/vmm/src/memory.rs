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
    /// Guest RAM in a file (a memfd, or a snapshot's memory file) at `offset`: mapped
    /// `MAP_SHARED` while this VM owns the file, `MAP_PRIVATE` once it is a frozen clone
    /// template (see [`crate::snapshot::ram`]): then pages nobody writes exist once on
    /// the host, and each VM's writes are its own copies.
    RamFile {
        /// The RAM file (offset = guest-physical address: holes cost nothing).
        file: Arc<File>,
        /// Byte offset of the region in the file (page aligned).
        offset: u64,
        /// `MAP_SHARED` (the VM's writes go to the file) or `MAP_PRIVATE`.
        shared: bool,
    },
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
        /// Ranges `(offset, len)` of the region that KVM maps read-only, so that a guest
        /// write there exits to the VMM as an MMIO write on every KVM flavour (the owner
        /// serves it through [`crate::write_fault`]). Coalesced to at most
        /// [`MAX_READONLY_RANGES`] when the region is created.
        kvm_readonly: Vec<(u64, u64)>,
    },
}

/// Most read-only KVM slots one external region may use; beyond that, the nearest ranges
/// are merged (writes in the gaps then exit to the VMM too: slower, still correct).
pub const MAX_READONLY_RANGES: usize = 1024;

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
    /// Sorted, disjoint `(offset, len)` ranges KVM maps read-only (external regions only).
    pub kvm_readonly: Vec<(u64, u64)>,
}

/// One KVM memory slot: a piece of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotPiece {
    /// Guest-physical start.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
    /// Host virtual address.
    pub host_addr: u64,
    /// Registered with `KVM_MEM_READONLY`.
    pub readonly: bool,
}

impl RegionInfo {
    /// The KVM slots that cover this region: one, or alternating writable and read-only
    /// pieces around [`RegionInfo::kvm_readonly`].
    pub fn slot_pieces(&self) -> Vec<SlotPiece> {
        let mut pieces = Vec::with_capacity(2 * self.kvm_readonly.len() + 1);
        let mut push = |from: u64, to: u64, readonly: bool| {
            if to > from {
                pieces.push(SlotPiece {
                    gpa: self.gpa + from,
                    size: to - from,
                    host_addr: self.host_addr + from,
                    readonly,
                });
            }
        };
        let mut cursor = 0;
        for &(off, len) in &self.kvm_readonly {
            push(cursor, off, false);
            push(off, off + len, true);
            cursor = off + len;
        }
        push(cursor, self.size, false);
        pieces
    }
}

/// Sorts and merges `ranges` (clipped to `size`, widened to whole pages), then merges the
/// ranges separated by the smallest gaps until at most `max` remain.
pub fn coalesce_ranges(mut ranges: Vec<(u64, u64)>, size: u64, max: usize) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    ranges.sort_unstable();
    for (off, len) in ranges {
        let start = (off / PAGE) * PAGE;
        let end = off
            .saturating_add(len)
            .min(size)
            .next_multiple_of(PAGE)
            .min(size);
        if end <= start {
            continue;
        }
        match spans.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => spans.push((start, end)),
        }
    }
    let max = max.max(1);
    if spans.len() > max {
        // Close the smallest gaps: gap i lies between spans i and i + 1.
        let mut order: Vec<usize> = (0..spans.len() - 1).collect();
        order.sort_unstable_by_key(|&i| (spans[i + 1].0 - spans[i].1, i));
        let mut close = vec![false; spans.len() - 1];
        for &i in &order[..spans.len() - max] {
            close[i] = true;
        }
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(max);
        for (i, span) in spans.iter().enumerate() {
            match merged.last_mut() {
                Some(last) if close[i - 1] => last.1 = span.1,
                _ => merged.push(*span),
            }
        }
        spans = merged;
    }
    spans.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// What backs a created region (the [`Backing`] without its resources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// Private anonymous guest RAM.
    Anonymous,
    /// Guest RAM in a file (shared while the VM owns it, private over a clone template).
    RamFile,
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
            // KSM merges anonymous pages only: a shared RAM file is not scanned, the
            // private copies over a template are.
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
            let (kind, kvm_readonly) = match &spec.backing {
                Backing::Anonymous => (RegionKind::Anonymous, Vec::new()),
                Backing::RamFile { .. } => (RegionKind::RamFile, Vec::new()),
                Backing::FilePrivate { .. } => (RegionKind::FilePrivate, Vec::new()),
                Backing::External { kvm_readonly, .. } => (
                    RegionKind::External,
                    coalesce_ranges(kvm_readonly.clone(), spec.size, MAX_READONLY_RANGES),
                ),
            };
            let builder = match &spec.backing {
                Backing::Anonymous => builder
                    .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE),
                Backing::FilePrivate { file, offset } => builder
                    .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                    .with_file_offset(FileOffset::from_arc(file.clone(), *offset)),
                Backing::RamFile {
                    file,
                    offset,
                    shared,
                } => builder
                    .with_mmap_flags(
                        libc::MAP_NORESERVE
                            | if *shared {
                                libc::MAP_SHARED
                            } else {
                                libc::MAP_PRIVATE
                            },
                    )
                    .with_file_offset(FileOffset::from_arc(file.clone(), *offset)),
                Backing::External { .. } => builder,
            };
            let mapping = match &spec.backing {
                Backing::External { host_addr, .. } => {
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
                kvm_readonly,
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
/// mapped from its file) cut into the low part. The RAM pieces are named `ram`,
/// `ram.1`, ... and `ram.high`; [`back_ram_with_file`] moves them into a RAM file.
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

/// Whether a region is guest RAM (as opposed to a boot-image window or an external region).
pub fn is_ram(name: &str) -> bool {
    name == "ram" || name.starts_with("ram.")
}

/// Backs every anonymous RAM piece of `specs` with `file` at offset = guest-physical
/// address, mapped shared or private.
pub fn back_ram_with_file(specs: &mut [RegionSpec], file: &Arc<File>, shared: bool) {
    for spec in specs.iter_mut().filter(|s| is_ram(&s.name)) {
        if matches!(spec.backing, Backing::Anonymous) {
            spec.backing = Backing::RamFile {
                file: file.clone(),
                offset: spec.gpa,
                shared,
            };
        }
    }
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

    #[test]
    fn readonly_ranges_are_merged_to_a_budget_and_become_slot_pieces() {
        const P: u64 = PAGE;
        // Unsorted, overlapping, unaligned and out-of-range input.
        let ranges = vec![
            (10 * P, 2 * P),
            (P + 5, P),
            (11 * P, 3 * P),
            (40 * P, 9 * P),
        ];
        assert_eq!(
            coalesce_ranges(ranges.clone(), 44 * P, 8),
            [(P, 2 * P), (10 * P, 4 * P), (40 * P, 4 * P)]
        );
        // Budget 2: the smallest gap (3P..10P = 7 pages) closes, the larger one stays.
        assert_eq!(
            coalesce_ranges(ranges.clone(), 44 * P, 2),
            [(P, 13 * P), (40 * P, 4 * P)]
        );
        assert_eq!(coalesce_ranges(ranges, 44 * P, 1), [(P, 43 * P)]);
        assert!(coalesce_ranges(vec![(50 * P, P)], 44 * P, 4).is_empty());

        let region = RegionInfo {
            name: "pmem0".into(),
            gpa: 1 << 32,
            size: 16 * P,
            host_addr: 1 << 40,
            kind: RegionKind::External,
            kvm_readonly: vec![(0, 2 * P), (8 * P, 8 * P)],
        };
        let pieces: Vec<_> = region
            .slot_pieces()
            .iter()
            .map(|p| {
                (
                    p.gpa - region.gpa,
                    p.size,
                    p.host_addr - region.host_addr,
                    p.readonly,
                )
            })
            .collect();
        assert_eq!(
            pieces,
            [
                (0, 2 * P, 0, true),
                (2 * P, 6 * P, 2 * P, false),
                (8 * P, 8 * P, 8 * P, true)
            ]
        );
        let plain = RegionInfo {
            kvm_readonly: Vec::new(),
            ..region
        };
        assert_eq!(plain.slot_pieces().len(), 1);
        assert!(!plain.slot_pieces()[0].readonly);
    }
}
