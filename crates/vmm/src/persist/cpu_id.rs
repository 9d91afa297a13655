//! The host CPU a snapshot was taken on.
//!
//! A vCPU's state holds the CPUID, MSRs and XSAVE layout of the CPU it ran on; restoring
//! it on another CPU model would give the guest features (or XSAVE components) the new host
//! lacks, or silently change ones it already probed. So a snapshot records [`HostCpu`] and
//! [`check_same_cpu`] refuses to restore it elsewhere. The stepping counts too: CPUs of one
//! family and model can differ in features by stepping (Skylake-SP and Cascade Lake are
//! both family 6 model 0x55).

use super::PersistError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What identifies the host CPU model, from the host's own CPUID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCpu {
    /// CPUID.0 vendor string ("GenuineIntel", "AuthenticAMD", ...).
    pub vendor: String,
    /// Display family (base family plus extended family when the base is 0xf).
    pub family: u32,
    /// Display model (extended model included for families 6 and 0xf).
    pub model: u32,
    /// Stepping.
    pub stepping: u32,
    /// The XCR0 bits the CPU supports (CPUID.(EAX=0xD,ECX=0):EDX:EAX); 0 without XSAVE.
    pub xsave_mask: u64,
}

impl fmt::Display for HostCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} family {:#x} model {:#x} stepping {} (XCR0 mask {:#x})",
            self.vendor, self.family, self.model, self.stepping, self.xsave_mask
        )
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)] // `__cpuid_count` is safe from Rust 1.87 on, unsafe before.
fn cpuid(leaf: u32, subleaf: u32) -> core::arch::x86_64::CpuidResult {
    // SAFETY: CPUID has no memory effects and exists on every x86_64 CPU; leaves above the
    // maximum return data of the highest leaf rather than faulting.
    unsafe { core::arch::x86_64::__cpuid_count(leaf, subleaf) }
}

impl HostCpu {
    /// The CPU this process runs on.
    #[cfg(target_arch = "x86_64")]
    pub fn current() -> Self {
        let leaf0 = cpuid(0, 0);
        let mut vendor = Vec::with_capacity(12);
        for reg in [leaf0.ebx, leaf0.edx, leaf0.ecx] {
            vendor.extend_from_slice(&reg.to_le_bytes());
        }
        let vendor = String::from_utf8_lossy(&vendor)
            .trim_end_matches('\0')
            .to_string();
        let leaf1 = cpuid(1, 0);
        let (family, model, stepping) = decode_signature(leaf1.eax);
        const XSAVE: u32 = 1 << 26;
        let xsave_mask = if leaf0.eax >= 0xd && leaf1.ecx & XSAVE != 0 {
            let leafd = cpuid(0xd, 0);
            u64::from(leafd.eax) | (u64::from(leafd.edx) << 32)
        } else {
            0
        };
        Self {
            vendor,
            family,
            model,
            stepping,
            xsave_mask,
        }
    }
}

/// Family, model and stepping from CPUID.1:EAX, as Intel's and AMD's manuals compute the
/// displayed values.
fn decode_signature(eax: u32) -> (u32, u32, u32) {
    let stepping = eax & 0xf;
    let base_model = (eax >> 4) & 0xf;
    let base_family = (eax >> 8) & 0xf;
    let ext_model = (eax >> 16) & 0xf;
    let ext_family = (eax >> 20) & 0xff;
    let family = if base_family == 0xf {
        base_family + ext_family
    } else {
        base_family
    };
    let model = if base_family == 0x6 || base_family == 0xf {
        (ext_model << 4) | base_model
    } else {
        base_model
    };
    (family, model, stepping)
}

/// Refuses a snapshot taken on another CPU model than this host's.
pub fn check_same_cpu(saved: &HostCpu) -> Result<(), PersistError> {
    compare(saved, &HostCpu::current())
}

fn compare(saved: &HostCpu, host: &HostCpu) -> Result<(), PersistError> {
    if saved == host {
        Ok(())
    } else {
        Err(PersistError::CpuMismatch {
            saved: saved.clone(),
            host: host.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_decode_as_the_manuals_say() {
        // Intel Cascade Lake: family 6, model 0x55, stepping 7.
        assert_eq!(decode_signature(0x0005_0657), (6, 0x55, 7));
        // AMD Zen 3 (EPYC Milan): family 0x19, model 0x01, stepping 1.
        assert_eq!(decode_signature(0x00a0_0f11), (0x19, 0x01, 1));
        // A family-5 CPU ignores the extended model.
        assert_eq!(decode_signature(0x0001_0543), (5, 4, 3));
    }

    #[test]
    fn this_host_reads_its_own_cpu() {
        let host = HostCpu::current();
        assert!(!host.vendor.is_empty(), "{host}");
        assert!(host.family > 0, "{host}");
        // XSAVE CPUs always support x87 and SSE state in XCR0.
        if host.xsave_mask != 0 {
            assert_eq!(host.xsave_mask & 0b11, 0b11, "{host}");
        }
    }

    #[test]
    fn the_same_cpu_passes_and_another_model_or_vendor_fails_naming_both() {
        let host = HostCpu::current();
        check_same_cpu(&host).expect("a snapshot from this very CPU must pass");

        let mut other_model = host.clone();
        other_model.model ^= 0x10;
        let err = check_same_cpu(&other_model).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, PersistError::CpuMismatch { .. }), "{msg}");
        assert!(
            msg.starts_with(&format!(
                "snapshot taken on {other_model}, this host is {host}"
            )),
            "{msg}"
        );
        assert!(msg.ends_with("restore it on the same CPU model"), "{msg}");

        let mut other_vendor = host.clone();
        other_vendor.vendor = if host.vendor == "GenuineIntel" {
            "AuthenticAMD".into()
        } else {
            "GenuineIntel".into()
        };
        let msg = check_same_cpu(&other_vendor).unwrap_err().to_string();
        assert!(msg.contains(&other_vendor.vendor), "{msg}");
        assert!(msg.contains(&host.vendor), "{msg}");

        let mut other_xcr0 = host.clone();
        other_xcr0.xsave_mask ^= 1 << 9; // PKRU
        assert!(check_same_cpu(&other_xcr0).is_err());
        let mut other_stepping = host;
        other_stepping.stepping ^= 1;
        assert!(check_same_cpu(&other_stepping).is_err());
    }
}
