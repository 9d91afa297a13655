//! The `virtio_pci` fuzz target's entry point (`fuzz/fuzz_targets/virtio_pci.rs`), also
//! replayed by `cargo test`: a hostile driver's register accesses to a virtio-pci function
//! (a virtio-pmem device behind it): configuration-space reads and writes (capabilities,
//! BAR, MSI-X control) as the PCI root hands them on (1, 2 or 4 bytes within a dword), and
//! BAR 0 reads and writes of 1, 2, 4 or 8 bytes anywhere in the common configuration, ISR,
//! device configuration, notification, MSI-X table and pending-bit regions — feature
//! negotiation, queue setup with rings anywhere, activation (the device's worker starts and
//! serves what guest memory holds), notifications and resets in any order. Nothing may
//! panic or hang, and the function must stay readable: the status register reads back (the
//! worker may add `DEVICE_NEEDS_RESET` at any time), and the device stops when the driver
//! resets it.
//!
//! Input layout (missing bytes read as zero): up to 128 steps, a byte `op % 6` and its
//! operands: 0 config write (register `b % 64`, size byte, then the bytes); 1 config read;
//! 2 BAR write (region byte `b % 6`, offset u16 within the region (`% 0x40` in the common
//! configuration), size byte `1 << (b % 4)`, the bytes); 3 BAR read (same addressing);
//! 4 guest memory write (offset u16, `b` bytes); 5 the driver's usual bring-up (acknowledge,
//! features, queue 0 of `b`-coded size at input-chosen rings, MSI-X on, DRIVER_OK).

use super::{common_cfg::status, VirtioPci, BAR_SIZE};
use crate::fuzzing::Input;
use crate::pmem::{FlushFn, Pmem};
use crate::testing::{guest_memory, RecordingRoutes};
use densevm_devices::pci::{MsixVector, PciFunction};
use densevm_devices::BusDevice;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

const MEM: u64 = 0x1_0000;
const BAR: u32 = 0xd000_0000;
const STEPS: usize = 128;
const REGIONS: [u64; 6] = [0x0000, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000];

