//! The KVM state of one vCPU: [`save_vcpu`] and [`restore_vcpu`].
//!
//! # What is saved
//!
//! Everything KVM keeps for a vCPU that the guest can observe: general and special
//! registers, the FPU/SSE/AVX state as the XSAVE area (`KVM_GET_XSAVE2` at the size
//! `KVM_CAP_XSAVE2` reports, else the 4 KiB `KVM_GET_XSAVE`), XCR0, debug registers, the
//! local APIC (with an in-kernel irqchip), the MP state, pending exceptions, interrupts,
//! NMIs and SMIs (`KVM_GET_VCPU_EVENTS`), the MSRs, the CPUID table the vCPU was given and
//! its TSC frequency.
//!
//! The MSRs are those `KVM_GET_MSR_INDEX_LIST` names plus the TSC, TSC-deadline and KVM
//! paravirtual (kvmclock, async PF, steal time, PV EOI, poll control) MSRs, read in
//! batches. `KVM_GET_MSRS` stops at the first MSR it cannot read (one this CPU or this
//! vCPU's CPUID does not have); that MSR is dropped and the batch continues after it, so
//! the state holds exactly the MSRs KVM returned.
//!
//! # Order
//!
//! Saving reads the MP state first (`KVM_GET_MP_STATE` accepts pending INIT/SIPI events and
//! may change the vCPU and LAPIC state the other reads see) and the vCPU events last (the
//! other reads can change what is pending). The vCPU must not run meanwhile.
//!
//! Restoring follows what KVM requires:
//! 1. the TSC frequency (`KVM_SET_TSC_KHZ`), before any TSC value is written;
//! 2. CPUID (`KVM_SET_CPUID2`): what KVM accepts in later calls (MSRs, XCR0, XSAVE
//!    components) depends on the guest's CPUID;
//! 3. the MP state, then the general and special registers (`KVM_SET_SREGS` sets the APIC
//!    base MSR, which the LAPIC restore depends on), the XSAVE area, XCRs, debug registers;
//! 4. the LAPIC, after the special registers;
//! 5. the MSRs, after the LAPIC: `IA32_TSC_DEADLINE` is ignored unless the LAPIC timer is
//!    already in TSC-deadline mode, and it is written in a last batch of its own, after
//!    `IA32_TSC`, because the deadline is an absolute TSC value;
//! 6. the vCPU events last, because `KVM_SET_REGS` (and `KVM_SET_SREGS`) discard pending
//!    exceptions and interrupts.

