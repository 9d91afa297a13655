//! ELF64 vmlinux: PT_LOAD segments and the PVH entry note.

use crate::error::{bytes_at, u16_at, u32_at, u64_at};
use crate::KernelError;
use serde::Serialize;

/// The ELF magic bytes.
pub(crate) const ELF_MAGIC: &[u8] = b"\x7fELF";
/// Host page size used for the mmap-ability check of segments.
pub const PAGE_SIZE: u64 = 4096;

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
/// Upper bound on program headers (vmlinux has about 5).
const MAX_PHNUM: usize = 256;
/// XEN_ELFNOTE_PHYS32_ENTRY, the PVH 32-bit entry point.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// Segment permission bits (`p_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SegmentFlags(pub u32);

impl SegmentFlags {
    /// True when the segment is executable (PF_X).
    pub fn executable(self) -> bool {
        self.0 & 1 != 0
    }
    /// True when the segment is writable (PF_W).
    pub fn writable(self) -> bool {
        self.0 & 2 != 0
    }
    /// True when the segment is readable (PF_R).
    pub fn readable(self) -> bool {
        self.0 & 4 != 0
    }
    /// "rwx"-style text.
    pub fn as_rwx(self) -> String {
        [
            (self.readable(), 'r'),
            (self.writable(), 'w'),
            (self.executable(), 'x'),
        ]
        .iter()
        .map(|&(set, c)| if set { c } else { '-' })
        .collect()
    }
}

/// One PT_LOAD segment: `filesz` bytes from file offset `offset` go to guest-physical
/// `paddr`, followed by `memsz - filesz` zero bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LoadSegment {
    /// Guest-physical load address.
    pub paddr: u64,
    /// Virtual address (informational).
    pub vaddr: u64,
    /// File offset of the segment's bytes.
    pub offset: u64,
    /// Bytes present in the file.
    pub filesz: u64,
    /// Bytes in memory (the tail beyond `filesz` is zero).
    pub memsz: u64,
    /// Permission bits.
    pub flags: SegmentFlags,
    /// `p_align`.
    pub align: u64,
}

impl LoadSegment {
    /// True when the file bytes can be mmap'd straight to `paddr`: the file offset and
    /// the physical address share their offset within a page.
    pub fn mappable(&self) -> bool {
        self.offset % PAGE_SIZE == self.paddr % PAGE_SIZE
    }
}

/// What a VMM needs from an ELF vmlinux.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ElfKernel {
    /// `e_entry` (a virtual address for vmlinux).
    pub entry: u64,
    /// PT_LOAD segments in program header order.
    pub segments: Vec<LoadSegment>,
    /// The PVH 32-bit entry point (XEN_ELFNOTE_PHYS32_ENTRY), if present.
    pub pvh_entry: Option<u64>,
}

impl ElfKernel {
    /// Lowest guest-physical address of any segment.
    pub fn load_start(&self) -> u64 {
        self.segments.iter().map(|s| s.paddr).min().unwrap_or(0)
    }
    /// End (exclusive) of the highest segment in guest-physical memory.
    pub fn load_end(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| s.paddr + s.memsz)
            .max()
            .unwrap_or(0)
    }
}

