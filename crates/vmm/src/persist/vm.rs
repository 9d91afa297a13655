//! The KVM state of the VM itself: [`save_vm`] and [`restore_vm`].
//!
//! With an in-kernel irqchip that is the two 8259 PICs and the IOAPIC (`KVM_GET_IRQCHIP`)
//! and the 8254 PIT (`KVM_GET_PIT2`); for every VM it is the guest clock (`KVM_GET_CLOCK`,
//! the kvmclock base the guest's time is computed from). The local APICs belong to the
//! vCPUs ([`super::vcpu`]).
//!
//! # The guest clock
//!
//! [`restore_vm`] sets the clock with `KVM_SET_CLOCK` and no flags, so kvmclock continues
//! from exactly the saved value: for the guest no time passes while the snapshot is on disk
//! (its monotonic clock has no jump, its timers do not all expire at once), and a snapshot
//! restored twice starts from the same time twice. The guest's wall-clock time is then
//! behind by the time the snapshot was stored until the guest corrects it (NTP, or
//! re-reading the RTC). `KVM_CLOCK_REALTIME` would instead advance the clock by the host's
//! elapsed real time; densevm does not use it.
//!
//! # Order
//!
//! The target VM must already have its irqchip and PIT (created as `builder.rs` does,
//! `Vm::create_irqchip`); restoring into a VM without them is [`PersistError::NoIrqchip`].
//! Restore the VM before its vCPUs (see [`super`]).

use super::{kvm_err, PersistError};
use kvm_bindings::{
    kvm_clock_data, kvm_ioapic_state, kvm_irqchip, kvm_pic_state, kvm_pit_state2,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The in-kernel interrupt controllers and timer.
#[derive(Clone, Serialize, Deserialize)]
pub struct IrqchipState {
    /// The master 8259 PIC (`chip_id` `KVM_IRQCHIP_PIC_MASTER`).
    pub pic_master: kvm_irqchip,
    /// The slave 8259 PIC (`chip_id` `KVM_IRQCHIP_PIC_SLAVE`).
    pub pic_slave: kvm_irqchip,
    /// The IOAPIC (`chip_id` `KVM_IRQCHIP_IOAPIC`): its redirection table ("pins").
    pub ioapic: kvm_irqchip,
    /// The 8254 PIT: its three channels and flags.
    pub pit: kvm_pit_state2,
}

impl IrqchipState {
    /// The master PIC's registers.
    pub fn pic_master_state(&self) -> kvm_pic_state {
        // SAFETY: `chip` is a union of plain integer structures, so every bit pattern is a
        // valid `kvm_pic_state`; `pic` is the member KVM fills for a PIC.
        unsafe { self.pic_master.chip.pic }
    }

    /// The slave PIC's registers.
    pub fn pic_slave_state(&self) -> kvm_pic_state {
        // SAFETY: as in `pic_master_state`.
        unsafe { self.pic_slave.chip.pic }
    }

    /// The IOAPIC's registers.
    pub fn ioapic_state(&self) -> kvm_ioapic_state {
        // SAFETY: as in `pic_master_state`; `ioapic` is the member KVM fills for the
        // IOAPIC.
        unsafe { self.ioapic.chip.ioapic }
    }

    /// The IOAPIC's 24 redirection-table entries, as 64-bit values.
    pub fn ioapic_redirection(&self) -> [u64; 24] {
        let ioapic = self.ioapic_state();
        // SAFETY: each entry is a union of a u64 and a bit-field struct of the same size;
        // every bit pattern is a valid u64.
        std::array::from_fn(|i| unsafe { ioapic.redirtbl[i].bits })
    }
}

impl fmt::Debug for IrqchipState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ioapic = self.ioapic_state();
        f.debug_struct("IrqchipState")
            .field("pic_master", &self.pic_master_state())
            .field("pic_slave", &self.pic_slave_state())
            .field("ioapic_base", &format_args!("{:#x}", ioapic.base_address))
            .field("ioapic_id", &ioapic.id)
            .field("ioapic_irr", &format_args!("{:#x}", ioapic.irr))
            .field("ioapic_redirection", &self.ioapic_redirection())
            .field("pit", &self.pit)
            .finish()
    }
}

/// The KVM state of a VM (see the module docs).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmState {
    /// PICs, IOAPIC and PIT; `None` for a VM without an in-kernel irqchip.
    pub irqchip: Option<IrqchipState>,
    /// The guest clock (`KVM_GET_CLOCK`); `clock` is in nanoseconds.
    pub clock: kvm_clock_data,
}

fn get_chip(fd: &VmFd, chip_id: u32) -> Result<kvm_irqchip, PersistError> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    fd.get_irqchip(&mut chip)
        .map_err(kvm_err("KVM_GET_IRQCHIP"))?;
    Ok(chip)
}

/// Saves the state of the VM `fd`; `irqchip` says whether it has an in-kernel irqchip and
/// PIT (`Vm::has_irqchip`). Every vCPU must be stopped outside `KVM_RUN` meanwhile.
pub fn save_vm(fd: &VmFd, irqchip: bool) -> Result<VmState, PersistError> {
    let irqchip = if irqchip {
        Some(IrqchipState {
            pic_master: get_chip(fd, KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: get_chip(fd, KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: get_chip(fd, KVM_IRQCHIP_IOAPIC)?,
            pit: fd.get_pit2().map_err(kvm_err("KVM_GET_PIT2"))?,
        })
    } else {
        None
    };
    let clock = fd.get_clock().map_err(kvm_err("KVM_GET_CLOCK"))?;
    Ok(VmState { irqchip, clock })
}

/// Restores `state` into the VM `fd`, which must already have an in-kernel irqchip and PIT
/// if the state has them; restore the VM before its vCPUs.
pub fn restore_vm(fd: &VmFd, state: &VmState) -> Result<(), PersistError> {
    // ENXIO: the VM has no irqchip or no PIT.
    let missing = |what: &'static str| {
        move |e: kvm_ioctls::Error| match e.errno() {
            libc::ENXIO => PersistError::NoIrqchip,
            _ => kvm_err(what)(e),
        }
    };
    if let Some(chips) = &state.irqchip {
        for (chip, id, name) in [
            (&chips.pic_master, KVM_IRQCHIP_PIC_MASTER, "master PIC"),
            (&chips.pic_slave, KVM_IRQCHIP_PIC_SLAVE, "slave PIC"),
            (&chips.ioapic, KVM_IRQCHIP_IOAPIC, "IOAPIC"),
        ] {
            if chip.chip_id != id {
                return Err(PersistError::InvalidState {
                    what: "irqchip",
                    detail: format!("the {name} has chip id {}, not {id}", chip.chip_id),
                });
            }
            fd.set_irqchip(chip).map_err(missing("KVM_SET_IRQCHIP"))?;
        }
        fd.set_pit2(&chips.pit).map_err(missing("KVM_SET_PIT2"))?;
    }
    // No flags: the clock continues from the saved value (see the module docs).
    let clock = kvm_clock_data {
        clock: state.clock.clock,
        ..Default::default()
    };
    fd.set_clock(&clock).map_err(kvm_err("KVM_SET_CLOCK"))
}
