//! The KVM VM: creation, memory slots, and the optional in-kernel irqchip and PIT.

use crate::memory::{GuestMemory, SlotPiece};
use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MEM_READONLY, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use thiserror::Error;

/// Address of the TSS KVM needs below 4 GiB (three pages), clear of guest RAM.
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
/// Address of the EPT identity-map page KVM needs.
pub const KVM_IDENTITY_MAP_ADDR: u64 = 0xfffb_c000;

/// Failure to create or configure the VM.
#[derive(Debug, Error)]
pub enum VmError {
    /// /dev/kvm is missing or unusable.
    #[error(
        "cannot open /dev/kvm: {0} (is the kvm module loaded and do you have access to /dev/kvm?)"
    )]
    OpenKvm(kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what} failed: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The ioctl error.
        source: kvm_ioctls::Error,
    },
    /// The host's KVM cannot map memory read-only for the guest.
    #[error("this host's KVM lacks KVM_CAP_READONLY_MEM, which copy-on-write of --pmem snapshots and base images needs; flatten the image (`densevm image convert`) or use a newer kernel")]
    NoReadonlyMem,
    /// More memory slots than KVM allows.
    #[error("guest memory needs {needed} KVM memory slots but this host allows {limit}; use fewer --pmem images or compact them (`densevm image compact`)")]
    TooManySlots {
        /// Slots needed.
        needed: usize,
        /// KVM_CAP_NR_MEMSLOTS.
        limit: usize,
    },
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// A VM file descriptor plus the KVM system handle it came from.
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
    irqchip: bool,
    /// The KVM slot numbers of each region of the registered [`GuestMemory`], in order.
    region_slots: Vec<Vec<u32>>,
    /// Slot numbers freed by [`Vm::replace_region_slots`], reused first.
    free_slots: Vec<u32>,
    /// The lowest slot number never used.
    next_slot: u32,
}

impl Vm {
    /// Opens /dev/kvm and creates a VM.
    pub fn new() -> Result<Self, VmError> {
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let fd = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
        fd.set_tss_address(KVM_TSS_ADDR as usize)
            .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
        fd.set_identity_map_address(KVM_IDENTITY_MAP_ADDR)
            .map_err(kvm_err("KVM_SET_IDENTITY_MAP_ADDR"))?;
        Ok(Self {
            kvm,
            fd,
            irqchip: false,
            region_slots: Vec::new(),
            free_slots: Vec::new(),
            next_slot: 0,
        })
    }

    /// Creates the in-kernel PIC/IOAPIC/LAPIC and the PIT (guests that take interrupts).
    pub fn create_irqchip(&mut self) -> Result<(), VmError> {
        self.fd
            .create_irq_chip()
            .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.fd
            .create_pit2(pit)
            .map_err(kvm_err("KVM_CREATE_PIT2"))?;
        self.irqchip = true;
        Ok(())
    }

    /// Whether an in-kernel irqchip exists.
    pub fn has_irqchip(&self) -> bool {
        self.irqchip
    }

    /// Registers every guest memory region as KVM memory slots (one per region, or
    /// several where an external region asks for read-only ranges).
    pub fn register_memory(&mut self, memory: &GuestMemory) -> Result<(), VmError> {
        let per_region: Vec<Vec<SlotPiece>> =
            memory.regions().iter().map(|r| r.slot_pieces()).collect();
        let pieces: usize = per_region.iter().map(Vec::len).sum();
        let limit = self.kvm.get_nr_memslots();
        if pieces > limit {
            return Err(VmError::TooManySlots {
                needed: pieces,
                limit,
            });
        }
        for region in &per_region {
            let slots = self.add_slots(region)?;
            self.region_slots.push(slots);
        }
        Ok(())
    }

    /// How many slots region `index` may use in a [`Vm::replace_region_slots`]: its own plus
    /// every slot no other region uses.
    pub fn slot_budget(&self, index: usize) -> usize {
        let others: usize = self
            .region_slots
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != index)
            .map(|(_, s)| s.len())
            .sum();
        self.kvm.get_nr_memslots().saturating_sub(others)
    }

    /// Replaces the slots of region `index` (in the order [`Vm::register_memory`] saw the
    /// regions) with `pieces`. Between the removal of the old slots and the addition of the
    /// new ones the region has no memory, so every vCPU must be paused
    /// (`vstate::pause::PauseGate`) while this runs.
    pub fn replace_region_slots(
        &mut self,
        index: usize,
        pieces: &[SlotPiece],
    ) -> Result<(), VmError> {
        let budget = self.slot_budget(index);
        if pieces.len() > budget {
            return Err(VmError::TooManySlots {
                needed: pieces.len(),
                limit: budget,
            });
        }
        let old = std::mem::take(&mut self.region_slots[index]);
        for &slot in &old {
            let remove = kvm_userspace_memory_region {
                slot,
                memory_size: 0,
                ..Default::default()
            };
            // SAFETY: a zero-sized region deletes the slot; no host memory is referenced.
            unsafe { self.fd.set_user_memory_region(remove) }
                .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION (delete)"))?;
            self.free_slots.push(slot);
        }
        let slots = self.add_slots(pieces)?;
        self.region_slots[index] = slots;
        Ok(())
    }

    fn add_slots(&mut self, pieces: &[SlotPiece]) -> Result<Vec<u32>, VmError> {
        if pieces.iter().any(|p| p.readonly) && !self.kvm.check_extension(Cap::ReadonlyMem) {
            return Err(VmError::NoReadonlyMem);
        }
        let mut slots = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let slot = self.free_slots.pop().unwrap_or_else(|| {
                self.next_slot += 1;
                self.next_slot - 1
            });
            let mem_region = kvm_userspace_memory_region {
                slot,
                flags: if piece.readonly { KVM_MEM_READONLY } else { 0 },
                guest_phys_addr: piece.gpa,
                memory_size: piece.size,
                userspace_addr: piece.host_addr,
            };
            // SAFETY: the host range belongs to a live mapping owned by the caller's
            // `GuestMemory` (or an external region), which outlives the VM.
            unsafe { self.fd.set_user_memory_region(mem_region) }
                .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
            slots.push(slot);
        }
        Ok(slots)
    }

    /// The KVM system handle.
    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// The VM file descriptor.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }
}
