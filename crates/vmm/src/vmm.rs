//! Building a VM from a [`VmConfig`] and running it to completion.

use crate::arch::cpuid::vcpu_cpuid;
use crate::boot::{linux, probe, EntryState};
use crate::memory::{Backing, GuestMemory, MemoryError, MergePolicy, RegionSpec};
use crate::report::{memory_report, MemoryReport};
use crate::trace::{mark_name, BootTrace};
use crate::vstate::kick;
use crate::vstate::readonly_slots::{RangesFn, ReadonlySlotStats, ReadonlySlots};
use crate::vstate::vcpu::{Vcpu, VcpuEvent, VcpuFailure, VcpuShared};
use crate::vstate::vm::{Vm, VmError};
use densevm_devices::legacy::{self, AcpiPm, Cmos, DebugPort, PciHostBridge, Serial, I8042};
use densevm_devices::{Bus, GuestRequest};
use densevm_probe::Command;
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::VcpuFd;
use std::io::Write;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

/// Guest RAM below the 32-bit MMIO hole; RAM beyond it continues at 4 GiB.
pub const LOW_RAM_END: u64 = 3 << 30;
/// Where RAM above the hole starts.
pub const HIGH_RAM_START: u64 = 4 << 30;

/// What the VM runs.
pub enum Payload {
    /// The built-in probe guest with a parsed script.
    Probe(Vec<Command>),
    /// A Linux kernel (PVH ELF vmlinux or bzImage), optional initrd, command line.
    Linux {
        /// Kernel image path.
        kernel: std::path::PathBuf,
        /// Initrd path.
        initrd: Option<std::path::PathBuf>,
        /// Kernel command line.
        cmdline: String,
    },
}

/// A guest-physical region whose host memory another component maps and serves
/// (a pcow pmem region): densevm places it above RAM and registers it with KVM.
#[derive(Clone)]
pub struct ExternalRegion {
    /// Name (`pmem0`, `pmem1`, ...), addressable by the probe script.
    pub name: String,
    /// Host virtual address of the live mapping (page aligned); must outlive the VM.
    pub host_addr: u64,
    /// Size in bytes (page aligned).
    pub size: u64,
    /// Ranges `(offset, len)` that KVM must map read-only (e.g. pmem clusters of snapshots
    /// and base images): guest writes there reach the VMM as MMIO writes, which the
    /// region's [`crate::write_fault`] handler serves.
    pub kvm_readonly: Vec<(u64, u64)>,
    /// Serves vCPU writes into the region that KVM cannot complete (offsets are relative to
    /// the region); registered at the region's guest-physical place for the VM's lifetime.
    pub write_fault: Option<crate::write_fault::Handler>,
    /// The ranges that are read-only *now* (`kvm_readonly` minus pages copied up since):
    /// when the write-fault handler reports stale exits, the VMM re-registers the region's
    /// slots from this (`vstate::readonly_slots`). `None` keeps the slots as registered.
    pub readonly_ranges: Option<RangesFn>,
}

/// Alignment of external regions in guest-physical space.
pub const EXTERNAL_REGION_ALIGN: u64 = 1 << 30;

/// Places external regions above RAM (and above 4 GiB), each 1 GiB aligned; returns
/// `(name, gpa, size)` for each.
pub fn place_external_regions(
    memory_bytes: u64,
    regions: &[ExternalRegion],
) -> Vec<(String, u64, u64)> {
    let ram_top = if memory_bytes > LOW_RAM_END {
        HIGH_RAM_START + memory_bytes - LOW_RAM_END
    } else {
        memory_bytes
    };
    let mut next = ram_top
        .max(HIGH_RAM_START)
        .next_multiple_of(EXTERNAL_REGION_ALIGN);
    regions
        .iter()
        .map(|r| {
            let gpa = next;
            next = (gpa + r.size).next_multiple_of(EXTERNAL_REGION_ALIGN);
            (r.name.clone(), gpa, r.size)
        })
        .collect()
}

