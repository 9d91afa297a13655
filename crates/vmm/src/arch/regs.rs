//! Register state for the entry modes densevm starts guests in.

use super::gdt::{self, kvm_segment_from_gdt, BOOT_GDT, BOOT_GDT_ADDR};
use super::paging::PML4_ADDR;
use kvm_bindings::{kvm_regs, kvm_sregs};

const X86_CR0_PE: u64 = 1 << 0;
const X86_CR0_MP: u64 = 1 << 1;
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_NE: u64 = 1 << 5;
const X86_CR0_WP: u64 = 1 << 16;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

fn load_gdt_segments(sregs: &mut kvm_sregs) {
    let data = kvm_segment_from_gdt(BOOT_GDT[2], gdt::DATA_SELECTOR);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment_from_gdt(BOOT_GDT[3], gdt::TSS_SELECTOR);
    sregs.gdt.base = BOOT_GDT_ADDR;
    sregs.gdt.limit = (std::mem::size_of_val(&BOOT_GDT) - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
}

/// 64-bit long mode with paging on, using the boot GDT and identity page tables.
pub fn long_mode_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    load_gdt_segments(&mut sregs);
    sregs.cs = kvm_segment_from_gdt(BOOT_GDT[1], gdt::CODE64_SELECTOR);
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 = X86_CR0_PE | X86_CR0_MP | X86_CR0_ET | X86_CR0_NE | X86_CR0_WP | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// 32-bit flat protected mode, paging off (the PVH boot ABI).
pub fn protected_mode_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    load_gdt_segments(&mut sregs);
    sregs.cs = kvm_segment_from_gdt(BOOT_GDT[4], gdt::CODE32_SELECTOR);
    sregs.cr0 = X86_CR0_PE | X86_CR0_ET;
    sregs.cr4 = 0;
    sregs.efer = 0;
    sregs
}

/// General registers: entry point, stack and the first two argument registers.
pub fn entry_regs(rip: u64, rsp: u64, rdi: u64, rsi: u64) -> kvm_regs {
    kvm_regs {
        rip,
        rsp,
        rbp: rsp,
        rdi,
        rsi,
        rflags: 0x2,
        ..Default::default()
    }
}
