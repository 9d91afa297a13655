//! Booting Linux: a PVH ELF vmlinux whose PT_LOAD segments are mapped `MAP_PRIVATE`
//! straight from the file (so every VM using the same file shares the pages it never
//! writes), or a bzImage through the 64-bit boot protocol; an initrd mapped the same way;
//! the e820 map, command line and ACPI tables. With [`BootImages::Copied`] (always under a
//! memory budget) the kernel and initrd are copied into guest RAM instead, so that no guest
//! memory lies outside it.

use super::EntryState;
use crate::arch::{acpi, firmware_tables, gdt, paging, regs};
use crate::config::BootImages;
use crate::memory::{ram_with_windows, Backing, RegionSpec};
use densevm_kernel::{parse_elf, read_bzimage_header};
use kvm_bindings::{kvm_regs, kvm_sregs};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const PAGE: u64 = 4096;
/// Where the PVH `hvm_start_info` goes.
pub const START_INFO_ADDR: u64 = 0x6000;
/// Where the PVH module list goes.
pub const MODLIST_ADDR: u64 = 0x6800;
/// Where the PVH memory map goes.
pub const MEMMAP_ADDR: u64 = 0x6a00;
/// Where the bzImage zero page (`boot_params`) goes.
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Where the kernel command line goes.
pub const CMDLINE_ADDR: u64 = 0x2_0000;
/// Longest command line accepted (including the NUL).
pub const CMDLINE_MAX: usize = 0x1_0000;
/// Initial stack for the bzImage 64-bit entry.
const BOOT_STACK: u64 = 0x8ff0;
/// Start of the legacy EBDA hole.
const EBDA_START: u64 = 0x9_fc00;
/// e820 entries that fit in the PVH memory map between `MEMMAP_ADDR` and the zero page
/// (the zero page's own table holds 128).
const E820_MAX_ENTRIES: usize = ((ZERO_PAGE_ADDR - MEMMAP_ADDR) / 24) as usize;
const _: () = assert!(
    E820_MAX_ENTRIES >= 32,
    "room for RAM plus dozens of pmem regions"
);
/// Highest address an initrd may end at (the kernel's `initrd_addr_max`).
const INITRD_MAX_END: u64 = 0x8000_0000;

/// Failure to prepare a Linux boot.
#[derive(Debug, Error)]
pub enum LinuxBootError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Io {
        /// `kernel` or `initrd`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The kernel is neither a usable ELF nor a bzImage.
    #[error("{path} is not a bootable kernel: {reason}")]
    BadKernel {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Not enough memory for what must be placed.
    #[error("{what} does not fit in guest memory ({detail}); give the VM more --memory")]
    TooLarge {
        /// What did not fit.
        what: &'static str,
        /// Sizes involved.
        detail: String,
    },
    /// Bad command line.
    #[error("invalid kernel command line: {0}")]
    Cmdline(String),
    /// Writing into guest memory failed.
    #[error("writing boot data into guest memory failed: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    /// linux-loader rejected the bzImage.
    #[error("loading the bzImage failed: {0}")]
    Loader(String),
}

/// How the kernel is entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelEntry {
    /// PVH: 32-bit protected mode, paging off, EBX = start_info.
    Pvh(u64),
    /// bzImage 64-bit protocol: long mode, RSI = zero page.
    Bz64(u64),
}

/// A planned Linux guest: memory regions (with the file-backed windows) and what to
/// write into them once mapped.
pub struct LinuxPlan {
    /// Guest memory regions covering RAM, with kernel/initrd windows cut out of it.
    pub regions: Vec<RegionSpec>,
    /// Kernel file bytes to copy after mapping (partial pages of segments; the bzImage
    /// kernel), as (guest address, range of the file), read from `view` when written.
    copies: Vec<(u64, Range<usize>)>,
    /// The kernel file, mapped read-only until the copies are written.
    view: FileView,
    /// Entry point.
    pub entry: KernelEntry,
    /// Initrd location and length.
    pub initrd: Option<(u64, u64)>,
    /// The initrd file, mapped read-only until it is copied into RAM ([`BootImages::Copied`]).
    initrd_view: Option<FileView>,
    /// bzImage setup header (0x1f1.. of the file), for the zero page.
    bz_setup: Option<Range<usize>>,
    /// RAM layout: (low RAM end, high RAM size).
    ram: (u64, u64),
}

fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> LinuxBootError + 'a {
    move |source| LinuxBootError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Read-only view of a whole file (an mmap: only the pages parsed are read).
