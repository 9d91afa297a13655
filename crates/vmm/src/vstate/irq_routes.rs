//! KVM GSI routing: the in-kernel irqchip's default routes plus one MSI route per MSI-X
//! vector of the PCI devices, rewritten as a whole (`KVM_SET_GSI_ROUTING`) whenever a guest
//! reprograms a vector.

use densevm_devices::pci::{MsiMessage, MsiRoutes};
use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// IOAPIC pins; GSIs from here on are free for MSI routes.
pub const IOAPIC_PINS: u32 = 24;

/// The VM's interrupt routes.
pub struct IrqRoutes {
    vm: Arc<VmFd>,
    msi: Mutex<BTreeMap<u32, MsiMessage>>,
}

fn irqchip(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        ..Default::default()
    };
    e.u.irqchip.irqchip = chip;
    e.u.irqchip.pin = pin;
    e
}

fn msi(gsi: u32, m: MsiMessage) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_MSI,
        ..Default::default()
    };
    e.u.msi.address_lo = m.address as u32;
    e.u.msi.address_hi = (m.address >> 32) as u32;
    e.u.msi.data = m.data;
    e
}

/// KVM's default routes for the in-kernel PIC and IOAPIC (what `KVM_CREATE_IRQCHIP` sets
/// up): GSI 0–15 to both the PIC and the IOAPIC pin of the same number, 16–23 to the IOAPIC.
fn default_routes() -> Vec<kvm_irq_routing_entry> {
    let mut v = Vec::new();
    for gsi in 0..IOAPIC_PINS {
        v.push(irqchip(gsi, KVM_IRQCHIP_IOAPIC, gsi));
        if gsi < 16 {
            let chip = if gsi < 8 {
                KVM_IRQCHIP_PIC_MASTER
            } else {
                KVM_IRQCHIP_PIC_SLAVE
            };
            v.push(irqchip(gsi, chip, gsi % 8));
        }
    }
    v
}

impl IrqRoutes {
    /// Routes for a VM with an in-kernel irqchip.
    pub fn new(vm: Arc<VmFd>) -> Self {
        Self {
            vm,
            msi: Mutex::new(BTreeMap::new()),
        }
    }

    fn apply(&self, msi_routes: &BTreeMap<u32, MsiMessage>) -> std::io::Result<()> {
        let mut entries = default_routes();
        entries.extend(msi_routes.iter().map(|(&gsi, &m)| msi(gsi, m)));
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|e| std::io::Error::other(format!("GSI routing table: {e:?}")))?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }
}

impl MsiRoutes for IrqRoutes {
    fn set_route(&self, gsi: u32, msg: MsiMessage) -> std::io::Result<()> {
        let mut routes = self.msi.lock().unwrap_or_else(|p| p.into_inner());
        if routes.get(&gsi) == Some(&msg) {
            return Ok(());
        }
        routes.insert(gsi, msg);
        self.apply(&routes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_routes_match_kvm_create_irqchip() {
        let r = default_routes();
        assert_eq!(r.len(), 24 + 16);
        // SAFETY: these entries were built as irqchip routes.
        let pins: Vec<(u32, u32, u32)> = r
            .iter()
            .map(|e| {
                (e.gsi, unsafe { e.u.irqchip.irqchip }, unsafe {
                    e.u.irqchip.pin
                })
            })
            .collect();
        assert!(pins.contains(&(4, KVM_IRQCHIP_IOAPIC, 4)), "COM1");
        assert!(pins.contains(&(4, KVM_IRQCHIP_PIC_MASTER, 4)));
        assert!(pins.contains(&(9, KVM_IRQCHIP_PIC_SLAVE, 1)));
        assert!(pins.contains(&(23, KVM_IRQCHIP_IOAPIC, 23)));
        let m = msi(
            30,
            MsiMessage {
                address: 0x1_fee0_0000,
                data: 0x41,
            },
        );
        assert_eq!(m.type_, KVM_IRQ_ROUTING_MSI);
        // SAFETY: built as an MSI route.
        let (lo, hi) = unsafe { (m.u.msi.address_lo, m.u.msi.address_hi) };
        assert_eq!((lo, hi), (0xfee0_0000, 1));
    }
}
