//! The error type of this crate.

use crate::Compression;

/// Everything that can be wrong with a kernel image.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The file ends before a structure that must be present.
    #[error("truncated {what}: need {needed} bytes at offset {offset:#x}, file has {len}")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// Its offset in the file.
        offset: u64,
        /// Bytes needed from that offset.
        needed: u64,
        /// The file length.
        len: u64,
    },
    /// A magic number or signature does not match.
    #[error("not a {what}: expected magic {expected} at offset {offset:#x}, found {found}")]
    BadMagic {
        /// The format being checked.
        what: &'static str,
        /// Offset of the magic.
        offset: u64,
        /// The expected bytes, in hex.
        expected: String,
        /// The bytes found, in hex.
        found: String,
    },
    /// The bzImage boot protocol is too old to describe its payload.
    #[error("bzImage boot protocol {major}.{minor:02} is too old: densevm needs 2.08 or later (payload_offset)")]
    ProtocolTooOld {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// The bzImage payload does not lie inside the file.
    #[error("bzImage payload at {offset:#x} (+{length:#x}) lies outside the {len}-byte file")]
    PayloadOutOfBounds {
        /// Absolute file offset of the payload.
        offset: u64,
        /// Payload length from the header.
        length: u64,
        /// File length.
        len: u64,
    },
    /// The payload's first bytes match no known kernel compression.
    #[error("unknown bzImage payload compression (first bytes {magic})")]
    UnknownCompression {
        /// The first payload bytes, in hex.
        magic: String,
    },
    /// The payload uses a compression this crate does not decode.
    #[error("bzImage payload is {0} compressed; densevm decodes xz, gzip and lz4 (use the Debian generic amd64 kernel, which is xz)")]
    UnsupportedCompression(Compression),
    /// The compressed stream is corrupt or truncated.
    #[error("corrupt {compression} stream after {output_bytes} output bytes: {source}")]
    Decompress {
        /// The compression of the payload.
        compression: Compression,
        /// Bytes decompressed before the failure.
        output_bytes: u64,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// The decompressed kernel exceeds [`crate::MAX_VMLINUX_SIZE`].
    #[error("decompressed kernel exceeds the {limit}-byte limit (corrupt or hostile payload)")]
    OutputTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// An ELF header field has a value this loader cannot use.
    #[error("unsupported ELF: {0}")]
    UnsupportedElf(String),
    /// An ELF program header is inconsistent.
    #[error("bad ELF program header {index}: {reason}")]
    BadSegment {
        /// Index in the program header table.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The ELF has no PT_LOAD segment.
    #[error("ELF has no PT_LOAD segment")]
    NoLoadSegments,
    /// A note in a PT_NOTE segment is malformed.
    #[error("malformed ELF note at file offset {offset:#x}: {reason}")]
    BadNote {
        /// File offset of the note header.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The ELF has no XEN_ELFNOTE_PHYS32_ENTRY note, so it cannot be PVH-booted.
    #[error("ELF has no PVH entry note (Xen note type 18, XEN_ELFNOTE_PHYS32_ENTRY); boot the bzImage instead or use a kernel with CONFIG_PVH=y")]
    NoPvhEntry,
}

/// Formats up to 8 bytes as hex for error messages.
pub(crate) fn hex_prefix(bytes: &[u8]) -> String {
    let shown: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    if shown.is_empty() {
        "(nothing)".to_string()
    } else {
        shown.join(" ")
    }
}

/// Reads `N` bytes at `offset`, or reports which structure was truncated.
pub(crate) fn bytes_at<const N: usize>(
    data: &[u8],
    offset: usize,
    what: &'static str,
) -> Result<[u8; N], KernelError> {
    offset
        .checked_add(N)
        .and_then(|end| data.get(offset..end))
        .map(|s| {
            let mut out = [0u8; N];
            out.copy_from_slice(s);
            out
        })
        .ok_or(KernelError::Truncated {
            what,
            offset: offset as u64,
            needed: N as u64,
            len: data.len() as u64,
        })
}

/// Little-endian u16 at `offset`.
pub(crate) fn u16_at(data: &[u8], offset: usize, what: &'static str) -> Result<u16, KernelError> {
    bytes_at::<2>(data, offset, what).map(u16::from_le_bytes)
}

/// Little-endian u32 at `offset`.
pub(crate) fn u32_at(data: &[u8], offset: usize, what: &'static str) -> Result<u32, KernelError> {
    bytes_at::<4>(data, offset, what).map(u32::from_le_bytes)
}

/// Little-endian u64 at `offset`.
pub(crate) fn u64_at(data: &[u8], offset: usize, what: &'static str) -> Result<u64, KernelError> {
    bytes_at::<8>(data, offset, what).map(u64::from_le_bytes)
}