struct FileView {
    ptr: *mut libc::c_void,
    len: usize,
}

impl FileView {
    fn new(file: &File, len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "file is empty",
            ));
        }
        // SAFETY: mapping `len` bytes of an open file read-only; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(file),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes long, readable, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for FileView {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `new`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn file_window(name: String, gpa: u64, size: u64, file: &Arc<File>, offset: u64) -> RegionSpec {
    RegionSpec {
        name,
        gpa,
        size,
        backing: Backing::FilePrivate {
            file: file.clone(),
            offset,
        },
    }
}

/// Plans the memory of a Linux guest with `low_end` bytes of RAM below the 32-bit hole
/// and `high` bytes above 4 GiB, its boot images mapped or copied as `images` says.
pub fn plan(
    kernel: &Path,
    initrd: Option<&Path>,
    images: BootImages,
    low_end: u64,
    high: u64,
    high_start: u64,
) -> Result<LinuxPlan, LinuxBootError> {
    let mapped = images == BootImages::Mapped;
    let file = Arc::new(File::open(kernel).map_err(io("kernel", kernel))?);
    let len = file.metadata().map_err(io("kernel", kernel))?.len() as usize;
    let view = FileView::new(&file, len).map_err(io("kernel", kernel))?;
    let data = view.bytes();
    let bad = |reason: String| LinuxBootError::BadKernel {
        path: kernel.to_path_buf(),
        reason,
    };

    let mut windows = Vec::new();
    let mut copies = Vec::new();
    let (entry, kernel_end, bz_setup) = if data.starts_with(b"\x7fELF") {
        let elf = parse_elf(data).map_err(|e| bad(e.to_string()))?;
        let entry = elf.pvh_entry.ok_or_else(|| {
            bad(
                "the ELF has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); use its bzImage instead"
                    .into(),
            )
        })?;
        let mut end = 0;
        for (i, seg) in elf.segments.iter().enumerate() {
            let seg_end = seg
                .paddr
                .checked_add(seg.memsz)
                .ok_or_else(|| bad("segment overflows".into()))?;
            if seg_end > low_end {
                return Err(LinuxBootError::TooLarge {
                    what: "the kernel",
                    detail: format!(
                        "segment {i} ends at {seg_end:#x}, RAM below 4 GiB ends at {low_end:#x}"
                    ),
                });
            }
            end = end.max(seg_end);
            let file_end = seg.paddr + seg.filesz;
            // Whole pages of file data are mapped from the file; partial head/tail pages
            // are copied; the rest of memsz (bss) is left to zeroed anonymous memory.
            let aligned = seg.offset % PAGE == seg.paddr % PAGE;
            let first = seg.paddr.next_multiple_of(PAGE);
            let last = file_end / PAGE * PAGE;
            if mapped && aligned && last > first {
                windows.push(file_window(
                    format!("kernel.{i}"),
                    first,
                    last - first,
                    &file,
                    seg.offset + (first - seg.paddr),
                ));
                let head = (first - seg.paddr) as usize;
                let off = seg.offset as usize;
                copies.push((seg.paddr, off..off + head));
                let tail_from = off + (last - seg.paddr) as usize;
                copies.push((last, tail_from..off + seg.filesz as usize));
            } else {
                let range = seg.offset as usize..(seg.offset + seg.filesz) as usize;
                if range.end > data.len() {
                    return Err(bad(format!("segment {i} lies outside the file")));
                }
                copies.push((seg.paddr, range));
            }
        }
        (KernelEntry::Pvh(entry), end, None)
    } else {
        let hdr = read_bzimage_header(data)
            .map_err(|e| bad(format!("neither an ELF vmlinux nor a bzImage ({e})")))?;
        if !hdr.xloadflags.kernel_64() {
            return Err(bad(
                "the bzImage has no 64-bit entry point (XLF_KERNEL_64)".into()
            ));
        }
        let load = hdr.pref_address.max(0x100_0000);
        let payload = &data[hdr.kernel_offset as usize..];
        let end = load + u64::from(hdr.init_size).max(payload.len() as u64);
        if end > low_end {
            return Err(LinuxBootError::TooLarge {
                what: "the kernel",
                detail: format!(
                    "it needs RAM up to {end:#x}, RAM below 4 GiB ends at {low_end:#x}"
                ),
            });
        }
        // The bzImage decompresses itself over its own memory: copying it is the only
        // option (and its boot pays the decompression; prefer an extracted vmlinux).
        copies.push((load, hdr.kernel_offset as usize..data.len()));
        let setup_end = (0x202 + usize::from(data[0x201]))
            .min(data.len())
            .max(0x1f1);
        (KernelEntry::Bz64(load + 0x200), end, Some(0x1f1..setup_end))
    };

    let mut initrd_at = None;
    let mut initrd_view = None;
    if let Some(path) = initrd {
        let file = Arc::new(File::open(path).map_err(io("initrd", path))?);
        let size = file.metadata().map_err(io("initrd", path))?.len();
        if size == 0 {
            return Err(LinuxBootError::Io {
                what: "initrd",
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, "file is empty"),
            });
        }
        let pages = size.next_multiple_of(PAGE);
        let top = low_end.min(INITRD_MAX_END);
        let gpa = top
            .checked_sub(pages)
            .map(|g| g / (2 << 20) * (2 << 20))
            .filter(|g| *g >= kernel_end.next_multiple_of(PAGE));
        let gpa = gpa.ok_or_else(|| LinuxBootError::TooLarge {
            what: "the initrd",
            detail: format!(
                "{} KiB initrd, kernel ends at {kernel_end:#x}, usable RAM ends at {top:#x}",
                size >> 10
            ),
        })?;
        if mapped {
            // Beyond EOF inside the last page the mapping reads as zeros, as an initrd must.
            windows.push(file_window("initrd".into(), gpa, pages, &file, 0));
        } else {
            // Copied over RAM, which is zeros past it.
            initrd_view = Some(FileView::new(&file, size as usize).map_err(io("initrd", path))?);
        }
        initrd_at = Some((gpa, size));
    }
    Ok(LinuxPlan {
        regions: ram_with_windows(low_end, high, high_start, windows),
        copies,
        view,
        entry,
        initrd: initrd_at,
        initrd_view,
        bz_setup,
        ram: (low_end, high),
    })
}

