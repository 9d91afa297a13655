//! Save → restore → save on /dev/kvm: a vCPU and a VM given recognizable state are saved
//! (through a state file), restored into a second VM built the same way, and saved again;
//! the two saves must agree field by field, except where the value legitimately moves.
//! These tests need /dev/kvm and fail (never skip) without it.

use super::*;
use crate::arch::cpuid::{vcpu_cpuid, CpuidOptions};
use crate::arch::regs::long_mode_sregs;
use crate::persist::vcpu::{
    MSR_IA32_TSC, MSR_IA32_TSC_AUX, MSR_IA32_TSC_DEADLINE, MSR_KERNEL_GS_BASE, MSR_STAR,
};
use crate::vstate::vm::Vm;
use kvm_bindings::{
    kvm_msr_entry, kvm_regs, Msrs, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_HALTED,
    KVM_VCPUEVENT_VALID_NMI_PENDING,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const APIC_TPR: usize = 0x80;
const APIC_LVTT: usize = 0x320;
const APIC_TMICT: usize = 0x380;
const APIC_TMCCT: usize = 0x390;
const APIC_TDCR: usize = 0x3e0;
/// CPUID.1:ECX TSC-deadline timer.
const CPUID_TSC_DEADLINE: u32 = 1 << 24;

/// A VM with the in-kernel irqchip and PIT, as `builder.rs` makes for Linux guests.
fn new_vm() -> Vm {
    assert!(
        Path::new("/dev/kvm").exists(),
        "/dev/kvm is missing: the snapshot tests need KVM and do not skip without it"
    );
    let mut vm = Vm::new().unwrap_or_else(|e| panic!("creating a VM: {e}"));
    vm.create_irqchip()
        .unwrap_or_else(|e| panic!("creating the irqchip and PIT: {e}"));
    vm
}

/// vCPU 0 of `vm` with the CPUID `builder.rs` gives it, plus the TSC-deadline timer (so
/// the LAPIC can be put in TSC-deadline mode).
fn new_vcpu(vm: &Vm) -> VcpuFd {
    let fd = vm.fd().create_vcpu(0).expect("KVM_CREATE_VCPU");
    let supported = vm
        .kvm()
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .expect("KVM_GET_SUPPORTED_CPUID");
    let mut cpuid = vcpu_cpuid(supported, 0, 1, CpuidOptions::default());
    for entry in cpuid.as_mut_slice() {
        if entry.function == 1 {
            entry.ecx |= CPUID_TSC_DEADLINE;
        }
    }
    fd.set_cpuid2(&cpuid).expect("KVM_SET_CPUID2");
    fd
}

fn set_lapic_reg(regs: &mut [std::os::raw::c_char; 1024], offset: usize, value: u32) {
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        regs[offset + i] = *b as _;
    }
}

fn lapic_reg(regs: &[std::os::raw::c_char; 1024], offset: usize) -> u32 {
    u32::from_le_bytes(std::array::from_fn(|i| regs[offset + i] as u8))
}

