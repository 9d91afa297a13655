//! Linux kernel images for densevm.
//!
//! * [`read_bzimage_header`] validates an x86 bzImage setup header and locates its
//!   compressed payload.
//! * [`extract_vmlinux`] decompresses that payload (XZ, gzip or legacy LZ4) into the
//!   ELF `vmlinux` and validates it.
//! * [`parse_elf`], [`load_segments`] and [`pvh_entry`] read what a VMM needs to map an
//!   ELF vmlinux into guest memory and enter it through the PVH boot protocol.
//!
//! Every function takes the whole file as a byte slice (an `mmap` of the file is fine)
//! and reports malformed input as a [`KernelError`]; none of them panics on bad input.

mod bzimage;
mod decompress;
mod elf;
mod error;

pub use bzimage::{read_bzimage_header, BzImageHeader, Compression, XloadFlags};
pub use decompress::{
    extract_vmlinux, extract_vmlinux_with_progress, ExtractProgress, MAX_VMLINUX_SIZE,
};
pub use elf::{
    load_segments, parse_elf, pvh_entry, ElfKernel, LoadSegment, SegmentFlags, PAGE_SIZE,
};
pub use error::KernelError;

/// What kind of kernel image a file holds, judged from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelFormat {
    /// An x86 bzImage (boot sector signature and `HdrS` setup header).
    BzImage,
    /// An ELF file (e.g. an uncompressed `vmlinux`).
    Elf,
    /// Neither.
    Unknown,
}

/// Detects whether `data` looks like a bzImage or an ELF file (no full validation).
pub fn detect_format(data: &[u8]) -> KernelFormat {
    if data.starts_with(elf::ELF_MAGIC) {
        KernelFormat::Elf
    } else if bzimage::has_bzimage_signature(data) {
        KernelFormat::BzImage
    } else {
        KernelFormat::Unknown
    }
}