use super::{kvm_err, PersistError};
use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs, Xsave, KVM_MAX_CPUID_ENTRIES,
    KVM_VCPUEVENT_VALID_NMI_PENDING, KVM_VCPUEVENT_VALID_SIPI_VECTOR,
};
use kvm_ioctls::{Cap, Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

/// `IA32_TSC`.
pub const MSR_IA32_TSC: u32 = 0x10;
/// `IA32_TSC_DEADLINE`: restored after the LAPIC and after `IA32_TSC`.
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
/// `IA32_TSC_AUX` (what RDTSCP and RDPID return).
pub const MSR_IA32_TSC_AUX: u32 = 0xc000_0103;
/// `IA32_KERNEL_GS_BASE` (what SWAPGS swaps in).
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// `IA32_STAR` (SYSCALL segment selectors).
pub const MSR_STAR: u32 = 0xc000_0081;

/// MSRs saved even if `KVM_GET_MSR_INDEX_LIST` leaves them out: the TSC, the TSC deadline,
/// `IA32_TSC_AUX` (PVM's list omits it although its KVM reads and writes it, and Linux keeps
/// the CPU number there for `getcpu`) and KVM's paravirtual MSRs (old and new kvmclock
/// system time and wall clock, async page faults, steal time, PV EOI, poll control). Those
/// KVM refuses are dropped as usual.
const EXTRA_MSRS: [u32; 12] = [
    MSR_IA32_TSC,
    MSR_IA32_TSC_DEADLINE,
    MSR_IA32_TSC_AUX,
    0x11,        // MSR_KVM_WALL_CLOCK
    0x12,        // MSR_KVM_SYSTEM_TIME
    0x4b56_4d00, // MSR_KVM_WALL_CLOCK_NEW
    0x4b56_4d01, // MSR_KVM_SYSTEM_TIME_NEW
    0x4b56_4d02, // MSR_KVM_ASYNC_PF_EN
    0x4b56_4d03, // MSR_KVM_STEAL_TIME
    0x4b56_4d04, // MSR_KVM_PV_EOI_EN
    0x4b56_4d05, // MSR_KVM_POLL_CONTROL
    0x4b56_4d06, // MSR_KVM_ASYNC_PF_INT
];

/// MSRs restored in a last `KVM_SET_MSRS` of their own (see the module docs).
const DEFERRED_MSRS: [u32; 1] = [MSR_IA32_TSC_DEADLINE];

/// MSRs per `KVM_GET_MSRS` / `KVM_SET_MSRS` call (KVM takes fewer than 256).
const MSR_BATCH: usize = 64;

/// Size of the classic `struct kvm_xsave` (`KVM_GET_XSAVE`), in 32-bit words.
const XSAVE_WORDS: usize = std::mem::size_of::<kvm_xsave>() / 4;

/// Two TSC frequencies closer than this (parts per million) are the same; KVM's own
/// tolerance for not scaling is 250 ppm.
const TSC_TOLERANCE_PPM: u64 = 250;

/// Everything KVM keeps for one vCPU (see the module docs).
///
/// kvm-bindings structures are serialized (through its `serde` feature) as arrays of their
/// bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VcpuState {
    /// The CPUID table set on the vCPU (`KVM_GET_CPUID2`), restored first.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// Runnable, halted, waiting for SIPI... (`KVM_GET_MP_STATE`).
    pub mp_state: kvm_mp_state,
    /// General registers, RIP, RFLAGS.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers, EFER, APIC base.
    pub sregs: kvm_sregs,
    /// The XSAVE area (x87, SSE, AVX... state) as 32-bit words: the 4 KiB of
    /// `struct kvm_xsave`, then whatever `KVM_CAP_XSAVE2` said follows it.
    pub xsave: Vec<u32>,
    /// XCR0 (`KVM_GET_XCRS`); `None` where KVM lacks `KVM_CAP_XCRS`.
    pub xcrs: Option<kvm_xcrs>,
    /// DR0–DR3, DR6, DR7.
    pub debugregs: kvm_debugregs,
    /// The local APIC's registers; `None` without an in-kernel irqchip.
    pub lapic: Option<kvm_lapic_state>,
    /// Index and value of every MSR KVM returned, in the order read.
    pub msrs: Vec<kvm_msr_entry>,
    /// Pending or injected exception, interrupt, NMI, SMI; interrupt shadow.
    pub vcpu_events: kvm_vcpu_events,
    /// The guest TSC frequency (`KVM_GET_TSC_KHZ`), when KVM reports one.
    pub tsc_khz: Option<u32>,
}

impl VcpuState {
    /// The saved value of `index`, if that MSR was saved.
    pub fn msr(&self, index: u32) -> Option<u64> {
        self.msrs.iter().find(|m| m.index == index).map(|m| m.data)
    }
}

/// Saves the state of the vCPU `fd`; it must not be running (`KVM_RUN`) meanwhile. `kvm`
/// is the system handle the VM came from (for the MSR list and capabilities).
pub fn save_vcpu(fd: &VcpuFd, kvm: &Kvm) -> Result<VcpuState, PersistError> {
    let mp_state = fd.get_mp_state().map_err(kvm_err("KVM_GET_MP_STATE"))?;
    let regs = fd.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    let sregs = fd.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    let xsave = get_xsave(fd, kvm)?;
    let xcrs = if kvm.check_extension(Cap::Xcrs) {
        Some(fd.get_xcrs().map_err(kvm_err("KVM_GET_XCRS"))?)
    } else {
        None
    };
    let debugregs = fd.get_debug_regs().map_err(kvm_err("KVM_GET_DEBUGREGS"))?;
    let lapic = match fd.get_lapic() {
        Ok(lapic) => Some(lapic),
        // EINVAL (the only error KVM_GET_LAPIC has besides EFAULT): the VM has no in-kernel
        // irqchip, so there is no LAPIC to save.
        Err(e) if e.errno() == libc::EINVAL => None,
        Err(e) => return Err(kvm_err("KVM_GET_LAPIC")(e)),
    };
    let msrs = get_msrs(fd, &msr_indices(kvm)?)?;
    let cpuid = get_cpuid(fd)?;
    // KVM_GET_TSC_KHZ fails where the TSC frequency is unknown; the restore then keeps
    // the target's frequency.
    let tsc_khz = fd.get_tsc_khz().ok().filter(|&khz| khz != 0);
    let vcpu_events = fd
        .get_vcpu_events()
        .map_err(kvm_err("KVM_GET_VCPU_EVENTS"))?;
    Ok(VcpuState {
        cpuid,
        mp_state,
        regs,
        sregs,
        xsave,
        xcrs,
        debugregs,
        lapic,
        msrs,
        vcpu_events,
        tsc_khz,
    })
}