/// Everything needed to build and run one VM.
pub struct VmConfig {
    /// Guest RAM in bytes.
    pub memory_bytes: u64,
    /// Number of vCPUs.
    pub cpus: u32,
    /// The guest.
    pub payload: Payload,
    /// Where serial output goes.
    pub console: Box<dyn Write + Send>,
    /// Stop the VM with an error after this long.
    pub timeout: Option<Duration>,
    /// When the VMM process started (the trace origin).
    pub origin: Instant,
    /// Take a memory report just before the VM is torn down.
    pub report_memory: bool,
    /// Regions mapped by other components (pmem), placed above RAM.
    pub external_regions: Vec<ExternalRegion>,
    /// Which guest regions the host's same-page merging (KSM) may fold together.
    pub merge: MergePolicy,
}

/// How a VM run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmEnd {
    /// The guest wrote this code to the debug-exit port.
    GuestExit(u8),
    /// The guest asked for a reset (i8042) or reboot.
    Reset,
    /// The guest powered off (KVM system event).
    PowerOff,
    /// Every vCPU halted with nothing left to wake it.
    AllHalted,
    /// A vCPU hit a fatal condition.
    Failed {
        /// The vCPU.
        vcpu: u32,
        /// What happened.
        failure: VcpuFailure,
    },
    /// The run exceeded its timeout.
    TimedOut(Duration),
    /// The VMM itself failed while the guest ran (e.g. re-registering memory slots).
    HostError(String),
}

impl VmEnd {
    /// The process exit code for this end: the guest's own code, 0 for a clean stop,
    /// 1 for a failure, 124 for a timeout (as timeout(1)).
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::GuestExit(code) => i32::from(*code),
            Self::Reset | Self::PowerOff | Self::AllHalted => 0,
            Self::Failed { .. } | Self::HostError(_) => 1,
            Self::TimedOut(_) => 124,
        }
    }

    /// Whether the VM ended in an error.
    pub fn is_error(&self) -> bool {
        matches!(
            self,
            Self::Failed { .. } | Self::TimedOut(_) | Self::HostError(_)
        )
    }
}

impl std::fmt::Display for VmEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::GuestExit(code) => write!(f, "guest exited with code {code}"),
            Self::Reset => write!(f, "guest requested a reset"),
            Self::PowerOff => write!(f, "guest powered off"),
            Self::AllHalted => write!(f, "all vCPUs halted"),
            Self::Failed { vcpu, failure } => write!(f, "vCPU {vcpu}: {failure}"),
            Self::TimedOut(d) => write!(
                f,
                "VM did not finish within {:.1} s (--timeout)",
                d.as_secs_f64()
            ),
            Self::HostError(e) => write!(f, "the VMM failed: {e}"),
        }
    }
}

/// The result of a run.
pub struct RunOutcome {
    /// How it ended.
    pub end: VmEnd,
    /// Trace points.
    pub trace: BootTrace,
    /// Memory report taken before teardown, if requested.
    pub memory: Option<MemoryReport>,
    /// How the read-only slots of external regions were kept up to date.
    pub readonly_slots: ReadonlySlotStats,
}

