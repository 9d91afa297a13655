//! The KVM VM: creation, memory slots, and the optional in-kernel irqchip and PIT.

use crate::memory::{GuestMemory, SlotPiece};
use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MEM_READONLY, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use std::collections::HashSet;
use std::sync::Arc;
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

/// How to turn one set of slots into another.
#[derive(Debug, Default, PartialEq, Eq)]
struct SlotDiff {
    /// Slots whose piece is in both sets.
    keep: Vec<(u32, SlotPiece)>,
    /// Slots to delete.
    remove: Vec<u32>,
    /// Pieces to register.
    add: Vec<SlotPiece>,
}

fn slot_diff(old: &[(u32, SlotPiece)], new: &[SlotPiece]) -> SlotDiff {
    let wanted: HashSet<&SlotPiece> = new.iter().collect();
    let have: HashSet<&SlotPiece> = old.iter().map(|(_, p)| p).collect();
    let mut diff = SlotDiff::default();
    for &(slot, piece) in old {
        if wanted.contains(&piece) {
            diff.keep.push((slot, piece));
        } else {
            diff.remove.push(slot);
        }
    }
    diff.add = new.iter().filter(|p| !have.contains(p)).copied().collect();
    diff
}

/// A VM file descriptor plus the KVM system handle it came from.
pub struct Vm {
    kvm: Kvm,
    fd: Arc<VmFd>,
    irqchip: bool,
    /// The KVM slots (number and piece) of each region of the registered [`GuestMemory`],
    /// in order.
    region_slots: Vec<Vec<(u32, SlotPiece)>>,
    /// Slot numbers freed by [`Vm::replace_region_slots`], reused first.
    free_slots: Vec<u32>,
    /// The lowest slot number never used.
    next_slot: u32,
    /// KVM_CAP_NR_MEMSLOTS, read once by [`Vm::register_memory`].
    slot_limit: usize,
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
            fd: Arc::new(fd),
            irqchip: false,
            region_slots: Vec::new(),
            free_slots: Vec::new(),
            next_slot: 0,
            slot_limit: 0,
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
        self.slot_limit = self.kvm.get_nr_memslots();
        if pieces > self.slot_limit {
            return Err(VmError::TooManySlots {
                needed: pieces,
                limit: self.slot_limit,
            });
        }
        // Refreshes only shrink read-only ranges, so this check covers them too.
        let readonly = per_region.iter().flatten().any(|p| p.readonly);
        if readonly && !self.kvm.check_extension(Cap::ReadonlyMem) {
            return Err(VmError::NoReadonlyMem);
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
        self.slot_limit.saturating_sub(others)
    }

    /// Replaces the slots of region `index` (in the order [`Vm::register_memory`] saw the
    /// regions) with `pieces`: slots whose piece is unchanged stay, the others are deleted
    /// and the new pieces added. Between the two steps part of the region has no memory, so
    /// every vCPU must be paused (`vstate::pause::PauseGate`) while this runs. Returns how
    /// many slots were deleted or added.
    pub fn replace_region_slots(
        &mut self,
        index: usize,
        pieces: &[SlotPiece],
    ) -> Result<usize, VmError> {
        let budget = self.slot_budget(index);
        if pieces.len() > budget {
            return Err(VmError::TooManySlots {
                needed: pieces.len(),
                limit: budget,
            });
        }
        let old = std::mem::take(&mut self.region_slots[index]);
        let diff = slot_diff(&old, pieces);
        for &slot in &diff.remove {
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
        let mut slots = diff.keep;
        slots.extend(self.add_slots(&diff.add)?);
        slots.sort_unstable_by_key(|(_, p)| p.gpa);
        self.region_slots[index] = slots;
        Ok(diff.remove.len() + diff.add.len())
    }

    fn add_slots(&mut self, pieces: &[SlotPiece]) -> Result<Vec<(u32, SlotPiece)>, VmError> {
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
            slots.push((slot, *piece));
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

    /// The VM file descriptor, for components that outlive a borrow of the `Vm` (interrupt
    /// routes updated from vCPU threads).
    pub fn shared_fd(&self) -> Arc<VmFd> {
        self.fd.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(gpa: u64, size: u64, readonly: bool) -> SlotPiece {
        SlotPiece {
            gpa,
            size,
            host_addr: 0x7000_0000_0000 + gpa,
            readonly,
        }
    }

    /// A page copied up in the middle of a read-only piece splits only that piece: the
    /// writable piece before it and everything after stay registered as they are.
    #[test]
    fn a_split_read_only_piece_changes_only_its_own_slots() {
        const P: u64 = 4096;
        let old = vec![
            (0, piece(0, 4 * P, false)),
            (1, piece(4 * P, 8 * P, true)),
            (2, piece(12 * P, 4 * P, false)),
            (3, piece(16 * P, 4 * P, true)),
            (4, piece(20 * P, 4 * P, false)),
        ];
        let new = vec![
            piece(0, 4 * P, false),
            piece(4 * P, 2 * P, true),
            piece(6 * P, P, false),
            piece(7 * P, 5 * P, true),
            piece(12 * P, 4 * P, false),
            piece(16 * P, 4 * P, true),
            piece(20 * P, 4 * P, false),
        ];
        let d = slot_diff(&old, &new);
        assert_eq!(d.remove, vec![1]);
        assert_eq!(
            d.add,
            vec![
                piece(4 * P, 2 * P, true),
                piece(6 * P, P, false),
                piece(7 * P, 5 * P, true)
            ]
        );
        assert_eq!(d.keep.len(), 4);
        // Everything copied up: one writable piece replaces all five.
        let d = slot_diff(&old, &[piece(0, 24 * P, false)]);
        assert_eq!(d.remove, vec![0, 1, 2, 3, 4]);
        assert_eq!(d.add, vec![piece(0, 24 * P, false)]);
        assert!(d.keep.is_empty());
        // Nothing changed: nothing to do.
        let same: Vec<SlotPiece> = old.iter().map(|&(_, p)| p).collect();
        let d = slot_diff(&old, &same);
        assert!(d.remove.is_empty() && d.add.is_empty());
    }
}
