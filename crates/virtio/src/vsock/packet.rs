//! virtio-vsock packets (virtio 1.2 §5.10.6): the 44-byte header, its checks, and reading
//! and writing packets from and to descriptor chains.
//!
//! Everything here treats the chain as hostile: a short header, a length that the chain
//! does not hold or that exceeds [`MAX_PAYLOAD`], an unknown operation or a buffer in the
//! wrong direction is a [`PacketError`] and the packet is dropped; nothing panics.

use crate::Mem;
use std::io::{Read, Write};
use thiserror::Error;
use virtio_queue::DescriptorChain;

/// Size of `struct virtio_vsock_hdr`.
pub const HDR_LEN: usize = 44;

/// The largest payload of one packet (Linux's `VIRTIO_VSOCK_MAX_PKT_BUF_SIZE`).
pub const MAX_PAYLOAD: usize = 64 << 10;

/// The host's CID (`VMADDR_CID_HOST`).
pub const HOST_CID: u64 = 2;

/// `VIRTIO_VSOCK_TYPE_STREAM`, the only socket type served.
pub const TYPE_STREAM: u16 = 1;

/// `VIRTIO_VSOCK_SHUTDOWN_RCV`: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// `VIRTIO_VSOCK_SHUTDOWN_SEND`: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;

/// Packet operations (`VIRTIO_VSOCK_OP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Connection request.
    Request = 1,
    /// Connection accepted.
    Response = 2,
    /// Connection refused or reset.
    Rst = 3,
    /// Half or full close (flags: [`SHUTDOWN_RCV`], [`SHUTDOWN_SEND`]).
    Shutdown = 4,
    /// Data.
    Rw = 5,
    /// The sender's buffer space changed.
    CreditUpdate = 6,
    /// Asks for a credit update.
    CreditRequest = 7,
}

impl Op {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// A packet header. `op` is checked on parsing; `type_` is kept as sent so that a packet of
/// another socket type can be answered with a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload bytes following the header.
    pub len: u32,
    /// Socket type.
    pub type_: u16,
    /// Operation.
    pub op: Op,
    /// Operation flags (shutdown flags).
    pub flags: u32,
    /// The sender's receive buffer size.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed from its receive buffer, ever (wrapping).
    pub fwd_cnt: u32,
}

/// Why a packet from the driver was dropped.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PacketError {
    /// A device-writable buffer in a transmit chain (or a readable one in a receive chain).
    #[error("a buffer in the wrong direction")]
    Direction,
    /// A buffer outside guest memory, or lengths that overflow.
    #[error("a buffer outside guest memory")]
    Memory,
    /// The chain is shorter than a header.
    #[error("the chain holds {0} bytes, less than a header")]
    Short(usize),
    /// An operation the spec does not define.
    #[error("unknown operation {0}")]
    UnknownOp(u16),
    /// The header's length exceeds [`MAX_PAYLOAD`].
    #[error("payload length {0} exceeds the maximum")]
    Oversized(u32),
    /// The header's length exceeds what the chain holds.
    #[error("payload length {len} but the chain holds {avail} bytes after the header")]
    Truncated {
        /// Header length.
        len: u32,
        /// Bytes after the header.
        avail: usize,
    },
    /// Payload on a packet that carries none.
    #[error("payload on a control packet")]
    ControlPayload,
}

impl Header {
    /// A header from `buf` (little-endian, packed), `op` checked.
    pub fn parse(buf: &[u8; HDR_LEN]) -> Result<Self, PacketError> {
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap_or([0; 4]));
        let u16_at = |o: usize| u16::from_le_bytes([buf[o], buf[o + 1]]);
        let op_raw = u16_at(30);
        let op = Op::from_u16(op_raw).ok_or(PacketError::UnknownOp(op_raw))?;
        Ok(Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op,
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        })
    }

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

/// Reads one transmitted packet: its header and payload (appended to `payload`, which is
/// cleared first). Only device-readable buffers are allowed.
pub fn read_tx(
    chain: DescriptorChain<&Mem>,
    mem: &Mem,
    payload: &mut Vec<u8>,
) -> Result<Header, PacketError> {
    payload.clear();
    if chain.clone().any(|d| d.is_write_only()) {
        return Err(PacketError::Direction);
    }
    let mut reader = chain.reader(mem).map_err(|_| PacketError::Memory)?;
    let avail = reader.available_bytes();
    if avail < HDR_LEN {
        return Err(PacketError::Short(avail));
    }
    let mut raw = [0u8; HDR_LEN];
    reader
        .read_exact(&mut raw)
        .map_err(|_| PacketError::Memory)?;
    let hdr = Header::parse(&raw)?;
    let len = hdr.len as usize;
    if len > MAX_PAYLOAD {
        return Err(PacketError::Oversized(hdr.len));
    }
    if len > avail - HDR_LEN {
        return Err(PacketError::Truncated {
            len: hdr.len,
            avail: avail - HDR_LEN,
        });
    }
    if len > 0 && hdr.op != Op::Rw {
        return Err(PacketError::ControlPayload);
    }
    payload.resize(len, 0);
    reader
        .read_exact(payload)
        .map_err(|_| PacketError::Memory)?;
    Ok(hdr)
}

/// A receive chain ready for one packet: only device-writable buffers, room for a header.
pub struct RxBuffer<'m> {
    writer: virtio_queue::Writer<'m>,
}

impl<'m> RxBuffer<'m> {
    /// Checks `chain` as a receive buffer.
    pub fn new(chain: DescriptorChain<&'m Mem>, mem: &'m Mem) -> Result<Self, PacketError> {
        if chain.clone().any(|d| !d.is_write_only()) {
            return Err(PacketError::Direction);
        }
        let writer = chain.writer(mem).map_err(|_| PacketError::Memory)?;
        let avail = writer.available_bytes();
        if avail < HDR_LEN {
            return Err(PacketError::Short(avail));
        }
        Ok(Self { writer })
    }

    /// Payload bytes the buffer holds after a header (at most [`MAX_PAYLOAD`]).
    pub fn capacity(&self) -> usize {
        (self.writer.available_bytes() - HDR_LEN).min(MAX_PAYLOAD)
    }

    /// Writes the packet; returns the bytes written (the used length), or `None` when guest
    /// memory could not be written.
    pub fn write(mut self, hdr: &Header, payload: &[u8]) -> Option<u32> {
        debug_assert_eq!(hdr.len as usize, payload.len());
        self.writer.write_all(&hdr.to_bytes()).ok()?;
        self.writer.write_all(payload).ok()?;
        u32::try_from(self.writer.bytes_written()).ok()
    }
}