/// The e820 map: RAM and the reserved BIOS areas. `--pmem` regions are not in it: they
/// reach Linux as virtio-pmem devices, which name their own range.
fn e820(low_end: u64, high: u64, high_start: u64) -> Vec<(u64, u64, u32)> {
    let mut map = vec![
        (0, EBDA_START, 1),
        (EBDA_START, 0xa_0000 - EBDA_START, 2),
        (acpi::RSDP_ADDR, acpi::ACPI_AREA_END - acpi::RSDP_ADDR, 2),
        (0x10_0000, low_end - 0x10_0000, 1),
    ];
    if high > 0 {
        map.push((high_start, high, 1));
    }
    map
}

fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str) -> Result<(), LinuxBootError> {
    if cmdline.len() >= CMDLINE_MAX {
        return Err(LinuxBootError::Cmdline(format!(
            "{} bytes, at most {} allowed",
            cmdline.len(),
            CMDLINE_MAX - 1
        )));
    }
    if cmdline
        .bytes()
        .any(|b| b == 0 || !(0x20..0x7f).contains(&b))
    {
        return Err(LinuxBootError::Cmdline(
            "only printable ASCII is allowed".into(),
        ));
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))?;
    Ok(())
}

/// Writes everything the kernel needs to find at boot and returns its entry state.
pub fn write_boot_data(
    mem: &GuestMemoryMmap,
    plan: &LinuxPlan,
    cmdline: &str,
    cpus: u32,
    high_start: u64,
) -> Result<LinuxEntry, LinuxBootError> {
    let kernel = plan.view.bytes();
    for (gpa, range) in &plan.copies {
        if !range.is_empty() {
            mem.write_slice(&kernel[range.clone()], GuestAddress(*gpa))?;
        }
    }
    if let (Some(view), Some((gpa, _))) = (&plan.initrd_view, plan.initrd) {
        mem.write_slice(view.bytes(), GuestAddress(gpa))?;
    }
    write_cmdline(mem, cmdline)?;
    for (addr, table) in firmware_tables(cpus) {
        mem.write_slice(&table, GuestAddress(addr))?;
    }
    gdt::write_boot_gdt(mem)?;
    let map = e820(plan.ram.0, plan.ram.1, high_start);
    if map.len() > E820_MAX_ENTRIES {
        return Err(LinuxBootError::Loader(format!(
            "{} memory map entries, at most {E820_MAX_ENTRIES} fit the boot protocol",
            map.len()
        )));
    }
    match plan.entry {
        KernelEntry::Pvh(_) => {
            let mut info = Vec::with_capacity(56);
            info.extend_from_slice(&0x336e_c578u32.to_le_bytes()); // XEN_HVM_START_MAGIC_VALUE
            info.extend_from_slice(&1u32.to_le_bytes()); // version
            info.extend_from_slice(&0u32.to_le_bytes()); // flags
            info.extend_from_slice(&u32::from(plan.initrd.is_some()).to_le_bytes());
            info.extend_from_slice(&MODLIST_ADDR.to_le_bytes());
            info.extend_from_slice(&CMDLINE_ADDR.to_le_bytes());
            info.extend_from_slice(&acpi::RSDP_ADDR.to_le_bytes());
            info.extend_from_slice(&MEMMAP_ADDR.to_le_bytes());
            info.extend_from_slice(&(map.len() as u32).to_le_bytes());
            info.extend_from_slice(&0u32.to_le_bytes());
            mem.write_slice(&info, GuestAddress(START_INFO_ADDR))?;
            if let Some((gpa, size)) = plan.initrd {
                let mut module = Vec::with_capacity(32);
                for v in [gpa, size, 0, 0] {
                    module.extend_from_slice(&v.to_le_bytes());
                }
                mem.write_slice(&module, GuestAddress(MODLIST_ADDR))?;
            }
            for (i, (addr, size, kind)) in map.iter().enumerate() {
                let mut e = Vec::with_capacity(24);
                e.extend_from_slice(&addr.to_le_bytes());
                e.extend_from_slice(&size.to_le_bytes());
                e.extend_from_slice(&kind.to_le_bytes());
                e.extend_from_slice(&0u32.to_le_bytes());
                mem.write_slice(&e, GuestAddress(MEMMAP_ADDR + 24 * i as u64))?;
            }
        }
        KernelEntry::Bz64(_) => {
            let tables = paging::identity_map(4 << 30, false)
                .map_err(|_| LinuxBootError::Loader("page tables".into()))?;
            for (addr, bytes) in tables {
                mem.write_slice(&bytes, GuestAddress(addr))?;
            }
            let mut zero = vec![0u8; 4096];
            let setup = plan.bz_setup.clone().map_or(&[][..], |r| &kernel[r]);
            zero[0x1f1..0x1f1 + setup.len()].copy_from_slice(setup);
            zero[0x210] = 0xff; // type_of_loader: undefined
            zero[0x211] |= 0x01; // loadflags: LOADED_HIGH
            zero[0x228..0x22c].copy_from_slice(&(CMDLINE_ADDR as u32).to_le_bytes());
            zero[0x238..0x23c].copy_from_slice(&((cmdline.len() + 1) as u32).to_le_bytes());
            if let Some((gpa, size)) = plan.initrd {
                zero[0x218..0x21c].copy_from_slice(&(gpa as u32).to_le_bytes());
                zero[0x21c..0x220].copy_from_slice(&(size as u32).to_le_bytes());
            }
            zero[0x070..0x078].copy_from_slice(&acpi::RSDP_ADDR.to_le_bytes()); // acpi_rsdp_addr
            zero[0x1e8] = map.len() as u8; // e820_entries
            for (i, (addr, size, kind)) in map.iter().enumerate() {
                let at = 0x2d0 + 20 * i;
                zero[at..at + 8].copy_from_slice(&addr.to_le_bytes());
                zero[at + 8..at + 16].copy_from_slice(&size.to_le_bytes());
                zero[at + 16..at + 20].copy_from_slice(&kind.to_le_bytes());
            }
            mem.write_slice(&zero, GuestAddress(ZERO_PAGE_ADDR))?;
        }
    }
    Ok(LinuxEntry(plan.entry))
}