/// Restores `state` into the vCPU `fd`, in the order KVM requires (see the module docs).
/// `fd` must be a new vCPU of a VM built like the saved one (same vCPU id, an in-kernel
/// irqchip if the state has a LAPIC) that has not run yet; `kvm` is the VM's `/dev/kvm`
/// (the XSAVE size and the TSC-scaling capability are properties of this host's KVM).
pub fn restore_vcpu(fd: &VcpuFd, kvm: &Kvm, state: &VcpuState) -> Result<(), PersistError> {
    set_tsc_khz(fd, kvm, state.tsc_khz)?;
    let cpuid = CpuId::from_entries(&state.cpuid).map_err(|e| PersistError::InvalidState {
        what: "CPUID table",
        detail: format!("{} entries: {e:?}", state.cpuid.len()),
    })?;
    fd.set_cpuid2(&cpuid).map_err(kvm_err("KVM_SET_CPUID2"))?;
    fd.set_mp_state(state.mp_state)
        .map_err(kvm_err("KVM_SET_MP_STATE"))?;
    fd.set_regs(&state.regs).map_err(kvm_err("KVM_SET_REGS"))?;
    fd.set_sregs(&state.sregs)
        .map_err(kvm_err("KVM_SET_SREGS"))?;
    set_xsave(fd, kvm, &state.xsave)?;
    if let Some(xcrs) = &state.xcrs {
        fd.set_xcrs(xcrs).map_err(kvm_err("KVM_SET_XCRS"))?;
    }
    fd.set_debug_regs(&state.debugregs)
        .map_err(kvm_err("KVM_SET_DEBUGREGS"))?;
    if let Some(lapic) = &state.lapic {
        // KVM_SET_LAPIC says EINVAL both without an in-kernel LAPIC and for a bad state;
        // KVM_GET_LAPIC tells the first apart.
        if let Err(e) = fd.get_lapic() {
            return Err(match e.errno() {
                libc::EINVAL => PersistError::NoIrqchip,
                _ => kvm_err("KVM_GET_LAPIC")(e),
            });
        }
        fd.set_lapic(lapic).map_err(kvm_err("KVM_SET_LAPIC"))?;
    }
    let (now, deferred): (Vec<kvm_msr_entry>, Vec<kvm_msr_entry>) = state
        .msrs
        .iter()
        .partition(|m| !DEFERRED_MSRS.contains(&m.index));
    set_msrs(fd, &now)?;
    set_msrs(fd, &deferred)?;
    // KVM_GET_VCPU_EVENTS does not set KVM_VCPUEVENT_VALID_SIPI_VECTOR, without which
    // KVM_SET_VCPU_EVENTS ignores the SIPI vector an AP received (mp_state SIPI_RECEIVED);
    // VALID_NMI_PENDING (so that a pending NMI is restored) is set by GET already and
    // named here so that the restore does not depend on it.
    let mut events = state.vcpu_events;
    events.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING | KVM_VCPUEVENT_VALID_SIPI_VECTOR;
    fd.set_vcpu_events(&events)
        .map_err(kvm_err("KVM_SET_VCPU_EVENTS"))
}

/// The MSRs to save: KVM's list plus [`EXTRA_MSRS`], each once.
fn msr_indices(kvm: &Kvm) -> Result<Vec<u32>, PersistError> {
    let list = kvm
        .get_msr_index_list()
        .map_err(kvm_err("KVM_GET_MSR_INDEX_LIST"))?;
    let mut indices = list.as_slice().to_vec();
    for extra in EXTRA_MSRS {
        if !indices.contains(&extra) {
            indices.push(extra);
        }
    }
    Ok(indices)
}

