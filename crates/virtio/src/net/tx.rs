//! Transmit: the driver's frames to the tap.

use super::tap::Tap;
use super::{net_features, NetStats, HDR_LEN, MAX_FRAME};
use crate::Mem;
use std::io;
use virtio_queue::DescriptorChain;
use vm_memory::Bytes;

/// An Ethernet header: the least a frame has after the virtio-net header.
const ETH_HLEN: usize = 14;

/// `flags`: the packet's checksum is partial (`csum_start`, `csum_offset`).
const HDR_F_NEEDS_CSUM: u8 = 1;
/// `gso_type` values.
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_ECN: u8 = 0x80;

/// Why a transmit chain is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxError {
    /// A device-writable buffer (transmit buffers are driver-readable).
    WriteOnly,
    /// More than a header and [`MAX_FRAME`] bytes.
    Oversized,
    /// A buffer outside guest memory.
    OutsideMemory,
    /// A chain that loops or points outside the descriptor table.
    Looped,
    /// Shorter than the header and an Ethernet header.
    TooShort,
    /// An offload the driver did not negotiate, or a header that does not fit the frame.
    BadHeader,
}

/// Copies a transmit chain's buffers (header and frame) into `buf`.
pub fn gather(chain: DescriptorChain<&Mem>, mem: &Mem, buf: &mut Vec<u8>) -> Result<(), TxError> {
    buf.clear();
    let mut cut = false;
    for d in chain {
        // See rx: a last descriptor with NEXT means a loop or a next index out of range.
        cut = d.has_next();
        if d.is_write_only() {
            return Err(TxError::WriteOnly);
        }
        let len = d.len() as usize;
        if buf.len() + len > HDR_LEN + MAX_FRAME {
            return Err(TxError::Oversized);
        }
        let at = buf.len();
        buf.resize(at + len, 0);
        mem.read_slice(&mut buf[at..], d.addr())
            .map_err(|_| TxError::OutsideMemory)?;
    }
    if cut {
        return Err(TxError::Looped);
    }
    if buf.len() < HDR_LEN + ETH_HLEN {
        return Err(TxError::TooShort);
    }
    Ok(())
}

/// Checks a frame's virtio-net header against the features the driver accepted: a partial
/// checksum only with `CSUM`, segmentation only as `HOST_TSO4/6` (+`HOST_ECN`) allow, and
/// the checksum's place inside the frame.
pub fn check_header(pkt: &[u8], acked: u64) -> Result<(), TxError> {
    let flags = pkt[0];
    let gso = pkt[1];
    let csum_start = usize::from(u16::from_le_bytes([pkt[6], pkt[7]]));
    let csum_offset = usize::from(u16::from_le_bytes([pkt[8], pkt[9]]));
    let frame_len = pkt.len() - HDR_LEN;
    if flags & HDR_F_NEEDS_CSUM != 0
        && (acked & net_features::CSUM == 0 || csum_start + csum_offset + 2 > frame_len)
    {
        return Err(TxError::BadHeader);
    }
    if gso & GSO_ECN != 0 && acked & net_features::HOST_ECN == 0 {
        return Err(TxError::BadHeader);
    }
    let ok = match gso & !GSO_ECN {
        GSO_NONE => true,
        GSO_TCPV4 => acked & net_features::HOST_TSO4 != 0,
        GSO_TCPV6 => acked & net_features::HOST_TSO6 != 0,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(TxError::BadHeader)
    }
}

/// Sends one transmit chain to the tap (or drops it, counted, when it breaks the rules or
/// the tap is gone). Returns the tap's write error other than `EAGAIN`.
pub fn send_chain(
    chain: DescriptorChain<&Mem>,
    mem: &Mem,
    buf: &mut Vec<u8>,
    tap: &Tap,
    acked: u64,
    stats: &NetStats,
    tap_dead: bool,
) -> Result<(), io::Error> {
    let head = chain.head_index();
    if let Err(e) = gather(chain, mem, buf).and_then(|()| check_header(buf, acked)) {
        tracing::debug!("virtio-net tx: chain {head} dropped: {e:?}");
        NetStats::add(&stats.bad_chains, 1);
        NetStats::add(&stats.tx_dropped, 1);
        return Ok(());
    }
    if tap_dead {
        NetStats::add(&stats.tx_dropped, 1);
        return Ok(());
    }
    loop {
        match tap.write(buf) {
            Ok(_) => {
                NetStats::add(&stats.tx_packets, 1);
                NetStats::add(&stats.tx_bytes, (buf.len() - HDR_LEN) as u64);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The tap's queue is full: a network may drop.
                NetStats::add(&stats.tx_dropped, 1);
                return Ok(());
            }
            Err(e) => {
                NetStats::add(&stats.tx_dropped, 1);
                return Err(e);
            }
        }
    }
}
