//! The x86 bzImage setup header (Documentation/arch/x86/boot.rst).

use crate::error::{bytes_at, hex_prefix, u16_at, u32_at, u64_at};
use crate::KernelError;
use serde::Serialize;

const BOOT_FLAG_OFFSET: usize = 0x1fe;
const BOOT_FLAG: u16 = 0xaa55;
const HEADER_MAGIC_OFFSET: usize = 0x202;
const HEADER_MAGIC: &[u8; 4] = b"HdrS";
const SETUP_SECTS_OFFSET: usize = 0x1f1;
const VERSION_OFFSET: usize = 0x206;
const LOADFLAGS_OFFSET: usize = 0x211;
const KERNEL_ALIGNMENT_OFFSET: usize = 0x230;
const RELOCATABLE_OFFSET: usize = 0x234;
const XLOADFLAGS_OFFSET: usize = 0x236;
const CMDLINE_SIZE_OFFSET: usize = 0x238;
const PAYLOAD_OFFSET_OFFSET: usize = 0x248;
const PAYLOAD_LENGTH_OFFSET: usize = 0x24c;
const PREF_ADDRESS_OFFSET: usize = 0x258;
const INIT_SIZE_OFFSET: usize = 0x260;
/// Oldest protocol with payload_offset/payload_length.
const MIN_PROTOCOL: u16 = 0x0208;
const LOADED_HIGH: u8 = 0x01;

/// How the bzImage payload is compressed (from its magic bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// XZ (`FD 37 7A 58 5A 00`), the Debian generic kernel's choice.
    Xz,
    /// gzip (`1F 8B`).
    Gzip,
    /// LZ4 legacy frames (`02 21 4C 18`), used by the Debian cloud kernel.
    Lz4,
    /// Zstandard (`28 B5 2F FD`); recognised, not decoded.
    Zstd,
    /// bzip2 (`BZh`); recognised, not decoded.
    Bzip2,
    /// LZMA alone (`5D 00 00`); recognised, not decoded.
    Lzma,
    /// LZO (`89 LZO`); recognised, not decoded.
    Lzo,
    /// An uncompressed ELF payload.
    None,
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Compression::Xz => "xz",
            Compression::Gzip => "gzip",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Bzip2 => "bzip2",
            Compression::Lzma => "lzma",
            Compression::Lzo => "lzo",
            Compression::None => "uncompressed",
        };
        f.write_str(name)
    }
}

impl Compression {
    /// Identifies the compression from the payload's first bytes.
    pub fn detect(payload: &[u8]) -> Result<Compression, KernelError> {
        const MAGICS: &[(&[u8], Compression)] = &[
            (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], Compression::Xz),
            (&[0x1f, 0x8b], Compression::Gzip),
            (&[0x02, 0x21, 0x4c, 0x18], Compression::Lz4),
            (&[0x28, 0xb5, 0x2f, 0xfd], Compression::Zstd),
            (b"BZh", Compression::Bzip2),
            (&[0x5d, 0x00, 0x00], Compression::Lzma),
            (&[0x89, b'L', b'Z', b'O'], Compression::Lzo),
            (crate::elf::ELF_MAGIC, Compression::None),
        ];
        MAGICS
            .iter()
            .find(|(magic, _)| payload.starts_with(magic))
            .map(|(_, c)| *c)
            .ok_or_else(|| KernelError::UnknownCompression {
                magic: hex_prefix(payload),
            })
    }
}

/// The `xloadflags` bits of the setup header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct XloadFlags(pub u16);