/// Parses and validates the x86_64 ELF kernel in `data` (the whole file).
pub fn parse_elf(data: &[u8]) -> Result<ElfKernel, KernelError> {
    let ident = bytes_at::<16>(data, 0, "ELF header")?;
    if &ident[..4] != ELF_MAGIC {
        return Err(KernelError::BadMagic {
            what: "ELF file",
            offset: 0,
            expected: "7f 45 4c 46".into(),
            found: crate::error::hex_prefix(&ident[..4]),
        });
    }
    if ident[4] != ELFCLASS64 {
        return Err(KernelError::UnsupportedElf(format!(
            "class {} is not ELFCLASS64",
            ident[4]
        )));
    }
    if ident[5] != ELFDATA2LSB {
        return Err(KernelError::UnsupportedElf(format!(
            "data encoding {} is not little-endian",
            ident[5]
        )));
    }
    bytes_at::<EHDR_SIZE>(data, 0, "ELF header")?;
    let e_type = u16_at(data, 16, "ELF header")?;
    if e_type != ET_EXEC && e_type != ET_DYN {
        return Err(KernelError::UnsupportedElf(format!(
            "type {e_type} is not an executable"
        )));
    }
    let machine = u16_at(data, 18, "ELF header")?;
    if machine != EM_X86_64 {
        return Err(KernelError::UnsupportedElf(format!(
            "machine {machine} is not x86_64 (62)"
        )));
    }
    let entry = u64_at(data, 24, "ELF header")?;
    let phoff = u64_at(data, 32, "ELF header")?;
    let phentsize = u16_at(data, 54, "ELF header")? as usize;
    let phnum = u16_at(data, 56, "ELF header")? as usize;
    if phentsize != PHDR_SIZE {
        return Err(KernelError::UnsupportedElf(format!(
            "program header size {phentsize}, expected {PHDR_SIZE}"
        )));
    }
    if phnum == 0 || phnum > MAX_PHNUM {
        return Err(KernelError::UnsupportedElf(format!(
            "{phnum} program headers (1..={MAX_PHNUM} allowed)"
        )));
    }
    let len = data.len() as u64;
    let table_end = phoff.checked_add((phnum * PHDR_SIZE) as u64);
    if table_end.is_none_or(|end| end > len) {
        return Err(KernelError::Truncated {
            what: "ELF program header table",
            offset: phoff,
            needed: (phnum * PHDR_SIZE) as u64,
            len,
        });
    }
    let mut segments = Vec::new();
    let mut pvh_entry = None;
    for index in 0..phnum {
        let base = phoff as usize + index * PHDR_SIZE;
        let p_type = u32_at(data, base, "program header")?;
        let flags = SegmentFlags(u32_at(data, base + 4, "program header")?);
        let offset = u64_at(data, base + 8, "program header")?;
        let vaddr = u64_at(data, base + 16, "program header")?;
        let paddr = u64_at(data, base + 24, "program header")?;
        let filesz = u64_at(data, base + 32, "program header")?;
        let memsz = u64_at(data, base + 40, "program header")?;
        let align = u64_at(data, base + 48, "program header")?;
        let bad = |reason: String| KernelError::BadSegment { index, reason };
        if offset.checked_add(filesz).is_none_or(|end| end > len) {
            return Err(bad(format!(
                "file range {offset:#x}+{filesz:#x} lies outside the {len}-byte file"
            )));
        }
        match p_type {
            PT_LOAD => {
                if filesz > memsz {
                    return Err(bad(format!("filesz {filesz:#x} exceeds memsz {memsz:#x}")));
                }
                if paddr.checked_add(memsz).is_none() {
                    return Err(bad(format!("paddr {paddr:#x}+{memsz:#x} overflows")));
                }
                segments.push(LoadSegment {
                    paddr,
                    vaddr,
                    offset,
                    filesz,
                    memsz,
                    flags,
                    align,
                });
            }
            PT_NOTE => {
                // In bounds: checked above against the slice length.
                let notes = &data[offset as usize..(offset + filesz) as usize];
                if let Some(found) = find_pvh_note(notes, offset)? {
                    pvh_entry = Some(found);
                }
            }
            _ => {}
        }
    }
    if segments.is_empty() {
        return Err(KernelError::NoLoadSegments);
    }
    let mut sorted: Vec<(usize, &LoadSegment)> = segments.iter().enumerate().collect();
    sorted.sort_by_key(|(_, s)| s.paddr);
    for pair in sorted.windows(2) {
        let ((_, a), (index, b)) = (pair[0], pair[1]);
        if a.memsz > 0 && b.memsz > 0 && a.paddr + a.memsz > b.paddr {
            return Err(KernelError::BadSegment {
                index,
                reason: format!(
                    "paddr {:#x}+{:#x} overlaps the segment at {:#x}+{:#x}",
                    b.paddr, b.memsz, a.paddr, a.memsz
                ),
            });
        }
    }
    Ok(ElfKernel {
        entry,
        segments,
        pvh_entry,
    })
}

/// Walks the notes of one PT_NOTE segment (`base` = its file offset) for the PVH entry.
fn find_pvh_note(notes: &[u8], base: u64) -> Result<Option<u64>, KernelError> {
    let align4 = |n: usize| n.checked_add(3).map(|v| v & !3);
    let mut pos = 0usize;
    while pos < notes.len() {
        let at = base + pos as u64;
        let bad = |reason: &str| KernelError::BadNote {
            offset: at,
            reason: reason.to_string(),
        };
        if notes.len() - pos < 12 {
            return Err(bad("note header runs past the segment"));
        }
        let namesz = u32_at(notes, pos, "ELF note")? as usize;
        let descsz = u32_at(notes, pos + 4, "ELF note")? as usize;
        let n_type = u32_at(notes, pos + 8, "ELF note")?;
        let name_start = pos + 12;
        let desc_start = align4(namesz)
            .and_then(|n| name_start.checked_add(n))
            .ok_or_else(|| bad("name size overflows"))?;
        let next = align4(descsz)
            .and_then(|d| desc_start.checked_add(d))
            .ok_or_else(|| bad("descriptor size overflows"))?;
        if desc_start
            .checked_add(descsz)
            .is_none_or(|end| end > notes.len())
        {
            return Err(bad("name or descriptor runs past the segment"));
        }
        let name = &notes[name_start..name_start + namesz];
        if name == b"Xen\0" && n_type == XEN_ELFNOTE_PHYS32_ENTRY {
            let desc = &notes[desc_start..desc_start + descsz];
            let entry = match descsz {
                4 => u64::from(u32_at(desc, 0, "PVH note")?),
                8 => u64_at(desc, 0, "PVH note")?,
                _ => return Err(bad("PVH entry descriptor is neither 4 nor 8 bytes")),
            };
            return Ok(Some(entry));
        }
        pos = next.min(notes.len());
    }
    Ok(None)
}

/// The PT_LOAD segments of the ELF kernel in `data`.
pub fn load_segments(data: &[u8]) -> Result<Vec<LoadSegment>, KernelError> {
    parse_elf(data).map(|k| k.segments)
}

/// The PVH entry point (guest-physical) of the ELF kernel in `data`.
pub fn pvh_entry(data: &[u8]) -> Result<u64, KernelError> {
    parse_elf(data)?.pvh_entry.ok_or(KernelError::NoPvhEntry)
}