fn set_msr(fd: &VcpuFd, index: u32, data: u64) {
    let msrs = Msrs::from_entries(&[kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(
        fd.set_msrs(&msrs).expect("KVM_SET_MSRS"),
        1,
        "MSR {index:#x}"
    );
}

/// A state file path of its own for one test; the file is removed when this is dropped.
struct StatePath(PathBuf);

impl StatePath {
    fn new(test: &str) -> Self {
        let name = format!("densevm-persist-{}-{test}.state", std::process::id());
        Self(std::env::temp_dir().join(name))
    }
}

impl Drop for StatePath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Gives vCPU `fd` state a fresh vCPU never has.
fn make_recognizable(fd: &VcpuFd, xcr0: u64) -> u64 {
    let mut regs = kvm_regs {
        rip: 0xffff_ffff_8123_4567,
        // CF, reserved bit 1, PF, ZF, IF, OF.
        rflags: 0xa47,
        ..Default::default()
    };
    let gprs = [
        &mut regs.rax,
        &mut regs.rbx,
        &mut regs.rcx,
        &mut regs.rdx,
        &mut regs.rsi,
        &mut regs.rdi,
        &mut regs.rsp,
        &mut regs.rbp,
        &mut regs.r8,
        &mut regs.r9,
        &mut regs.r10,
        &mut regs.r11,
        &mut regs.r12,
        &mut regs.r13,
        &mut regs.r14,
        &mut regs.r15,
    ];
    for (i, reg) in gprs.into_iter().enumerate() {
        *reg = 0x0101_0101_0101_0101 * (i as u64 + 1);
    }
    fd.set_regs(&regs).expect("KVM_SET_REGS");

    let mut sregs = long_mode_sregs(fd.get_sregs().expect("KVM_GET_SREGS"));
    sregs.cr3 = 0x0012_3000;
    sregs.idt.base = 0x5000;
    sregs.idt.limit = 0xfff;
    fd.set_sregs(&sregs).expect("KVM_SET_SREGS");

    let mut xcrs = fd.get_xcrs().expect("KVM_GET_XCRS");
    xcrs.xcrs[0].value = xcr0;
    fd.set_xcrs(&xcrs).expect("KVM_SET_XCRS");

    let mut debugregs = fd.get_debug_regs().expect("KVM_GET_DEBUGREGS");
    debugregs.db = [0x1000, 0x2000, 0x3000, 0x4000];
    debugregs.dr7 = 0x455; // L0, L1, L2 enabled, bit 10 reserved-one.
    fd.set_debug_regs(&debugregs).expect("KVM_SET_DEBUGREGS");

    // LAPIC: a task priority, and the timer in TSC-deadline mode (masked, vector 0xec).
    let mut lapic = fd.get_lapic().expect("KVM_GET_LAPIC");
    set_lapic_reg(&mut lapic.regs, APIC_TPR, 0x20);
    set_lapic_reg(&mut lapic.regs, APIC_LVTT, (0b10 << 17) | (1 << 16) | 0xec);
    set_lapic_reg(&mut lapic.regs, APIC_TDCR, 0x3);
    fd.set_lapic(&lapic).expect("KVM_SET_LAPIC");

    set_msr(fd, MSR_KERNEL_GS_BASE, 0xffff_8880_1234_5678);
    set_msr(fd, MSR_STAR, 0x0023_0010_0000_0000);
    set_msr(fd, MSR_IA32_TSC_AUX, 0x2a);
    // A deadline far in the future: restored only if the LAPIC is restored first.
    let deadline = 0x00ff_0000_0000_0000;
    set_msr(fd, MSR_IA32_TSC_DEADLINE, deadline);

    let mut mp_state = fd.get_mp_state().expect("KVM_GET_MP_STATE");
    mp_state.mp_state = KVM_MP_STATE_HALTED;
    fd.set_mp_state(mp_state).expect("KVM_SET_MP_STATE");

    // A pending, masked NMI.
    let mut events = fd.get_vcpu_events().expect("KVM_GET_VCPU_EVENTS");
    events.nmi.pending = 1;
    events.nmi.masked = 1;
    events.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING;
    fd.set_vcpu_events(&events).expect("KVM_SET_VCPU_EVENTS");
    deadline
}

#[derive(Serialize, Deserialize)]
struct Saved {
    vm: VmState,
    vcpu: VcpuState,
}

#[test]
fn a_vcpu_restores_field_by_field() {
    let vm1 = new_vm();
    let fd1 = new_vcpu(&vm1);
    let host = HostCpu::current();
    // x87 | SSE, plus AVX where the host has it.
    let xcr0 = 0b11 | (host.xsave_mask & 0b100);
    let deadline = make_recognizable(&fd1, xcr0);
    let mut saved = save_vcpu(&fd1, vm1.kvm()).expect("save_vcpu");
    // XMM0 (bytes 160..176 of the XSAVE area) set in the saved state, and the SSE bit of
    // XSTATE_BV (byte 512) so that it is not taken as in its initial state: the restore
    // must carry it into the new vCPU.
    saved.xsave[40..44].copy_from_slice(&[0xdead_beef, 0x0123_4567, 0x89ab_cdef, 0x5555_aaaa]);
    saved.xsave[128] |= 0b10;

    // Through the state file, as a real snapshot goes.
    let path = StatePath::new("vcpu");
    let vm_state = save_vm(vm1.fd(), true).expect("save_vm");
    write_state(
        &path.0,
        &Saved {
            vm: vm_state,
            vcpu: saved.clone(),
        },
    )
    .expect("write_state");
    let back: Saved = read_state(&path.0).expect("read_state");
    assert_eq!(back.vcpu, saved);

    // Sanity: what was set is what was saved.
    assert_eq!(saved.regs.rip, 0xffff_ffff_8123_4567);
    assert_eq!(saved.regs.rflags, 0xa47);
    assert_eq!(saved.regs.r15, 0x1010_1010_1010_1010);
    assert_eq!(saved.sregs.cr3, 0x0012_3000);
    assert_eq!(saved.msr(MSR_KERNEL_GS_BASE), Some(0xffff_8880_1234_5678));
    assert_eq!(saved.msr(MSR_STAR), Some(0x0023_0010_0000_0000));
    assert_eq!(saved.msr(MSR_IA32_TSC_AUX), Some(0x2a));
    assert_eq!(saved.msr(MSR_IA32_TSC_DEADLINE), Some(deadline));
    assert_eq!(saved.mp_state.mp_state, KVM_MP_STATE_HALTED);
    assert_eq!(saved.vcpu_events.nmi.pending, 1);
    let lapic1 = saved
        .lapic
        .as_ref()
        .expect("a LAPIC with the in-kernel irqchip");
    assert_eq!(lapic_reg(&lapic1.regs, APIC_TPR), 0x20);
    assert_eq!(saved.xcrs.expect("XCRs").xcrs[0].value, xcr0);

    let vm2 = new_vm();
    let fd2 = new_vcpu(&vm2);
    restore_vm(vm2.fd(), &back.vm).expect("restore_vm");
    restore_vcpu(&fd2, vm2.kvm(), &back.vcpu).expect("restore_vcpu");
    let again = save_vcpu(&fd2, vm2.kvm()).expect("save_vcpu after restore");

    assert_eq!(again.cpuid, saved.cpuid, "CPUID");
    assert_eq!(again.mp_state, saved.mp_state, "MP state");
    assert_eq!(again.regs, saved.regs, "regs");
    assert_eq!(again.sregs, saved.sregs, "sregs");
    assert_eq!(again.xsave, saved.xsave, "XSAVE area");
    assert_eq!(again.xcrs, saved.xcrs, "XCRs");
    assert_eq!(again.debugregs, saved.debugregs, "debug registers");
    assert_eq!(again.vcpu_events, saved.vcpu_events, "vCPU events");
    assert_eq!(again.tsc_khz, saved.tsc_khz, "TSC frequency");
    // The LAPIC's current-count register is computed from the time at each read.
    let lapic2 = again.lapic.as_ref().expect("LAPIC after restore");
    for offset in (0..1024).step_by(16) {
        if offset == APIC_TMCCT {
            continue;
        }
        assert_eq!(
            lapic_reg(&lapic2.regs, offset),
            lapic_reg(&lapic1.regs, offset),
            "LAPIC register {offset:#x}"
        );
    }
    assert_eq!(lapic_reg(&lapic2.regs, APIC_TMICT), 0);
    // The same MSRs in the same order, with the same values, except the TSC, which
    // counts on: restored to the saved value, it has only advanced since (a fresh vCPU's
    // TSC would be behind it, its VM being younger).
    let indices = |s: &VcpuState| s.msrs.iter().map(|m| m.index).collect::<Vec<_>>();
    assert_eq!(indices(&again), indices(&saved), "MSR list");
    for (a, b) in again.msrs.iter().zip(&saved.msrs) {
        if a.index == MSR_IA32_TSC {
            continue;
        }
        assert_eq!(a.data, b.data, "MSR {:#x}", a.index);
    }
    let (tsc1, tsc2) = (saved.msr(MSR_IA32_TSC), again.msr(MSR_IA32_TSC));
    let (tsc1, tsc2) = (tsc1.expect("IA32_TSC saved"), tsc2.unwrap());
    let khz = u64::from(saved.tsc_khz.unwrap_or(4_000_000));
    assert!(
        tsc2 >= tsc1 && tsc2 - tsc1 < 60 * khz * 1000,
        "TSC {tsc1:#x} then {tsc2:#x}"
    );
}

#[test]
fn a_vm_restores_irqchip_pit_and_clock() {
    let vm1 = new_vm();
    let fd = vm1.fd();
    let mut chip = kvm_bindings::kvm_irqchip {
        chip_id: KVM_IRQCHIP_PIC_MASTER,
        ..Default::default()
    };
    fd.get_irqchip(&mut chip).expect("KVM_GET_IRQCHIP");
    // Writing a union member is safe; KVM filled the PIC member.
    chip.chip.pic.imr = 0xfa;
    chip.chip.pic.irq_base = 0x20;
    fd.set_irqchip(&chip).expect("KVM_SET_IRQCHIP master");
    chip.chip_id = KVM_IRQCHIP_PIC_SLAVE;
    fd.get_irqchip(&mut chip).expect("KVM_GET_IRQCHIP");
    chip.chip.pic.imr = 0xbf;
    chip.chip.pic.irq_base = 0x28;
    fd.set_irqchip(&chip).expect("KVM_SET_IRQCHIP slave");
    chip.chip_id = KVM_IRQCHIP_IOAPIC;
    fd.get_irqchip(&mut chip).expect("KVM_GET_IRQCHIP");
    for pin in 0..24 {
        // Masked, level-triggered for odd pins, vector 0x30 + pin, destination pin % 4.
        let bits =
            (1 << 16) | ((pin as u64 & 1) << 15) | (0x30 + pin as u64) | ((pin as u64 % 4) << 56);
        // SAFETY: the IOAPIC member; each entry is a union with a u64.
        unsafe { chip.chip.ioapic.redirtbl[pin].bits = bits };
    }
    fd.set_irqchip(&chip).expect("KVM_SET_IRQCHIP ioapic");
    let mut pit = fd.get_pit2().expect("KVM_GET_PIT2");
    pit.channels[0].count = 0x1234;
    pit.channels[0].mode = 2;
    pit.channels[0].rw_mode = 3;
    pit.channels[2].count = 0x0456;
    pit.channels[2].mode = 3;
    fd.set_pit2(&pit).expect("KVM_SET_PIT2");
    // 1000 s of guest time, far ahead of the fresh VM the state goes into.
    let clock = kvm_bindings::kvm_clock_data {
        clock: 1_000_000_000_000,
        ..Default::default()
    };
    fd.set_clock(&clock).expect("KVM_SET_CLOCK");

    let saved = save_vm(fd, true).expect("save_vm");
    let path = StatePath::new("vm");
    write_state(&path.0, &saved).expect("write_state");
    let back: VmState = read_state(&path.0).expect("read_state");

    let vm2 = new_vm();
    let fresh = save_vm(vm2.fd(), true).unwrap();
    assert!(fresh.clock.clock < saved.clock.clock);
    restore_vm(vm2.fd(), &back).expect("restore_vm");
    let again = save_vm(vm2.fd(), true).expect("save_vm after restore");

    let (c1, c2) = (
        saved.irqchip.as_ref().unwrap(),
        again.irqchip.as_ref().unwrap(),
    );
    assert_eq!(c1.pic_master_state().imr, 0xfa);
    assert_eq!(c2.pic_master_state(), c1.pic_master_state(), "master PIC");
    assert_eq!(c2.pic_slave_state(), c1.pic_slave_state(), "slave PIC");
    assert_eq!(
        c1.ioapic_redirection()[5],
        (1 << 16) | (1 << 15) | 0x35 | (1 << 56)
    );
    assert_eq!(
        c2.ioapic_redirection(),
        c1.ioapic_redirection(),
        "IOAPIC pins"
    );
    let (i1, i2) = (c1.ioapic_state(), c2.ioapic_state());
    assert_eq!(
        (i2.base_address, i2.id, i2.irr, i2.ioregsel),
        (i1.base_address, i1.id, i1.irr, i1.ioregsel),
        "IOAPIC registers"
    );
    // A PIT channel's load time is when the restore reloaded its count.
    assert_eq!(c1.pit.channels[0].count, 0x1234);
    assert_eq!(c2.pit.flags, c1.pit.flags, "PIT flags");
    for (i, (a, b)) in c2.pit.channels.iter().zip(&c1.pit.channels).enumerate() {
        let mut a = *a;
        a.count_load_time = b.count_load_time;
        assert_eq!(a, *b, "PIT channel {i}");
    }
    // The clock continues from the saved value (plus the test's own run time).
    let (t1, t2) = (saved.clock.clock, again.clock.clock);
    assert!(
        t2 >= t1 && t2 - t1 < 10_000_000_000,
        "guest clock {t1} ns saved, {t2} ns after restore"
    );
}

#[test]
fn a_vm_without_irqchip_round_trips_and_refuses_chip_or_lapic_state() {
    assert!(
        Path::new("/dev/kvm").exists(),
        "/dev/kvm is missing: the snapshot tests need KVM and do not skip without it"
    );
    let plain = Vm::new().expect("creating a VM");
    let saved = save_vm(plain.fd(), false).expect("save_vm without irqchip");
    assert!(saved.irqchip.is_none());
    restore_vm(plain.fd(), &saved).expect("restore_vm without irqchip");

    // A vCPU without an in-kernel LAPIC saves no LAPIC and restores.
    let fd = plain.fd().create_vcpu(0).expect("KVM_CREATE_VCPU");
    let state = save_vcpu(&fd, plain.kvm()).expect("save_vcpu without irqchip");
    assert!(state.lapic.is_none());
    let other = Vm::new().unwrap();
    let fd2 = other.fd().create_vcpu(0).unwrap();
    restore_vcpu(&fd2, other.kvm(), &state).expect("restore_vcpu without irqchip");

    // A chip state cannot go into a VM without the chips, nor a LAPIC into a vCPU
    // without one.
    let chip_vm = new_vm();
    let with_chip = save_vm(chip_vm.fd(), true).unwrap();
    let err = restore_vm(other.fd(), &with_chip).unwrap_err();
    assert!(matches!(err, PersistError::NoIrqchip), "{err}");
    assert!(err.to_string().contains("create them"), "{err}");
    let with_lapic = save_vcpu(&new_vcpu(&chip_vm), chip_vm.kvm()).unwrap();
    let third = Vm::new().unwrap();
    let err = restore_vcpu(
        &third.fd().create_vcpu(0).unwrap(),
        third.kvm(),
        &with_lapic,
    )
    .unwrap_err();
    assert!(matches!(err, PersistError::NoIrqchip), "{err}");
}