impl XloadFlags {
    /// XLF_KERNEL_64: the kernel has the 64-bit entry point at load address + 0x200.
    pub const KERNEL_64: u16 = 1 << 0;
    /// XLF_CAN_BE_LOADED_ABOVE_4G.
    pub const CAN_BE_LOADED_ABOVE_4G: u16 = 1 << 1;
    /// XLF_EFI_HANDOVER_32.
    pub const EFI_HANDOVER_32: u16 = 1 << 2;
    /// XLF_EFI_HANDOVER_64.
    pub const EFI_HANDOVER_64: u16 = 1 << 3;
    /// XLF_EFI_KEXEC.
    pub const EFI_KEXEC: u16 = 1 << 4;
    /// XLF_5LEVEL.
    pub const FIVE_LEVEL: u16 = 1 << 5;
    /// XLF_5LEVEL_ENABLED.
    pub const FIVE_LEVEL_ENABLED: u16 = 1 << 6;

    /// True when the 64-bit boot protocol entry exists.
    pub fn kernel_64(self) -> bool {
        self.0 & Self::KERNEL_64 != 0
    }

    /// The names of the set flags, for humans.
    pub fn names(self) -> Vec<&'static str> {
        const NAMES: &[(u16, &str)] = &[
            (XloadFlags::KERNEL_64, "KERNEL_64"),
            (XloadFlags::CAN_BE_LOADED_ABOVE_4G, "CAN_BE_LOADED_ABOVE_4G"),
            (XloadFlags::EFI_HANDOVER_32, "EFI_HANDOVER_32"),
            (XloadFlags::EFI_HANDOVER_64, "EFI_HANDOVER_64"),
            (XloadFlags::EFI_KEXEC, "EFI_KEXEC"),
            (XloadFlags::FIVE_LEVEL, "5LEVEL"),
            (XloadFlags::FIVE_LEVEL_ENABLED, "5LEVEL_ENABLED"),
        ];
        NAMES
            .iter()
            .filter(|(bit, _)| self.0 & bit != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// The parts of a bzImage setup header a VMM needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BzImageHeader {
    /// Boot protocol version, e.g. 0x020f for 2.15.
    pub protocol_version: u16,
    /// Number of 512-byte setup sectors after the boot sector.
    pub setup_sects: u8,
    /// File offset of the protected-mode kernel: `(setup_sects + 1) * 512`.
    pub kernel_offset: u64,
    /// Absolute file offset of the compressed payload.
    pub payload_offset: u64,
    /// Length of the compressed payload in bytes.
    pub payload_length: u64,
    /// How the payload is compressed.
    pub compression: Compression,
    /// The `xloadflags` field.
    pub xloadflags: XloadFlags,
    /// `loadflags & LOADED_HIGH`: protected-mode code loads at 1 MiB.
    pub loaded_high: bool,
    /// The kernel can be loaded at any `kernel_alignment`-aligned address.
    pub relocatable: bool,
    /// Required alignment of a relocated kernel.
    pub kernel_alignment: u32,
    /// Preferred load address.
    pub pref_address: u64,
    /// Memory the kernel needs from its load address during decompression and boot.
    pub init_size: u32,
    /// Maximum command line length, excluding the NUL.
    pub cmdline_size: u32,
}

impl BzImageHeader {
    /// The protocol version as "major.minor".
    pub fn protocol_string(&self) -> String {
        format!(
            "{}.{:02}",
            self.protocol_version >> 8,
            self.protocol_version & 0xff
        )
    }
}

/// True when `data` carries the boot sector flag and the `HdrS` magic.
pub(crate) fn has_bzimage_signature(data: &[u8]) -> bool {
    u16_at(data, BOOT_FLAG_OFFSET, "").ok() == Some(BOOT_FLAG)
        && data.get(HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4) == Some(HEADER_MAGIC)
}

/// Parses and validates the setup header of the bzImage in `data` (the whole file).
pub fn read_bzimage_header(data: &[u8]) -> Result<BzImageHeader, KernelError> {
    let boot_flag = u16_at(data, BOOT_FLAG_OFFSET, "boot sector")?;
    if boot_flag != BOOT_FLAG {
        return Err(KernelError::BadMagic {
            what: "bzImage boot sector",
            offset: BOOT_FLAG_OFFSET as u64,
            expected: "55 aa".into(),
            found: hex_prefix(&boot_flag.to_le_bytes()),
        });
    }
    let magic = bytes_at::<4>(data, HEADER_MAGIC_OFFSET, "setup header")?;
    if &magic != HEADER_MAGIC {
        return Err(KernelError::BadMagic {
            what: "bzImage setup header",
            offset: HEADER_MAGIC_OFFSET as u64,
            expected: "48 64 72 53 (HdrS)".into(),
            found: hex_prefix(&magic),
        });
    }
    let version = u16_at(data, VERSION_OFFSET, "setup header")?;
    if version < MIN_PROTOCOL {
        return Err(KernelError::ProtocolTooOld {
            major: (version >> 8) as u8,
            minor: (version & 0xff) as u8,
        });
    }
    let setup_sects = bytes_at::<1>(data, SETUP_SECTS_OFFSET, "setup header")?[0];
    // A zero count means 4 (boot.rst, "setup_sects").
    let sects = if setup_sects == 0 {
        4
    } else {
        u64::from(setup_sects)
    };
    let kernel_offset = (sects + 1) * 512;
    let payload_rel = u32_at(data, PAYLOAD_OFFSET_OFFSET, "setup header")?;
    let payload_length = u64::from(u32_at(data, PAYLOAD_LENGTH_OFFSET, "setup header")?);
    let payload_offset = kernel_offset + u64::from(payload_rel);
    let len = data.len() as u64;
    if payload_length == 0 || payload_offset.saturating_add(payload_length) > len {
        return Err(KernelError::PayloadOutOfBounds {
            offset: payload_offset,
            length: payload_length,
            len,
        });
    }
    // In bounds: both fit in the slice, so they fit in usize.
    let payload = &data[payload_offset as usize..(payload_offset + payload_length) as usize];
    let compression = Compression::detect(payload)?;
    let optional_u64 = |min: u16, offset| -> Result<u64, KernelError> {
        if version >= min {
            u64_at(data, offset, "setup header")
        } else {
            Ok(0)
        }
    };
    let optional_u32 = |min: u16, offset| -> Result<u32, KernelError> {
        if version >= min {
            u32_at(data, offset, "setup header")
        } else {
            Ok(0)
        }
    };
    Ok(BzImageHeader {
        protocol_version: version,
        setup_sects,
        kernel_offset,
        payload_offset,
        payload_length,
        compression,
        xloadflags: XloadFlags(if version >= 0x020c {
            u16_at(data, XLOADFLAGS_OFFSET, "setup header")?
        } else {
            0
        }),
        loaded_high: bytes_at::<1>(data, LOADFLAGS_OFFSET, "setup header")?[0] & LOADED_HIGH != 0,
        relocatable: bytes_at::<1>(data, RELOCATABLE_OFFSET, "setup header")?[0] != 0,
        kernel_alignment: u32_at(data, KERNEL_ALIGNMENT_OFFSET, "setup header")?,
        pref_address: optional_u64(0x020a, PREF_ADDRESS_OFFSET)?,
        init_size: optional_u32(0x020a, INIT_SIZE_OFFSET)?,
        cmdline_size: optional_u32(0x0206, CMDLINE_SIZE_OFFSET)?,
    })
}

/// The payload bytes of `data` as located by `header`.
pub(crate) fn payload<'a>(data: &'a [u8], header: &BzImageHeader) -> Result<&'a [u8], KernelError> {
    let start = usize::try_from(header.payload_offset).ok();
    let end = header
        .payload_offset
        .checked_add(header.payload_length)
        .and_then(|e| usize::try_from(e).ok());
    match (start, end) {
        (Some(start), Some(end)) if end <= data.len() => Ok(&data[start..end]),
        _ => Err(KernelError::PayloadOutOfBounds {
            offset: header.payload_offset,
            length: header.payload_length,
            len: data.len() as u64,
        }),
    }
}
