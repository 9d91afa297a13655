//! One virtio-blk request (virtio 1.2 §5.2.6): a descriptor chain made of a 16-byte header
//! the device reads, the request's data, and one status byte the device writes last.
//!
//! Every guest buffer is reached through `virtio-queue`'s [`Reader`]/[`Writer`], which check
//! it against guest memory; a chain that is cut short (a loop, more descriptors than the
//! queue, a bad indirect table) is returned untouched with length 0, since its status byte
//! cannot be told apart from its data.

use super::backend::Backend;
use crate::Mem;
use std::io::{Read, Write};
use virtio_bindings::bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use virtio_queue::{DescriptorChain, Reader, Writer};
use vm_memory::{Address, GuestMemory, Permissions, VolatileSlice};

/// Bytes in a sector, the unit of every virtio-blk offset.
pub const SECTOR_SIZE: u64 = 512;
/// Largest data segment the device accepts (`size_max`).
pub const SIZE_MAX: u32 = 1 << 20;
/// Most data segments in one request (`seg_max`): a 256-entry queue less header and status.
pub const SEG_MAX: u32 = 254;
/// Most data one read or write request may carry: the guest cannot make the device do more
/// work than this per request (it never allocates more than [`CHUNK`] for it).
pub const MAX_REQUEST_BYTES: u64 = SIZE_MAX as u64 * SEG_MAX as u64;
/// Most sectors in one discard or write-zeroes segment (1 GiB).
pub const MAX_DWZ_SECTORS: u32 = 1 << 21;
/// Most segments in one discard or write-zeroes request.
pub const MAX_DWZ_SEG: u32 = 16;
/// Bytes moved through host memory at once where a backend cannot reach guest memory
/// directly (pcow): the most the VMM holds for a request.
const CHUNK: usize = 128 << 10;
/// `struct virtio_blk_outhdr`: type, ioprio, sector.
const HEADER_LEN: usize = 16;
/// `struct virtio_blk_discard_write_zeroes`: sector, num_sectors, flags.
const SEGMENT_LEN: usize = 16;

const S_OK: u8 = VIRTIO_BLK_S_OK as u8;
const S_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const S_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// What a request needs to know about the disk besides its backend.
#[derive(Clone, Copy, Debug)]
pub struct DiskInfo {
    /// Writes, discards and write-zeroes are refused.
    pub readonly: bool,
    /// Flush after every write (the driver did not negotiate `VIRTIO_BLK_F_FLUSH`, so it
    /// believes the disk has no write cache).
    pub write_through: bool,
    /// The GET_ID answer.
    pub serial: [u8; VIRTIO_BLK_ID_BYTES as usize],
    /// Disk size in sectors.
    pub capacity: u64,
}

/// Serves one chain: executes its request and writes its status byte. Returns the number of
/// bytes written into the chain's device-writable buffers (status included), 0 when the
/// chain has nowhere to put a status.
pub fn serve(
    backend: &mut dyn Backend,
    disk: &DiskInfo,
    mem: &Mem,
    chain: DescriptorChain<&Mem>,
) -> u32 {
    let Some(ordered) = walk(&chain) else {
        tracing::debug!(
            "virtio-blk: chain {} is cut short; returned unserved",
            chain.head_index()
        );
        return 0;
    };
    let Ok(mut data_out) = chain.clone().writer(mem) else {
        tracing::debug!(
            "virtio-blk: chain {} has a writable buffer outside guest memory",
            chain.head_index()
        );
        return 0;
    };
    let Some(status_at) = data_out.available_bytes().checked_sub(1) else {
        return 0;
    };
    let Ok(mut status_out) = data_out.split_at(status_at) else {
        return 0;
    };
    let direct = if ordered {
        data_slices(mem, &chain)
    } else {
        None
    };
    let (status, direct_written) = match chain.reader(mem) {
        Ok(mut data_in) if ordered => {
            execute(backend, disk, &mut data_in, &mut data_out, direct.as_ref())
        }
        _ => (S_IOERR, 0),
    };
    let written = data_out.bytes_written() + direct_written;
    if status_out.write_all(&[status]).is_err() {
        return u32::try_from(written).unwrap_or(u32::MAX);
    }
    u32::try_from(written + 1).unwrap_or(u32::MAX)
}

/// The chain's data buffers as slices of guest memory, for backends that read and write
/// them in place (no copy, no host buffer): the readable buffers after the header (a
/// write's data) and the writable buffers before the status byte (a read's). `None` when a
/// buffer is outside guest memory (the request path then fails it through `Reader`/`Writer`).
pub struct DataSlices<'m> {
    /// Readable data after the header.
    pub readable: Vec<VolatileSlice<'m>>,
    /// Writable data before the status byte.
    pub writable: Vec<VolatileSlice<'m>>,
}

