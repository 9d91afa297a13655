//! MSI-X: the vector table and pending bits a guest programs through a BAR, and delivery of
//! each vector through an eventfd that the VMM has bound to a KVM MSI route (irqfd).
//!
//! Masking is done here, in user space: a masked vector's interrupt sets its pending bit
//! instead of signalling the eventfd, and unmasking delivers it. The route of a vector is
//! updated whenever the guest changes its address or data.

use super::state::{MsixState, PciStateError};
use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

/// Bytes per table entry (address low, address high, data, vector control).
pub const MSIX_ENTRY_SIZE: u64 = 16;
const CTRL_MASKED: u32 = 1;

/// An MSI message: what the device writes, where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsiMessage {
    /// Message address.
    pub address: u64,
    /// Message data.
    pub data: u32,
}

/// Where vectors are routed (the VMM: KVM GSI routes).
pub trait MsiRoutes: Send + Sync {
    /// Points interrupt `gsi` at `msg`.
    fn set_route(&self, gsi: u32, msg: MsiMessage) -> std::io::Result<()>;
}

/// One vector's delivery: the GSI of its route and the eventfd bound to it (irqfd).
#[derive(Debug)]
pub struct MsixVector {
    /// The GSI the VMM routes this vector through.
    pub gsi: u32,
    /// Signalled to raise the interrupt.
    pub trigger: EventFd,
}

/// The MSI-X state of one function.
pub struct Msix {
    entries: Vec<[u32; 4]>,
    pending: Vec<bool>,
    vectors: Vec<MsixVector>,
    routes: Arc<dyn MsiRoutes>,
    enabled: bool,
    function_masked: bool,
}

impl Msix {
    /// A table with one entry per vector, every entry masked, MSI-X disabled.
    pub fn new(vectors: Vec<MsixVector>, routes: Arc<dyn MsiRoutes>) -> Self {
        let n = vectors.len();
        Self {
            entries: vec![[0, 0, 0, CTRL_MASKED]; n],
            pending: vec![false; n],
            vectors,
            routes,
            enabled: false,
            function_masked: false,
        }
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.vectors.len()
    }

    /// Whether there are no vectors.
    pub fn is_empty(&self) -> bool {
        self.vectors.is_empty()
    }

    /// Whether the guest enabled MSI-X.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The guest wrote the capability's enable and function-mask bits.
    pub fn set_control(&mut self, enabled: bool, function_masked: bool) {
        self.enabled = enabled;
        self.function_masked = function_masked;
        self.deliver_pending();
    }