/// A VM could not be built or started.
#[derive(Debug, Error)]
pub enum VmmError {
    /// KVM refused something.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// Guest memory could not be set up.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The probe could not be loaded.
    #[error(transparent)]
    Probe(#[from] probe::ProbeLoadError),
    /// The Linux kernel or initrd could not be loaded.
    #[error(transparent)]
    Linux(#[from] linux::LinuxBootError),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A vCPU could not be created or configured.
    #[error("vCPU {index}: {what} failed: {source}")]
    Vcpu {
        /// vCPU index.
        index: u32,
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Host resource failure (eventfd, thread, signal).
    #[error("{what}: {source}")]
    Host {
        /// The operation.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

fn host_tsc_khz() -> u64 {
    // Calibrate the host TSC against the monotonic clock (fallback when KVM cannot say).
    #[cfg(target_arch = "x86_64")]
    {
        let t0 = Instant::now();
        // SAFETY: rdtsc has no memory effects and is available on every x86_64 CPU.
        let c0 = unsafe { core::arch::x86_64::_rdtsc() };
        std::thread::sleep(Duration::from_millis(10));
        // SAFETY: as above.
        let c1 = unsafe { core::arch::x86_64::_rdtsc() };
        let us = t0.elapsed().as_micros().max(1) as u64;
        (c1 - c0) * 1000 / us
    }
}

fn create_vcpu(vm: &Vm, index: u32, count: u32) -> Result<VcpuFd, VmmError> {
    let err = |what| {
        move |source| VmmError::Vcpu {
            index,
            what,
            source,
        }
    };
    let fd = vm
        .fd()
        .create_vcpu(u64::from(index))
        .map_err(err("KVM_CREATE_VCPU"))?;
    let cpuid = vm
        .kvm()
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(err("KVM_GET_SUPPORTED_CPUID"))?;
    fd.set_cpuid2(&vcpu_cpuid(cpuid, index as u8, count as u8))
        .map_err(err("KVM_SET_CPUID2"))?;
    Ok(fd)
}

fn set_entry_state(fd: &VcpuFd, index: u32, entry: &dyn EntryState) -> Result<(), VmmError> {
    let err = |what| {
        move |source| VmmError::Vcpu {
            index,
            what,
            source,
        }
    };
    let sregs = fd.get_sregs().map_err(err("KVM_GET_SREGS"))?;
    fd.set_sregs(&entry.sregs(index, sregs))
        .map_err(err("KVM_SET_SREGS"))?;
    fd.set_regs(&entry.regs(index))
        .map_err(err("KVM_SET_REGS"))?;
    Ok(())
}

/// Local APIC LINT0 as ExtINT (the PIC's output) and LINT1 as NMI, as firmware leaves them.
fn set_lapic_lints(fd: &VcpuFd) -> Result<(), kvm_ioctls::Error> {
    const APIC_LVT0: usize = 0x350;
    const APIC_LVT1: usize = 0x360;
    const APIC_MODE_EXTINT: u32 = 0x7;
    const APIC_MODE_NMI: u32 = 0x4;
    let mut lapic = fd.get_lapic()?;
    for (offset, mode) in [(APIC_LVT0, APIC_MODE_EXTINT), (APIC_LVT1, APIC_MODE_NMI)] {
        let mut raw = [0u8; 4];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = lapic.regs[offset + i] as u8;
        }
        let value = (u32::from_le_bytes(raw) & !0x700) | (mode << 8);
        for (i, b) in value.to_le_bytes().iter().enumerate() {
            lapic.regs[offset + i] = *b as _;
        }
    }
    fd.set_lapic(&lapic)
}

/// Builds the VM described by `config` and runs it until it ends.
pub fn run_vm(config: VmConfig) -> Result<RunOutcome, VmmError> {
    let mut trace = BootTrace::new(config.origin);
    if config.cpus == 0 || config.cpus > 254 {
        return Err(VmmError::Config(format!(
            "--cpus must be 1..=254, got {}",
            config.cpus
        )));
    }
    kick::install().map_err(|source| VmmError::Host {
        what: "installing the vCPU kick signal handler",
        source,
    })?;
    let mut vm = Vm::new()?;
    let placed = place_external_regions(config.memory_bytes, &config.external_regions);
    let low_end = config.memory_bytes.min(LOW_RAM_END);
    let high = config.memory_bytes - low_end;
    let mut linux_plan = match &config.payload {
        Payload::Linux { kernel, initrd, .. } => Some(linux::plan(
            kernel,
            initrd.as_deref(),
            low_end,
            high,
            HIGH_RAM_START,
        )?),
        Payload::Probe(_) => None,
    };
    let mut specs = match linux_plan.as_mut() {
        Some(plan) => std::mem::take(&mut plan.regions),
        None => crate::memory::ram_with_windows(low_end, high, HIGH_RAM_START, Vec::new()),
    };
    for (region, (name, gpa, size)) in config.external_regions.iter().zip(&placed) {
        specs.push(RegionSpec {
            name: name.clone(),
            gpa: *gpa,
            size: *size,
            backing: Backing::External {
                host_addr: region.host_addr,
                kvm_readonly: region.kvm_readonly.clone(),
            },
        });
    }
    let _write_fault_hooks: Vec<crate::write_fault::Registration> = config
        .external_regions
        .iter()
        .zip(&placed)
        .filter_map(|(region, &(_, gpa, size))| {
            let handler = region.write_fault.clone()?;
            Some(crate::write_fault::register(gpa, size, handler))
        })
        .collect();
    let memory = GuestMemory::new(specs)?;
    let merged = memory.advise_merge(config.merge)?;
    tracing::debug!("{merged} bytes of guest memory marked for same-page merging");
    vm.register_memory(&memory)?;
    let mut readonly_slots = ReadonlySlots::new(
        config
            .external_regions
            .iter()
            .filter_map(|region| {
                let ranges = region.readonly_ranges.clone()?;
                let index = memory
                    .regions()
                    .iter()
                    .position(|r| r.name == region.name)?;
                Some((index, memory.regions()[index].clone(), ranges))
            })
            .collect(),
    );

    // Linux takes interrupts: in-kernel PIC/IOAPIC/LAPIC and PIT. The probe needs none
    // and runs without, so its HLT exits to the VMM.
    let linux = linux_plan.is_some();
    if linux {
        vm.create_irqchip()?;
    }
    let host_err = |what| move |source| VmmError::Host { what, source };
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(host_err("eventfd"))?;
    if linux {
        vm.fd()
            .register_irqfd(&serial_irq, legacy::COM1_GSI)
            .map_err(|source| {
                VmmError::Vm(crate::vstate::vm::VmError::Kvm {
                    what: "KVM_IRQFD (serial)",
                    source,
                })
            })?;
    }
    let mut pio = Bus::new();
    let bus_err = |e: densevm_devices::BusError| VmmError::Config(e.to_string());
    let serial_evt = serial_irq.try_clone().map_err(host_err("eventfd clone"))?;
    pio.insert(
        Arc::new(Mutex::new(Serial::new(serial_evt, config.console))),
        legacy::COM1_BASE,
        legacy::SERIAL_LEN,
    )
    .map_err(bus_err)?;
    pio.insert(
        Arc::new(Mutex::new(I8042::new())),
        legacy::I8042_BASE,
        legacy::I8042_LEN,
    )
    .map_err(bus_err)?;
    pio.insert(
        Arc::new(Mutex::new(DebugPort)),
        legacy::DEBUG_PORT_BASE,
        legacy::DEBUG_PORT_LEN,
    )
    .map_err(bus_err)?;
    if linux {
        pio.insert(
            Arc::new(Mutex::new(Cmos::new())),
            legacy::CMOS_BASE,
            legacy::CMOS_LEN,
        )
        .map_err(bus_err)?;
        pio.insert(
            Arc::new(Mutex::new(AcpiPm)),
            legacy::ACPI_PM_BASE,
            legacy::ACPI_PM_LEN,
        )
        .map_err(bus_err)?;
        pio.insert(
            Arc::new(Mutex::new(PciHostBridge::new())),
            legacy::PCI_CONFIG_BASE,
            legacy::PCI_CONFIG_LEN,
        )
        .map_err(bus_err)?;
    }

    let fds = (0..config.cpus)
        .map(|i| create_vcpu(&vm, i, config.cpus))
        .collect::<Result<Vec<_>, _>>()?;
    let entry: Box<dyn EntryState> = match (&config.payload, &linux_plan) {
        (Payload::Probe(script), _) => {
            let tsc_khz = fds[0]
                .get_tsc_khz()
                .map(u64::from)
                .unwrap_or_else(|_| host_tsc_khz());
            let ram_low = memory.regions()[0].size;
            Box::new(probe::load_probe(
                memory.mem(),
                ram_low,
                memory.end(),
                config.cpus,
                script,
                &placed,
                tsc_khz,
            )?)
        }
        (Payload::Linux { cmdline, .. }, Some(plan)) => {
            for (i, fd) in fds.iter().enumerate() {
                set_lapic_lints(fd).map_err(|source| VmmError::Vcpu {
                    index: i as u32,
                    what: "KVM_SET_LAPIC",
                    source,
                })?;
            }
            let pmem: Vec<(u64, u64)> = placed.iter().map(|&(_, gpa, size)| (gpa, size)).collect();
            Box::new(linux::write_boot_data(
                memory.mem(),
                plan,
                cmdline,
                config.cpus,
                HIGH_RAM_START,
                &pmem,
            )?)
        }
        (Payload::Linux { .. }, None) => unreachable!("a Linux payload always has a plan"),
    };
    let mut vcpus = Vec::new();
    for (i, fd) in (0..config.cpus).zip(fds) {
        // With an irqchip, application processors wait for the guest's INIT/SIPI.
        if !linux || i == 0 {
            set_entry_state(&fd, i, entry.as_ref())?;
        }
        vcpus.push(Vcpu::new(i, fd));
    }
    drop(serial_irq);
    trace.mark("vm_ready");

    let shared = Arc::new(VcpuShared::new(
        pio,
        Bus::new(),
        vm.has_irqchip(),
        config.cpus,
    ));
    let (tx, rx) = channel();
    let mut threads = Vec::new();
    for vcpu in vcpus {
        let (shared, tx) = (shared.clone(), tx.clone());
        let handle = std::thread::Builder::new()
            .name("vcpu".into())
            .spawn(move || vcpu.run(shared, tx))
            .map_err(|source| VmmError::Host {
                what: "spawning a vCPU thread",
                source,
            })?;
        threads.push(handle);
    }
    drop(tx);

    let deadline = config.timeout.map(|t| Instant::now() + t);
    let mut halted = 0;
    let end = loop {
        let wait = deadline.map_or(Duration::from_secs(3600), |d| {
            d.saturating_duration_since(Instant::now())
        });
        let event = match rx.recv_timeout(wait) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) if deadline.is_some_and(|d| Instant::now() >= d) => {
                break VmEnd::TimedOut(config.timeout.unwrap_or_default());
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break VmEnd::AllHalted,
        };
        match event {
            VcpuEvent::FirstEntry(0, at) => trace.mark_at("vcpu0_first_entry", at),
            VcpuEvent::FirstEntry(..) | VcpuEvent::Stopped(_) => {}
            VcpuEvent::Request(_, GuestRequest::TraceMark(id), at) => {
                trace.mark_at(&mark_name(id), at)
            }
            VcpuEvent::Request(_, GuestRequest::Exit(code), _) => break VmEnd::GuestExit(code),
            VcpuEvent::Request(_, GuestRequest::Reset, _) => break VmEnd::Reset,
            VcpuEvent::Request(_, GuestRequest::PowerOff, _) => break VmEnd::PowerOff,
            VcpuEvent::Request(vcpu, GuestRequest::GuestFault(vector), _) => {
                break VmEnd::Failed {
                    vcpu,
                    failure: VcpuFailure::GuestException {
                        vector,
                        rip: 0,
                        cr2: 0,
                    },
                }
            }
            VcpuEvent::SystemEvent(_, kind) => {
                break if kind == kvm_bindings::KVM_SYSTEM_EVENT_RESET {
                    VmEnd::Reset
                } else {
                    VmEnd::PowerOff
                };
            }
            VcpuEvent::Halted(_) => {
                halted += 1;
                if halted == config.cpus {
                    break VmEnd::AllHalted;
                }
            }
            VcpuEvent::Failed(vcpu, failure) => break VmEnd::Failed { vcpu, failure },
            VcpuEvent::StaleReadonlySlot(_) => {
                let kick_all = || {
                    for handle in threads.iter().filter(|h| !h.is_finished()) {
                        kick::kick(handle.as_pthread_t());
                    }
                };
                let refreshed = readonly_slots.refresh(&mut vm, &shared.pause, kick_all);
                if let Ok(more) = refreshed {
                    shared.rearm_stale_notice(more);
                }
                shared.pause.resume();
                if let Err(e) = refreshed {
                    break VmEnd::HostError(format!(
                        "re-registering the read-only memory slots of a --pmem region: {e}"
                    ));
                }
            }
        }
    };
    trace.mark("vm_end");
    let memory_report = if config.report_memory {
        memory_report(memory.regions()).ok()
    } else {
        None
    };

    shared.stop.store(true, Ordering::Release);
    for handle in threads {
        while !handle.is_finished() {
            kick::kick(handle.as_pthread_t());
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = handle.join();
    }
    Ok(RunOutcome {
        end,
        trace,
        memory: memory_report,
        readonly_slots: readonly_slots.stats(shared.stale_exits()),
    })
}