fn data_slices<'m>(mem: &'m Mem, chain: &DescriptorChain<&Mem>) -> Option<DataSlices<'m>> {
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    let mut skip = HEADER_LEN;
    let writable_total: u64 = chain
        .clone()
        .filter(|d| d.is_write_only())
        .map(|d| u64::from(d.len()))
        .sum();
    let mut keep_writable = writable_total.checked_sub(1)?;
    for desc in chain.clone() {
        let (mut addr, mut len) = (desc.addr(), u64::from(desc.len()));
        if desc.is_write_only() {
            len = len.min(keep_writable);
            keep_writable -= len;
        } else {
            let s = (skip as u64).min(len);
            skip -= s as usize;
            addr = addr.checked_add(s)?;
            len -= s;
        }
        if len == 0 {
            continue;
        }
        let perm = if desc.is_write_only() {
            Permissions::Write
        } else {
            Permissions::Read
        };
        for slice in mem.get_slices(addr, len as usize, perm).ok()? {
            let slice = slice.ok()?;
            if desc.is_write_only() {
                writable.push(slice);
            } else {
                readable.push(slice);
            }
        }
    }
    Some(DataSlices { readable, writable })
}

/// Walks the chain once: `None` when it does not end (the last descriptor still names a
/// next one: a loop, a chain longer than its table, a next index outside the table, an
/// indirect table that cannot be used) or has no descriptor; otherwise whether every
/// device-readable buffer comes before every device-writable one (virtio 1.2 §2.7.4.2).
fn walk(chain: &DescriptorChain<&Mem>) -> Option<bool> {
    let mut any = false;
    let mut more = false;
    let mut seen_writable = false;
    let mut ordered = true;
    for desc in chain.clone() {
        any = true;
        more = desc.has_next();
        if desc.is_write_only() {
            seen_writable = true;
        } else if seen_writable {
            ordered = false;
        }
    }
    (any && !more).then_some(ordered)
}

/// The byte offset of `sectors` sectors at `sector`, if they are all on the disk.
fn byte_range(disk: &DiskInfo, sector: u64, bytes: u64) -> Option<u64> {
    if bytes % SECTOR_SIZE != 0 {
        return None;
    }
    let end = sector.checked_add(bytes / SECTOR_SIZE)?;
    (end <= disk.capacity).then(|| sector * SECTOR_SIZE)
}

fn status(r: std::io::Result<()>) -> u8 {
    match r {
        Ok(()) => S_OK,
        Err(e) => {
            tracing::warn!("virtio-blk: request failed: {e}");
            S_IOERR
        }
    }
}

/// Executes the request whose header is the start of `data_in`; `data_out` is the writable
/// space before the status byte, `direct` the same buffers as guest-memory slices. Returns
/// the status and the bytes written through `direct`.
fn execute(
    backend: &mut dyn Backend,
    disk: &DiskInfo,
    data_in: &mut Reader<'_>,
    data_out: &mut Writer<'_>,
    direct: Option<&DataSlices<'_>>,
) -> (u8, usize) {
    let mut header = [0u8; HEADER_LEN];
    if data_in.read_exact(&mut header).is_err() {
        return (S_IOERR, 0);
    }
    let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let mut sector = [0u8; 8];
    sector.copy_from_slice(&header[8..16]);
    let sector = u64::from_le_bytes(sector);
    match kind {
        VIRTIO_BLK_T_IN => read(backend, disk, sector, data_in, data_out, direct),
        VIRTIO_BLK_T_OUT => (write(backend, disk, sector, data_in, data_out, direct), 0),
        other => (execute_other(backend, disk, other, data_in, data_out), 0),
    }
}

fn execute_other(
    backend: &mut dyn Backend,
    disk: &DiskInfo,
    kind: u32,
    data_in: &mut Reader<'_>,
    data_out: &mut Writer<'_>,
) -> u8 {
    match kind {
        VIRTIO_BLK_T_FLUSH if disk.readonly => S_OK,
        VIRTIO_BLK_T_FLUSH => status(backend.flush()),
        VIRTIO_BLK_T_GET_ID => {
            let n = data_out.available_bytes().min(disk.serial.len());
            if n == 0 {
                return S_IOERR;
            }
            status(data_out.write_all(&disk.serial[..n]))
        }
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
            discard_or_zero(backend, disk, kind == VIRTIO_BLK_T_DISCARD, data_in)
        }
        _ => S_UNSUPP,
    }
}

