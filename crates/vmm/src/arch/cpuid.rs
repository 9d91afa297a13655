//! The CPUID table given to each vCPU: what KVM supports, with per-vCPU topology fixed up.

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;
use std::sync::mpsc::{sync_channel, Receiver};

/// KVM's paravirtual feature leaf (`KVM_CPUID_FEATURES`): EAX holds the feature bits.
const KVM_CPUID_FEATURES: u32 = 0x4000_0001;
/// Its async page fault bits: `KVM_FEATURE_ASYNC_PF`, `_ASYNC_PF_VMEXIT`, `_ASYNC_PF_INT`.
/// Linux guests enable async page faults only with `_ASYNC_PF_INT` (5.10 on); the others go
/// with it.
const ASYNC_PF_BITS: u32 = (1 << 4) | (1 << 10) | (1 << 14);

/// What the VM asks of every vCPU's CPUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuidOptions {
    /// Offer KVM's async page faults to the guest. Off for a VM under a memory budget: there
    /// a fault KVM cannot serve at once goes to userfaultfd, and async page faults turn each
    /// into a kernel worker's fault, a "not present" event, a guest reschedule and a "ready"
    /// interrupt; hidden, KVM still hands the fault to its worker but halts the vCPU
    /// meanwhile, with no event in the guest (docs/tiering.md, "KVM").
    pub async_pf: bool,
}

impl Default for CpuidOptions {
    fn default() -> Self {
        CpuidOptions { async_pf: true }
    }
}

/// KVM's supported CPUID (`KVM_GET_SUPPORTED_CPUID`), read ahead on another thread: the
/// call takes 0.4–0.7 ms on a host that is itself a VM (each host `cpuid` it runs exits to
/// the host's own hypervisor), as long as the rest of a probe VM's build before the vCPUs
/// are created.
pub struct SupportedCpuid(Receiver<Result<CpuId, kvm_ioctls::Error>>);

impl SupportedCpuid {
    /// The read to run on a thread (it opens `/dev/kvm` for itself), and the handle that
    /// takes its answer.
    pub fn read_ahead() -> (Box<dyn FnOnce() + Send>, Self) {
        let (tx, rx) = sync_channel(1);
        let read = Box::new(move || {
            let _ =
                tx.send(Kvm::new().and_then(|kvm| kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)));
        });
        (read, SupportedCpuid(rx))
    }

    /// The answer, waiting for it; read here, on `kvm`, if the thread never ran the read
    /// (it could not be started) or failed to open `/dev/kvm`.
    pub fn get(self, kvm: &Kvm) -> Result<CpuId, kvm_ioctls::Error> {
        match self.0.recv() {
            Ok(Ok(cpuid)) => Ok(cpuid),
            Ok(Err(_)) | Err(_) => kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES),
        }
    }
}

/// Adjusts KVM's supported CPUID for vCPU `index` of `count`.
pub fn vcpu_cpuid(mut cpuid: CpuId, index: u8, count: u8, options: CpuidOptions) -> CpuId {
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
            KVM_CPUID_FEATURES if !options.async_pf => entry.eax &= !ASYNC_PF_BITS,
            _ => {}
        }
    }
    cpuid
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    fn table() -> CpuId {
        let entry = |function, eax| kvm_cpuid_entry2 {
            function,
            eax,
            ..Default::default()
        };
        CpuId::from_entries(&[entry(1, 0), entry(KVM_CPUID_FEATURES, 0x0101_7fff)]).unwrap()
    }

    fn kvm_features(cpuid: &CpuId) -> u32 {
        let leaf = cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == KVM_CPUID_FEATURES);
        leaf.unwrap().eax
    }

    #[test]
    fn async_page_faults_are_hidden_only_when_asked() {
        let kept = vcpu_cpuid(table(), 0, 1, CpuidOptions::default());
        assert_eq!(kvm_features(&kept), 0x0101_7fff);
        let hidden = vcpu_cpuid(table(), 0, 1, CpuidOptions { async_pf: false });
        // Only the three async page fault bits go: kvmclock, steal time, PV EOI... stay.
        assert_eq!(kvm_features(&hidden), 0x0101_3bef);
    }

    /// Needs /dev/kvm: the answer read ahead on a thread, and the one read in place when
    /// the thread never ran, are KVM's own. (Compared as a vCPU gets them: KVM's answer
    /// carries the APIC ID of the host CPU the call ran on, which `vcpu_cpuid` replaces.)
    #[test]
    fn supported_cpuid_read_ahead_or_in_place() {
        let kvm = Kvm::new().expect("this test needs /dev/kvm");
        let as_vcpu = |c: CpuId| vcpu_cpuid(c, 0, 1, CpuidOptions::default());
        let direct = as_vcpu(kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap());
        let (read, ahead) = SupportedCpuid::read_ahead();
        std::thread::spawn(read).join().unwrap();
        assert_eq!(
            as_vcpu(ahead.get(&kvm).unwrap()).as_slice(),
            direct.as_slice()
        );
        let (read, never) = SupportedCpuid::read_ahead();
        drop(read);
        assert_eq!(
            as_vcpu(never.get(&kvm).unwrap()).as_slice(),
            direct.as_slice()
        );
    }
}