fn function() -> Option<VirtioPci> {
    let flush: FlushFn = Arc::new(|| Ok(()));
    let device = Box::new(Pmem::new(1 << 32, 1 << 30, flush));
    let vectors = (0..VirtioPci::vectors_needed(device.as_ref()))
        .map(|i| {
            Some(MsixVector {
                gsi: 24 + i as u32,
                trigger: EventFd::new(libc::EFD_NONBLOCK).ok()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let routes = Arc::new(RecordingRoutes::default());
    VirtioPci::new(device, guest_memory(MEM as usize), BAR, vectors, routes).ok()
}

/// BAR 0 offset and access size from the input.
fn bar_access(input: &mut Input) -> (u64, usize) {
    let region = usize::from(input.u8() % 6);
    let within = u64::from(input.u16()) % if region == 0 { 0x40 } else { 0x1000 };
    let len = 1usize << (input.u8() % 4);
    let off = (REGIONS[region] + within).min(u64::from(BAR_SIZE) - len as u64);
    (off, len)
}

fn w(dev: &mut VirtioPci, off: u64, data: &[u8]) {
    BusDevice::write(dev, off, data);
}

/// The usual bring-up of queue 0, with the rings where the input says.
fn bring_up(dev: &mut VirtioPci, input: &mut Input) {
    let size = 2u16 << (input.u8() % 6);
    let ring = |input: &mut Input| u64::from(input.u16()) & !0xf;
    let (desc, avail, used) = (ring(input), ring(input), ring(input));
    let msix = input.u8();
    // The MSI-X capability's message control (enable) in config space, as Linux finds it.
    let mut at = (dev.config_read(13) & 0xff) as usize;
    for _ in 0..16 {
        if at == 0 || at >= 256 {
            break;
        }
        let d = dev.config_read(at / 4);
        if d as u8 == densevm_devices::pci::CAP_ID_MSIX {
            dev.config_write(at / 4, 2, &0x8000u16.to_le_bytes());
            break;
        }
        at = (d >> 8 & 0xff) as usize;
    }
    w(dev, 0x4000 + 16, &0xfee0_0000u32.to_le_bytes());
    w(dev, 0x4000 + 24, &u32::from(msix).to_le_bytes());
    w(dev, 0x14, &[0]);
    w(dev, 0x14, &[status::ACKNOWLEDGE | status::DRIVER]);
    w(dev, 0x08, &1u32.to_le_bytes());
    w(dev, 0x0c, &1u32.to_le_bytes());
    w(
        dev,
        0x14,
        &[status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK],
    );
    w(dev, 0x16, &0u16.to_le_bytes());
    w(dev, 0x18, &size.to_le_bytes());
    w(dev, 0x1a, &1u16.to_le_bytes());
    for (off, addr) in [(0x20, desc), (0x28, avail), (0x30, used)] {
        w(dev, off, &(addr as u32).to_le_bytes());
        w(dev, off + 4, &((addr >> 32) as u32).to_le_bytes());
    }
    w(dev, 0x1c, &1u16.to_le_bytes());
    w(dev, 0x10, &0u16.to_le_bytes());
    w(
        dev,
        0x14,
        &[status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK],
    );
}

/// Runs the accesses `data` describes.
pub fn virtio_pci(data: &[u8]) {
    run(data);
}

/// Runs the accesses; returns whether the device was ever active.
fn run(data: &[u8]) -> bool {
    let Some(mut dev) = function() else {
        return false;
    };
    let mem = dev.mem.clone();
    let mut input = Input(data);
    let mut active = false;
    for _ in 0..STEPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 6 {
            0 => {
                let reg = usize::from(input.u8() % 64);
                let len = 1usize << (input.u8() % 3);
                let offset = usize::from(input.u8()) % (5 - len);
                let bytes = input.take(len).to_vec();
                if bytes.len() == len {
                    dev.config_write(reg, offset, &bytes);
                }
            }
            1 => {
                dev.config_read(usize::from(input.u8() % 64));
            }
            2 => {
                let (off, len) = bar_access(&mut input);
                let bytes = input.take(len).to_vec();
                if bytes.len() == len {
                    w(&mut dev, off, &bytes);
                }
            }
            3 => {
                let (off, len) = bar_access(&mut input);
                let mut buf = vec![0u8; len];
                BusDevice::read(&mut dev, off, &mut buf);
            }
            4 => {
                let at = u64::from(input.u16()) % MEM;
                let n = usize::from(input.u8());
                let bytes = input.take(n).to_vec();
                let n = bytes.len().min((MEM - at) as usize);
                let _ = mem.write_slice(&bytes[..n], GuestAddress(at));
            }
            _ => bring_up(&mut dev, &mut input),
        }
        active |= dev.is_active();
        let mut s = [0u8; 1];
        BusDevice::read(&mut dev, 0x14, &mut s);
        // The device's worker may ask for a reset (DEVICE_NEEDS_RESET) between the reads.
        let now = dev.status();
        assert_eq!(
            s[0] | (now & status::DEVICE_NEEDS_RESET),
            now,
            "the status register reads back"
        );
    }
    // A reset stops the device.
    w(&mut dev, 0x14, &[0]);
    assert!(!dev.is_active(), "a driver reset stops the device");
    active
}

/// Seeds: a bring-up and a flush, a bring-up with rings outside memory, and register pokes
/// after DRIVER_OK.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    // Queue of 16 at desc 0x1000, avail 0x2000, used 0x3000; a flush request; notify.
    let mut v = vec![4];
    v.extend_from_slice(&0x1000u16.to_le_bytes());
    v.push(16);
    v.extend_from_slice(&0x5000u64.to_le_bytes()); // addr
    v.extend_from_slice(&4u32.to_le_bytes());
    v.extend_from_slice(&1u16.to_le_bytes()); // NEXT
    v.extend_from_slice(&1u16.to_le_bytes());
    v.push(4);
    v.extend_from_slice(&0x1010u16.to_le_bytes());
    v.push(16);
    v.extend_from_slice(&0x5010u64.to_le_bytes());
    v.extend_from_slice(&4u32.to_le_bytes());
    v.extend_from_slice(&2u16.to_le_bytes()); // WRITE
    v.extend_from_slice(&0u16.to_le_bytes());
    v.push(4);
    v.extend_from_slice(&0x2000u16.to_le_bytes());
    v.extend_from_slice(&[6, 0, 0, 1, 0, 0, 0]); // 6 bytes: flags 0, idx 1, ring[0] = 0
    v.push(5);
    v.push(3);
    v.extend_from_slice(&0x1000u16.to_le_bytes());
    v.extend_from_slice(&0x2000u16.to_le_bytes());
    v.extend_from_slice(&0x3000u16.to_le_bytes());
    v.push(0x41);
    v.extend_from_slice(&[2, 3, 0, 0, 1, 0, 0]); // notify queue 0
    v.extend_from_slice(&[3, 0, 0x14, 0, 0]); // read status
    out.push(("bring_up_and_flush", v));
    // Rings at the end of memory (partly outside), then a reset and reads everywhere.
    let mut v = vec![5, 7];
    v.extend_from_slice(&0xfff0u16.to_le_bytes());
    v.extend_from_slice(&0xfff0u16.to_le_bytes());
    v.extend_from_slice(&0xfff0u16.to_le_bytes());
    v.push(0);
    for r in 0..6u8 {
        v.extend_from_slice(&[3, r, 0, 0, 2]);
        v.extend_from_slice(&[3, r, 0x10, 0, 3]);
    }
    v.extend_from_slice(&[2, 0, 0x14, 0, 0, 0]);
    out.push(("rings_outside_memory", v));
    // Config space: BAR sizing, command register, capabilities; common config after
    // DRIVER_OK (queue setup refused), select out of range, feature selects past 1.
    let mut v = vec![0, 4, 2, 0xff, 0xff, 0xff, 0xff, 1, 4, 0, 1, 2, 0, 6, 0];
    for reg in [13u8, 16, 17, 18, 19, 20, 21, 22, 23, 24] {
        v.extend_from_slice(&[1, reg]);
    }
    v.extend_from_slice(&[5, 2, 0, 1, 0, 2, 0, 3, 9]);
    v.extend_from_slice(&[2, 0, 0x16, 0, 1, 9, 0, 3, 0, 0x18, 0, 1]);
    v.extend_from_slice(&[2, 0, 0x00, 0, 2, 7, 0, 0, 0, 3, 0, 0x04, 0, 2]);
    v.extend_from_slice(&[2, 0, 0x20, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8]);
    v.extend_from_slice(&[2, 4, 0, 0, 3, 0, 0, 0xe0, 0xfe, 0, 0, 0, 0]);
    v.extend_from_slice(&[2, 5, 0, 0, 2, 0xff, 0xff, 0xff, 0xff]);
    out.push(("registers", v));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bring_up_seed_activates_the_device() {
        assert!(super::run(&super::seeds()[0].1));
    }

    #[test]
    fn corpus_seeds_and_mutations_pass() {
        crate::fuzzing::replay("virtio_pci", &super::seeds(), 1000, super::virtio_pci);
    }
}
