//! The CPUID table given to each vCPU: what KVM supports, with per-vCPU topology fixed up.

use kvm_bindings::CpuId;

/// Adjusts KVM's supported CPUID for vCPU `index` of `count`.
pub fn vcpu_cpuid(mut cpuid: CpuId, index: u8, count: u8) -> CpuId {
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                // Initial APIC ID, logical processor count, and the hypervisor bit.
                entry.ebx =
                    (entry.ebx & 0x0000_ffff) | (u32::from(index) << 24) | (u32::from(count) << 16);
                entry.ecx |= 1 << 31;
                if count > 1 {
                    entry.edx |= 1 << 28; // HTT: multiple logical processors
                }
            }
            0xb | 0x1f => entry.edx = u32::from(index), // x2APIC ID
            _ => {}
        }
    }
    cpuid
}