/// The boot CPU's entry state for a Linux guest (APs wait for INIT/SIPI from the guest).
pub struct LinuxEntry(pub KernelEntry);

impl EntryState for LinuxEntry {
    fn sregs(&self, _index: u32, defaults: kvm_sregs) -> kvm_sregs {
        match self.0 {
            KernelEntry::Pvh(_) => regs::protected_mode_sregs(defaults),
            KernelEntry::Bz64(_) => regs::long_mode_sregs(defaults),
        }
    }

    fn regs(&self, _index: u32) -> kvm_regs {
        match self.0 {
            KernelEntry::Pvh(entry) => kvm_regs {
                rip: entry,
                rbx: START_INFO_ADDR,
                rflags: 0x2,
                ..Default::default()
            },
            KernelEntry::Bz64(entry) => regs::entry_regs(entry, BOOT_STACK, 0, ZERO_PAGE_ADDR),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_has_low_and_high_ram_and_nothing_above() {
        let map = e820(3 << 30, 1 << 30, 4 << 30);
        assert!(map.iter().any(|e| e.2 == 1 && e.0 == 0x10_0000));
        assert!(map.contains(&(4 << 30, 1 << 30, 1)));
        assert!(map.iter().all(|e| e.0 + e.1 <= 5 << 30));
    }

    /// A PVH ELF whose one PT_LOAD segment is two pages of `0xab` at 16 MiB.
    fn pvh_elf() -> Vec<u8> {
        let mut f = vec![0u8; 0x3000];
        let mut put = |at: usize, v: &[u8]| f[at..at + v.len()].copy_from_slice(v);
        put(0, b"\x7fELF\x02\x01\x01");
        put(16, &[2, 0, 62, 0, 1, 0, 0, 0]); // ET_EXEC, x86_64, version 1
        put(24, &0x100_0000u64.to_le_bytes()); // entry
        put(32, &64u64.to_le_bytes()); // program headers
        put(52, &[64, 0, 56, 0, 2, 0]); // their sizes and count

        // PT_LOAD: offset, vaddr, paddr, filesz, memsz, align; PT_NOTE at 0x200, 24 bytes.
        for (at, kind, fields) in [
            (
                64,
                1u32,
                [0x1000, 0x100_0000, 0x100_0000, 0x2000, 0x2000, 0x1000],
            ),
            (120, 4, [0x200, 0, 0, 24, 24, 4]),
        ] {
            put(at, &kind.to_le_bytes());
            put(at + 4, &5u32.to_le_bytes());
            for (i, v) in fields.iter().enumerate() {
                put(at + 8 + 8 * i, &u64::to_le_bytes(*v));
            }
        }
        // XEN_ELFNOTE_PHYS32_ENTRY: namesz 4, descsz 4, type 18, "Xen", the entry.
        for (i, v) in [4u32, 4, 18, u32::from_le_bytes(*b"Xen\0"), 0x100_0000]
            .iter()
            .enumerate()
        {
            put(0x200 + 4 * i, &v.to_le_bytes());
        }
        f[0x1000..].fill(0xab);
        f
    }

    #[test]
    fn boot_images_are_mapped_or_copied_into_ram() {
        let dir = std::env::temp_dir().join(format!("densevm-images-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (kernel, initrd) = (dir.join("vmlinux"), dir.join("initrd"));
        std::fs::write(&kernel, pvh_elf()).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&initrd, &data).unwrap();
        let low = 64 << 20;
        let names = |p: &LinuxPlan| p.regions.iter().map(|r| r.name.clone()).collect::<Vec<_>>();

        let mapped = plan(&kernel, Some(&initrd), BootImages::Mapped, low, 0, 4 << 30).unwrap();
        assert_eq!(
            names(&mapped),
            ["ram", "kernel.0", "ram.1", "initrd", "ram.2"],
            "mapped: the images are windows cut out of RAM"
        );

        let copied = plan(&kernel, Some(&initrd), BootImages::Copied, low, 0, 4 << 30).unwrap();
        assert_eq!(names(&copied), ["ram"], "copied: RAM is whole");
        let (gpa, len) = copied.initrd.unwrap();
        assert_eq!(len, data.len() as u64);
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), low as usize)]).unwrap();
        write_boot_data(&mem, &copied, "console=ttyS0", 1, 4 << 30).unwrap();
        let mut back = vec![0u8; data.len() + 100];
        mem.read_slice(&mut back, GuestAddress(gpa)).unwrap();
        assert_eq!(&back[..data.len()], &data[..], "the initrd's bytes in RAM");
        assert!(
            back[data.len()..].iter().all(|&b| b == 0),
            "zeros past its end"
        );
        let mut seg = vec![0u8; 0x2000];
        mem.read_slice(&mut seg, GuestAddress(0x100_0000)).unwrap();
        assert!(
            seg.iter().all(|&b| b == 0xab),
            "the kernel's whole segment in RAM"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_kernels_are_rejected() {
        let dir = std::env::temp_dir().join(format!("densevm-linux-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk");
        std::fs::write(&junk, vec![0x55u8; 8192]).unwrap();
        let err = plan(&junk, None, BootImages::Mapped, 256 << 20, 0, 4 << 30)
            .err()
            .unwrap();
        assert!(err.to_string().contains("not a bootable kernel"), "{err}");
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(plan(&empty, None, BootImages::Mapped, 256 << 20, 0, 4 << 30).is_err());
        assert!(plan(
            &dir.join("missing"),
            None,
            BootImages::Mapped,
            256 << 20,
            0,
            4 << 30
        )
        .err()
        .unwrap()
        .to_string()
        .contains("cannot read kernel"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