/// Reads `indices` in batches, dropping each MSR KVM refuses.
fn get_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, PersistError> {
    let mut saved = Vec::with_capacity(indices.len());
    let mut refused = Vec::new();
    let mut rest = indices;
    while !rest.is_empty() {
        let batch = &rest[..rest.len().min(MSR_BATCH)];
        let entries: Vec<kvm_msr_entry> = batch
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|e| PersistError::InvalidState {
            what: "MSR batch",
            detail: format!("{e:?}"),
        })?;
        let read = fd.get_msrs(&mut msrs).map_err(kvm_err("KVM_GET_MSRS"))?;
        let read = read.min(batch.len());
        saved.extend_from_slice(&msrs.as_slice()[..read]);
        if read < batch.len() {
            refused.push(batch[read]);
            rest = &rest[read + 1..];
        } else {
            rest = &rest[read..];
        }
    }
    if !refused.is_empty() {
        tracing::debug!("KVM_GET_MSRS refused {} MSRs: {refused:x?}", refused.len());
    }
    Ok(saved)
}

/// Writes `entries` in batches. KVM_SET_MSRS stops at an MSR it refuses; one that already
/// holds the saved value is skipped (KVM reads some MSRs it will not write in every
/// configuration, such as `MSR_KVM_ASYNC_PF_INT` without an in-kernel LAPIC), any other is
/// an error naming it.
fn set_msrs(fd: &VcpuFd, entries: &[kvm_msr_entry]) -> Result<(), PersistError> {
    let mut rest = entries;
    while !rest.is_empty() {
        let batch = &rest[..rest.len().min(MSR_BATCH)];
        let msrs = Msrs::from_entries(batch).map_err(|e| PersistError::InvalidState {
            what: "MSR batch",
            detail: format!("{e:?}"),
        })?;
        let written = fd.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
        let Some(refused) = batch.get(written) else {
            rest = &rest[batch.len()..];
            continue;
        };
        if get_msrs(fd, &[refused.index])?.first().map(|m| m.data) != Some(refused.data) {
            return Err(PersistError::MsrRejected {
                index: refused.index,
                value: refused.data,
            });
        }
        rest = &rest[written + 1..];
    }
    Ok(())
}

/// The CPUID table set on the vCPU. KVM_GET_CPUID2 may leave zeroed entries after the real
/// ones; they are dropped.
fn get_cpuid(fd: &VcpuFd) -> Result<Vec<kvm_cpuid_entry2>, PersistError> {
    let cpuid = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_CPUID2"))?;
    Ok(cpuid
        .as_slice()
        .iter()
        .filter(|e| **e != kvm_cpuid_entry2::default())
        .copied()
        .collect())
}

/// The size in bytes of the XSAVE area this host's KVM reads and writes: what
/// `KVM_CAP_XSAVE2` says, at least the classic 4 KiB.
fn xsave_bytes(kvm: &Kvm) -> usize {
    let xsave2 = usize::try_from(kvm.check_extension_int(Cap::Xsave2)).unwrap_or(0);
    xsave2.max(XSAVE_WORDS * 4)
}

fn get_xsave(fd: &VcpuFd, kvm: &Kvm) -> Result<Vec<u32>, PersistError> {
    if kvm.check_extension_int(Cap::Xsave2) <= 0 {
        let xsave = fd.get_xsave().map_err(kvm_err("KVM_GET_XSAVE"))?;
        return Ok(xsave.region.to_vec());
    }
    let extra = (xsave_bytes(kvm) - XSAVE_WORDS * 4).div_ceil(4);
    let mut xsave = Xsave::new(extra).map_err(|e| PersistError::InvalidState {
        what: "XSAVE area",
        detail: format!("{extra} extra words: {e:?}"),
    })?;
    // SAFETY: `xsave` holds the size KVM_CAP_XSAVE2 reports, which is what
    // KVM_GET_XSAVE2 writes; densevm enables no XSTATE features at run time.
    unsafe { fd.get_xsave2(&mut xsave) }.map_err(kvm_err("KVM_GET_XSAVE2"))?;
    let mut words = xsave.as_fam_struct_ref().xsave.region.to_vec();
    words.extend_from_slice(xsave.as_slice());
    Ok(words)
}

