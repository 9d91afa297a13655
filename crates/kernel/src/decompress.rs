//! Decompression of the bzImage payload into the ELF vmlinux.

use crate::bzimage::{payload, read_bzimage_header};
use crate::{Compression, KernelError};
use std::io::Read;

/// Largest vmlinux [`extract_vmlinux`] will produce (a guard against corrupt payloads).
pub const MAX_VMLINUX_SIZE: u64 = 1 << 30;

/// Progress of an extraction, passed to the callback of [`extract_vmlinux_with_progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractProgress {
    /// Compressed bytes consumed so far.
    pub input_done: u64,
    /// Total compressed bytes.
    pub input_total: u64,
    /// Decompressed bytes produced so far.
    pub output_done: u64,
}

/// Extracts and validates the ELF vmlinux from the bzImage in `bzimage`.
pub fn extract_vmlinux(bzimage: &[u8]) -> Result<Vec<u8>, KernelError> {
    extract_vmlinux_with_progress(bzimage, &mut |_| {})
}

/// Like [`extract_vmlinux`], calling `progress` about every MiB of output.
pub fn extract_vmlinux_with_progress(
    bzimage: &[u8],
    progress: &mut dyn FnMut(ExtractProgress),
) -> Result<Vec<u8>, KernelError> {
    let header = read_bzimage_header(bzimage)?;
    let input = payload(bzimage, &header)?;
    let vmlinux = match header.compression {
        Compression::Xz => decode_xz(input, progress)?,
        Compression::Gzip => drain(
            flate2::bufread::GzDecoder::new(input),
            Compression::Gzip,
            input.len() as u64,
            |d| d.get_ref().len(),
            progress,
        )?,
        Compression::Lz4 => decode_lz4_legacy(input, progress)?,
        Compression::None => input.to_vec(),
        other => return Err(KernelError::UnsupportedCompression(other)),
    };
    crate::parse_elf(&vmlinux)?;
    Ok(vmlinux)
}

/// Reads `decoder` to its end; `remaining` tells how much compressed input is left.
fn drain<R: Read>(
    mut decoder: R,
    compression: Compression,
    input_total: u64,
    remaining: impl Fn(&R) -> usize,
    progress: &mut dyn FnMut(ExtractProgress),
) -> Result<Vec<u8>, KernelError> {
    let mut out = Vec::with_capacity((input_total as usize).saturating_mul(4));
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = decoder
            .read(&mut chunk)
            .map_err(|source| KernelError::Decompress {
                compression,
                output_bytes: out.len() as u64,
                source,
            })?;
        if n == 0 {
            break;
        }
        if out.len() as u64 + n as u64 > MAX_VMLINUX_SIZE {
            return Err(KernelError::OutputTooLarge {
                limit: MAX_VMLINUX_SIZE,
            });
        }
        out.extend_from_slice(&chunk[..n]);
        progress(ExtractProgress {
            input_done: input_total - remaining(&decoder) as u64,
            input_total,
            output_done: out.len() as u64,
        });
    }
    if out.is_empty() {
        return Err(KernelError::Decompress {
            compression,
            output_bytes: 0,
            source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "empty stream"),
        });
    }
    Ok(out)
}

/// Decodes one XZ stream from the start of `input`, ignoring what follows it (the
/// kernel build appends the uncompressed size).
fn decode_xz(
    input: &[u8],
    progress: &mut dyn FnMut(ExtractProgress),
) -> Result<Vec<u8>, KernelError> {
    let corrupt =
        |output_bytes: usize, kind: std::io::ErrorKind, what: String| KernelError::Decompress {
            compression: Compression::Xz,
            output_bytes: output_bytes as u64,
            source: std::io::Error::new(kind, what),
        };
    let mut stream = xz2::stream::Stream::new_stream_decoder(u64::MAX, 0).map_err(|e| {
        corrupt(
            0,
            std::io::ErrorKind::Other,
            format!("cannot start the xz decoder: {e}"),
        )
    })?;
    let mut out = Vec::with_capacity(input.len().saturating_mul(4));
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let consumed = stream.total_in() as usize;
        let produced_before = stream.total_out();
        let rest = input.get(consumed..).unwrap_or_default();
        let status = stream
            .process(rest, &mut chunk, xz2::stream::Action::Run)
            .map_err(|e| corrupt(out.len(), std::io::ErrorKind::InvalidData, e.to_string()))?;
        let produced = (stream.total_out() - produced_before) as usize;
        if out.len() as u64 + produced as u64 > MAX_VMLINUX_SIZE {
            return Err(KernelError::OutputTooLarge {
                limit: MAX_VMLINUX_SIZE,
            });
        }
        out.extend_from_slice(&chunk[..produced]);
        progress(ExtractProgress {
            input_done: stream.total_in(),
            input_total: input.len() as u64,
            output_done: out.len() as u64,
        });
        if status == xz2::stream::Status::StreamEnd {
            return Ok(out);
        }
        if produced == 0 && stream.total_in() as usize == consumed {
            return Err(corrupt(
                out.len(),
                std::io::ErrorKind::UnexpectedEof,
                "the xz stream ends before its end marker (truncated payload)".into(),
            ));
        }
    }
}

/// Decodes the LZ4 legacy frame format of `lz4 -l` (magic, then blocks of
/// `u32 compressed size` + LZ4 block, each expanding to at most 8 MiB).
fn decode_lz4_legacy(
    input: &[u8],
    progress: &mut dyn FnMut(ExtractProgress),
) -> Result<Vec<u8>, KernelError> {
    const LEGACY_MAGIC: u32 = 0x184c_2102;
    const BLOCK_MAX: usize = 8 << 20;
    let corrupt = |output_bytes: usize, what: String| KernelError::Decompress {
        compression: Compression::Lz4,
        output_bytes: output_bytes as u64,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, what),
    };
    let mut out = Vec::new();
    let mut pos = 4usize;
    if input.len() < 4
        || u32::from_le_bytes([input[0], input[1], input[2], input[3]]) != LEGACY_MAGIC
    {
        return Err(corrupt(0, "missing lz4 legacy magic".into()));
    }
    let mut block = vec![0u8; BLOCK_MAX];
    while pos + 4 <= input.len() {
        let size = u32::from_le_bytes([input[pos], input[pos + 1], input[pos + 2], input[pos + 3]]);
        // The kernel appends the uncompressed size after the last block; a stray
        // magic starts a new frame. Neither is a block.
        if size == LEGACY_MAGIC {
            pos += 4;
            continue;
        }
        let size = size as usize;
        let start = pos + 4;
        let Some(data) = start
            .checked_add(size)
            .and_then(|end| input.get(start..end))
        else {
            if pos + 4 == input.len() {
                break; // trailing uncompressed-size word
            }
            return Err(corrupt(
                out.len(),
                format!("block at {pos:#x} of {size} bytes runs past the end"),
            ));
        };
        let n = lz4_flex::block::decompress_into(data, &mut block)
            .map_err(|e| corrupt(out.len(), format!("block at {pos:#x}: {e}")))?;
        if out.len() as u64 + n as u64 > MAX_VMLINUX_SIZE {
            return Err(KernelError::OutputTooLarge {
                limit: MAX_VMLINUX_SIZE,
            });
        }
        out.extend_from_slice(&block[..n]);
        pos = start + size;
        progress(ExtractProgress {
            input_done: pos as u64,
            input_total: input.len() as u64,
            output_done: out.len() as u64,
        });
    }
    if out.is_empty() {
        return Err(corrupt(0, "no lz4 blocks".into()));
    }
    Ok(out)
}