fn read(
    backend: &mut dyn Backend,
    disk: &DiskInfo,
    sector: u64,
    data_in: &Reader<'_>,
    data_out: &mut Writer<'_>,
    direct: Option<&DataSlices<'_>>,
) -> (u8, usize) {
    // Anything readable after the header is a data buffer pointing the wrong way.
    let len = data_out.available_bytes() as u64;
    if data_in.available_bytes() != 0 || len > MAX_REQUEST_BYTES {
        return (S_IOERR, 0);
    }
    let Some(offset) = byte_range(disk, sector, len) else {
        return (S_IOERR, 0);
    };
    if let Some(d) = direct {
        match backend.read_into(offset, &d.writable) {
            Ok(true) => return (S_OK, len as usize),
            Ok(false) => {}
            Err(e) => return (status(Err(e)), 0),
        }
    }
    (read_buffered(backend, offset, len, data_out), 0)
}

fn read_buffered(
    backend: &mut dyn Backend,
    offset: u64,
    len: u64,
    data_out: &mut Writer<'_>,
) -> u8 {
    let mut buf = vec![0u8; (len as usize).min(CHUNK)];
    let mut done = 0u64;
    while done < len {
        let n = ((len - done) as usize).min(CHUNK);
        let chunk = &mut buf[..n];
        if let Err(e) = backend.read(offset + done, chunk) {
            return status(Err(e));
        }
        if data_out.write_all(chunk).is_err() {
            return S_IOERR;
        }
        done += n as u64;
    }
    S_OK
}

fn write(
    backend: &mut dyn Backend,
    disk: &DiskInfo,
    sector: u64,
    data_in: &mut Reader<'_>,
    data_out: &Writer<'_>,
    direct: Option<&DataSlices<'_>>,
) -> u8 {
    // Anything writable before the status byte is a data buffer pointing the wrong way.
    let len = data_in.available_bytes() as u64;
    if disk.readonly || data_out.available_bytes() != 0 || len > MAX_REQUEST_BYTES {
        return S_IOERR;
    }
    let Some(offset) = byte_range(disk, sector, len) else {
        return S_IOERR;
    };
    let written = match direct.map(|d| backend.write_from(offset, &d.readable)) {
        Some(Ok(true)) => S_OK,
        Some(Err(e)) => return status(Err(e)),
        None | Some(Ok(false)) => write_buffered(backend, offset, len, data_in),
    };
    if written == S_OK && disk.write_through {
        return status(backend.flush());
    }
    written
}

fn write_buffered(
    backend: &mut dyn Backend,
    offset: u64,
    len: u64,
    data_in: &mut Reader<'_>,
) -> u8 {
    let mut buf = vec![0u8; (len as usize).min(CHUNK)];
    let mut done = 0u64;
    while done < len {
        let n = ((len - done) as usize).min(CHUNK);
        let chunk = &mut buf[..n];
        if data_in.read_exact(chunk).is_err() {
            return S_IOERR;
        }
        if let Err(e) = backend.write(offset + done, chunk) {
            return status(Err(e));
        }
        done += n as u64;
    }
    S_OK
}

/// DISCARD (`discard`) or WRITE_ZEROES: the data is an array of segments, all checked
/// before any is carried out.
fn discard_or_zero(
    backend: &mut dyn Backend,
    disk: &DiskInfo,
    discard: bool,
    data_in: &mut Reader<'_>,
) -> u8 {
    let len = data_in.available_bytes();
    if disk.readonly
        || len == 0
        || len % SEGMENT_LEN != 0
        || len / SEGMENT_LEN > MAX_DWZ_SEG as usize
    {
        return S_IOERR;
    }
    let mut raw = [0u8; SEGMENT_LEN * MAX_DWZ_SEG as usize];
    let raw = &mut raw[..len];
    if data_in.read_exact(raw).is_err() {
        return S_IOERR;
    }
    let mut segments = Vec::with_capacity(len / SEGMENT_LEN);
    for seg in raw.chunks_exact(SEGMENT_LEN) {
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&seg[0..8]);
        let sector = u64::from_le_bytes(sector);
        let sectors = u32::from_le_bytes([seg[8], seg[9], seg[10], seg[11]]);
        let flags = u32::from_le_bytes([seg[12], seg[13], seg[14], seg[15]]);
        // §5.2.6.2: UNSUPP for the unmap flag on a discard, or any unknown flag.
        let known = if discard {
            0
        } else {
            VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
        };
        if flags & !known != 0 {
            return S_UNSUPP;
        }
        if sectors > MAX_DWZ_SECTORS {
            return S_IOERR;
        }
        let bytes = u64::from(sectors) * SECTOR_SIZE;
        let Some(offset) = byte_range(disk, sector, bytes) else {
            return S_IOERR;
        };
        segments.push((
            offset,
            bytes,
            flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0,
        ));
    }
    for (offset, bytes, unmap) in segments {
        if bytes == 0 {
            continue;
        }
        let r = if discard {
            backend.discard(offset, bytes)
        } else {
            backend.write_zeroes(offset, bytes, unmap)
        };
        if r.is_err() {
            return status(r);
        }
    }
    if disk.write_through {
        return status(backend.flush());
    }
    S_OK
}