    /// Reads `data` at byte `offset` of the table.
    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        let value = self.table_dwords(offset, data.len());
        for (i, b) in data.iter_mut().enumerate() {
            *b = (value >> (8 * i)) as u8;
        }
    }

    fn table_dwords(&self, offset: u64, len: usize) -> u64 {
        let dword = |o: u64| -> u64 {
            let (e, w) = (
                (o / MSIX_ENTRY_SIZE) as usize,
                ((o % MSIX_ENTRY_SIZE) / 4) as usize,
            );
            self.entries.get(e).map_or(0, |x| u64::from(x[w]))
        };
        if offset % 4 != 0 || !(len == 4 || len == 8) {
            return 0;
        }
        let lo = dword(offset);
        if len == 8 {
            lo | dword(offset + 4) << 32
        } else {
            lo
        }
    }

    /// A guest write at byte `offset` of the table (aligned 4- or 8-byte accesses; others
    /// are ignored, as the PCI spec allows).
    pub fn write_table(&mut self, offset: u64, data: &[u8]) {
        if offset % 4 != 0 || !(data.len() == 4 || data.len() == 8) {
            return;
        }
        for (i, chunk) in data.chunks_exact(4).enumerate() {
            let o = offset + 4 * i as u64;
            let (e, w) = (
                (o / MSIX_ENTRY_SIZE) as usize,
                ((o % MSIX_ENTRY_SIZE) / 4) as usize,
            );
            let value = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let Some(entry) = self.entries.get_mut(e) else {
                continue;
            };
            let old = entry[w];
            entry[w] = value;
            if w < 3 && old != value {
                self.update_route(e);
            }
        }
        self.deliver_pending();
    }

    /// Reads the pending-bit array at byte `offset`.
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let base = (offset as usize + i) * 8;
            *b = (0..8)
                .filter(|bit| self.pending.get(base + bit).copied().unwrap_or(false))
                .fold(0u8, |acc, bit| acc | 1 << bit);
        }
    }

    fn update_route(&self, e: usize) {
        let [lo, hi, data, _] = self.entries[e];
        let msg = MsiMessage {
            address: u64::from(hi) << 32 | u64::from(lo),
            data,
        };
        if let Err(err) = self.routes.set_route(self.vectors[e].gsi, msg) {
            tracing::error!("MSI-X: cannot route vector {e}: {err}");
        }
    }

    fn masked(&self, v: usize) -> bool {
        self.function_masked || self.entries[v][3] & CTRL_MASKED != 0
    }

    fn deliver_pending(&mut self) {
        if !self.enabled {
            return;
        }
        for v in 0..self.vectors.len() {
            if self.pending[v] && !self.masked(v) {
                self.pending[v] = false;
                let _ = self.vectors[v].trigger.write(1);
            }
        }
    }

    /// The table, pending bits and control bits (for a snapshot).
    pub fn save_state(&self) -> MsixState {
        MsixState {
            entries: self.entries.clone(),
            pending: self.pending.clone(),
            enabled: self.enabled,
            function_masked: self.function_masked,
        }
    }

    /// Applies a saved table to this one (same vector count), routes every vector the guest
    /// programmed (masked ones too: unmasking changes no address, so nothing would route them
    /// later) and delivers pending interrupts of unmasked vectors. Nothing changes when the
    /// state is refused; a routing failure leaves the table applied.
    pub fn restore_state(&mut self, state: &MsixState) -> Result<(), PciStateError> {
        if state.entries.len() != self.vectors.len() {
            return Err(PciStateError::MsixTableSize {
                saved: state.entries.len(),
                current: self.vectors.len(),
            });
        }
        if state.pending.len() != state.entries.len() {
            return Err(PciStateError::MsixPendingSize {
                pending: state.pending.len(),
                table: state.entries.len(),
            });
        }
        self.entries.clone_from(&state.entries);
        self.pending.clone_from(&state.pending);
        self.enabled = state.enabled;
        self.function_masked = state.function_masked;
        for (vector, entry) in self.entries.iter().enumerate() {
            if entry[..3] == [0; 3] {
                continue; // never programmed: no route, as before the snapshot
            }
            let msg = MsiMessage {
                address: u64::from(entry[1]) << 32 | u64::from(entry[0]),
                data: entry[2],
            };
            self.routes
                .set_route(self.vectors[vector].gsi, msg)
                .map_err(|source| PciStateError::Route { vector, source })?;
        }
        self.deliver_pending();
        Ok(())
    }

    /// Raises vector `vector`: delivered now, or remembered as pending while masked. Without
    /// MSI-X enabled (densevm offers no INTx) or for a vector out of range, nothing happens.
    pub fn trigger(&mut self, vector: u16) {
        let v = usize::from(vector);
        if !self.enabled || v >= self.vectors.len() {
            return;
        }
        if self.masked(v) {
            self.pending[v] = true;
        } else {
            let _ = self.vectors[v].trigger.write(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Routes(Mutex<Vec<(u32, MsiMessage)>>);
    impl MsiRoutes for Routes {
        fn set_route(&self, gsi: u32, msg: MsiMessage) -> std::io::Result<()> {
            self.0.lock().unwrap().push((gsi, msg));
            Ok(())
        }
    }

    fn fired(v: &MsixVector) -> bool {
        v.trigger.read().is_ok()
    }

    fn msix(n: u32) -> (Msix, Arc<Routes>) {
        let routes = Arc::new(Routes::default());
        let vectors = (0..n)
            .map(|i| MsixVector {
                gsi: 24 + i,
                trigger: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            })
            .collect();
        (Msix::new(vectors, routes.clone()), routes)
    }

    #[test]
    fn routes_follow_the_table_and_masking_defers_delivery() {
        let (mut m, routes) = msix(2);
        m.trigger(1);
        assert!(!fired(&m.vectors[1]), "MSI-X disabled: nothing delivered");
        m.set_control(true, false);
        m.write_table(16, &0xfee0_0000u32.to_le_bytes());
        m.write_table(24, &0x4041u32.to_le_bytes());
        assert_eq!(
            routes.0.lock().unwrap().last(),
            Some(&(
                25,
                MsiMessage {
                    address: 0xfee0_0000,
                    data: 0x4041
                }
            ))
        );
        m.trigger(1);
        assert!(!fired(&m.vectors[1]), "entries start masked");
        let mut pba = [0u8; 1];
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0b10);
        m.write_table(28, &0u32.to_le_bytes()); // unmask: the pending interrupt arrives
        assert!(fired(&m.vectors[1]));
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0);
        m.trigger(1);
        assert!(fired(&m.vectors[1]));
        m.set_control(true, true);
        m.trigger(1);
        assert!(!fired(&m.vectors[1]), "function mask");
        m.set_control(true, false);
        assert!(fired(&m.vectors[1]));
        let mut d = [0u8; 8];
        m.read_table(16, &mut d);
        assert_eq!(u64::from_le_bytes(d), 0xfee0_0000);
        // Out of range and odd accesses are ignored, never panic.
        m.trigger(7);
        m.write_table(1000, &[1; 4]);
        m.write_table(2, &[1; 4]);
        m.write_table(0, &[1; 3]);
        m.read_table(1000, &mut d);
        assert_eq!(d, [0; 8]);
    }

    #[test]
    fn state_restores_routes_and_pending_bits() {
        let (mut a, _) = msix(3);
        a.set_control(true, false);
        a.write_table(0, &0xfee0_0000u32.to_le_bytes());
        a.write_table(8, &0x40u32.to_le_bytes());
        a.write_table(12, &0u32.to_le_bytes()); // vector 0 unmasked
        a.write_table(16, &0xfee0_1000u32.to_le_bytes()); // vector 1 programmed, masked
        a.write_table(24, &0x41u32.to_le_bytes());
        a.trigger(1);
        let saved = a.save_state();
        assert_eq!(saved.pending, [false, true, false]);

        let (mut b, routes) = msix(3);
        b.restore_state(&saved).unwrap();
        let got = routes.0.lock().unwrap().clone();
        let msg = |address, data| MsiMessage { address, data };
        assert_eq!(
            got,
            [(24, msg(0xfee0_0000, 0x40)), (25, msg(0xfee0_1000, 0x41))],
            "programmed vectors routed, the untouched one not"
        );
        assert_eq!(b.save_state(), saved);
        b.trigger(0);
        assert!(fired(&b.vectors[0]));
        b.write_table(28, &0u32.to_le_bytes());
        assert!(
            fired(&b.vectors[1]),
            "pending interrupt delivered on unmask"
        );

        let (mut c, routes) = msix(2);
        let e = c.restore_state(&saved).unwrap_err();
        assert!(
            matches!(
                e,
                PciStateError::MsixTableSize {
                    saved: 3,
                    current: 2
                }
            ),
            "{e}"
        );
        let mut bad = saved.clone();
        bad.pending.pop();
        let (mut d, _) = msix(3);
        let e = d.restore_state(&bad).unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
        assert!(routes.0.lock().unwrap().is_empty());
        assert!(!d.enabled(), "a refused state changes nothing");
    }
}