fn set_xsave(fd: &VcpuFd, kvm: &Kvm, words: &[u32]) -> Result<(), PersistError> {
    if words.len() < XSAVE_WORDS {
        return Err(PersistError::InvalidState {
            what: "XSAVE area",
            detail: format!("{} bytes, fewer than {}", words.len() * 4, XSAVE_WORDS * 4),
        });
    }
    // KVM_SET_XSAVE reads as many bytes as this host's XSAVE area has, which can be more
    // than the saved area (a snapshot from KVM_GET_XSAVE); the rest stays zero, which the
    // XSAVE header marks as components in their initial state.
    let bytes = xsave_bytes(kvm).max(words.len() * 4);
    let extra = (bytes - XSAVE_WORDS * 4).div_ceil(4);
    let mut xsave = Xsave::new(extra).map_err(|e| PersistError::InvalidState {
        what: "XSAVE area",
        detail: format!("{extra} extra words: {e:?}"),
    })?;
    // SAFETY: only the fixed-size region is written; the FAM length stays as allocated.
    unsafe { xsave.as_mut_fam_struct() }
        .xsave
        .region
        .copy_from_slice(&words[..XSAVE_WORDS]);
    xsave.as_mut_slice()[..words.len() - XSAVE_WORDS].copy_from_slice(&words[XSAVE_WORDS..]);
    // SAFETY: `xsave` is at least as large as the XSAVE area this host's KVM reads
    // (KVM_CAP_XSAVE2, or 4 KiB without it).
    unsafe { fd.set_xsave2(&xsave) }.map_err(kvm_err("KVM_SET_XSAVE"))
}

/// Gives the vCPU the saved TSC frequency when it differs from this host's.
fn set_tsc_khz(fd: &VcpuFd, kvm: &Kvm, saved: Option<u32>) -> Result<(), PersistError> {
    let Some(saved) = saved else {
        return Ok(());
    };
    let host = fd.get_tsc_khz().ok();
    if let Some(host) = host {
        let diff = u64::from(saved.abs_diff(host));
        if diff * 1_000_000 <= u64::from(saved) * TSC_TOLERANCE_PPM {
            return Ok(());
        }
    }
    if !kvm.check_extension(Cap::TscControl) {
        return match host {
            Some(host_khz) => Err(PersistError::TscFrequency {
                saved_khz: saved,
                host_khz,
            }),
            // Neither the frequency nor a way to set it: keep the host's.
            None => Ok(()),
        };
    }
    fd.set_tsc_khz(saved).map_err(kvm_err("KVM_SET_TSC_KHZ"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_survives_json() {
        let mut state = VcpuState {
            cpuid: vec![kvm_cpuid_entry2 {
                function: 0x4000_0000,
                eax: 0x4000_0001,
                ebx: 0x4b4d_564b,
                ..Default::default()
            }],
            mp_state: kvm_mp_state { mp_state: 3 },
            regs: kvm_regs {
                rax: 0x1111,
                r15: 0xffff_ffff_ffff_ffff,
                rip: 0xffff_ffff_8100_0000,
                rflags: 0x246,
                ..Default::default()
            },
            sregs: kvm_sregs::default(),
            xsave: (0..XSAVE_WORDS as u32 + 3).collect(),
            xcrs: Some(kvm_xcrs {
                nr_xcrs: 1,
                ..Default::default()
            }),
            debugregs: kvm_debugregs::default(),
            lapic: Some(kvm_lapic_state { regs: [7; 1024] }),
            msrs: vec![kvm_msr_entry {
                index: MSR_STAR,
                data: 0x0023_0010_0000_0000,
                ..Default::default()
            }],
            vcpu_events: kvm_vcpu_events::default(),
            tsc_khz: Some(2_999_999),
        };
        state.sregs.cr0 = 0x8005_0033;
        state.sregs.efer = 0xd01;
        let json = serde_json::to_vec(&state).unwrap();
        let back: VcpuState = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, state);
        assert_eq!(back.msr(MSR_STAR), Some(0x0023_0010_0000_0000));
        assert_eq!(back.msr(MSR_IA32_TSC), None);
    }
}
