//! Building a VM from a [`VmConfig`]: memory, the KVM VM and irqchip, devices, vCPUs and
//! the guest payload. The result is a [`Vmm`] ready to run its event loop.

use crate::arch::cpuid::{vcpu_cpuid, CpuidOptions, SupportedCpuid};
use crate::balloon::{SharedRam, VmBalloon};
use crate::boot::{linux, probe, EntryState};
use crate::config::{
    place_external_regions, BootImages, Payload, VmConfig, HIGH_RAM_START, LOW_RAM_END,
};
use crate::device_manager::DeviceManager;
use crate::memory::{back_ram_with_file, GuestMemory};
use crate::snapshot::ram::{create_ram_file, RamFile};
use crate::trace::BootTrace;
use crate::vmm::{Vmm, VmmError};
use crate::vstate::kick;
use crate::vstate::readonly_slots::ReadonlySlots;
use crate::vstate::vcpu::{Vcpu, VcpuShared};
use crate::vstate::vm::Vm;
use densevm_devices::legacy;
use kvm_bindings::CpuId;
use kvm_ioctls::VcpuFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

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

fn vcpu_err(index: u32, what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Vcpu {
        index,
        what,
        source,
    }
}

/// A new vCPU with no state set: a restore gives it the saved CPUID and the rest.
pub(crate) fn new_vcpu(vm: &Vm, index: u32) -> Result<VcpuFd, VmmError> {
    vm.fd()
        .create_vcpu(u64::from(index))
        .map_err(vcpu_err(index, "KVM_CREATE_VCPU"))
}

/// A new vCPU `index` of `count` for a booting VM, with KVM's supported CPUID
/// (`supported`, read once per VM: each read costs ~0.4 ms on the development host, whose
/// every host `cpuid` exits to its own hypervisor) adjusted.
pub(crate) fn create_vcpu(
    vm: &Vm,
    index: u32,
    count: u32,
    supported: &CpuId,
    options: CpuidOptions,
) -> Result<VcpuFd, VmmError> {
    let fd = new_vcpu(vm, index)?;
    fd.set_cpuid2(&vcpu_cpuid(
        supported.clone(),
        index as u8,
        count as u8,
        options,
    ))
    .map_err(vcpu_err(index, "KVM_SET_CPUID2"))?;
    Ok(fd)
}

fn set_entry_state(fd: &VcpuFd, index: u32, entry: &dyn EntryState) -> Result<(), VmmError> {
    let sregs = fd.get_sregs().map_err(vcpu_err(index, "KVM_GET_SREGS"))?;
    fd.set_sregs(&entry.sregs(index, sregs))
        .map_err(vcpu_err(index, "KVM_SET_SREGS"))?;
    fd.set_regs(&entry.regs(index))
        .map_err(vcpu_err(index, "KVM_SET_REGS"))?;
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

/// Builds the VM described by `config`, ready to run.
pub fn build(config: VmConfig) -> Result<Vmm, VmmError> {
    let mut trace = BootTrace::new(config.origin);
    // Where the command line handed over: the rest of start-up is the build's.
    trace.mark("build_start");
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
    let mut vcpu_threads = Vec::new();
    // vCPU 0's thread reads KVM's supported CPUID before it installs its filter, while
    // this thread creates the VM, its memory and devices.
    let (read_cpuid, supported) = SupportedCpuid::read_ahead();
    crate::vmm::prestart_vcpu_threads(&mut vcpu_threads, 1, Some(read_cpuid));
    let mut vm = Vm::new()?;
    let placed = place_external_regions(config.memory_bytes, &config.external_regions);
    let low_end = config.memory_bytes.min(LOW_RAM_END);
    let high = config.memory_bytes - low_end;
    let mut linux_plan = match &config.payload {
        Payload::Linux {
            kernel,
            initrd,
            images,
            ..
        } => Some(linux::plan(
            kernel,
            initrd.as_deref(),
            // A budget covers guest RAM: whatever of the guest lay outside it would escape.
            if config.memory_budget.is_some() {
                BootImages::Copied
            } else {
                *images
            },
            low_end,
            high,
            HIGH_RAM_START,
        )?),
        Payload::Probe(_) => None,
    };
    let linux = linux_plan.is_some();
    if !linux && !config.devices.is_empty() {
        return Err(VmmError::Config(
            "virtio devices (--disk, --share, --rng) need a Linux guest (--kernel); the probe guest has no PCI".into(),
        ));
    }
    if let Some(balloon) = &config.balloon {
        if !linux {
            return Err(VmmError::Config(
                "--balloon is a virtio device for a Linux guest (--kernel); the probe guest has no PCI".into(),
            ));
        }
        crate::balloon::check_config(balloon, config.memory_bytes)?;
    }
    let mut specs = match linux_plan.as_mut() {
        Some(plan) => std::mem::take(&mut plan.regions),
        None => crate::memory::ram_with_windows(low_end, high, HIGH_RAM_START, Vec::new()),
    };
    specs.extend(crate::external::region_specs(
        &config.external_regions,
        &placed,
    ));
    // Guest RAM lives in a memfd mapped shared, so that a clone template costs no copy
    // (snapshot::ram). `--merge all` keeps it anonymous: KSM merges anonymous pages only.
    let ram = if config.merge == crate::memory::MergePolicy::All {
        RamFile::new(None, false)
    } else {
        let end = specs.iter().map(|s| s.gpa + s.size).max().unwrap_or(0);
        let file = Arc::new(create_ram_file(end).map_err(|source| VmmError::Host {
            what: "creating the guest RAM file (memfd)",
            source,
        })?);
        back_ram_with_file(&mut specs, &file, true);
        RamFile::new(Some(file), true)
    };
    let memory = GuestMemory::new(specs)?;
    let merged = memory.advise_merge(config.merge)?;
    tracing::debug!("{merged} bytes of guest memory marked for same-page merging");
    vm.register_memory(&memory)?;
    crate::vmm::prestart_vcpu_threads(&mut vcpu_threads, config.cpus, None);
    let external = crate::external::attach(&config.external_regions, &placed, &memory, linux);
    let ram = Arc::new(std::sync::Mutex::new(ram));
    let mut virtio: Vec<_> = external.devices.into_iter().chain(config.devices).collect();
    let balloon = match &config.balloon {
        Some(c) => {
            let (device, balloon) =
                crate::balloon::create(c, config.memory_bytes, memory.regions(), ram.clone())?;
            // Last: a restore recreates it after the caller's devices, in the same slot.
            virtio.push(Box::new(device));
            Some(balloon)
        }
        None => None,
    };
    // Linux takes interrupts: in-kernel PIC/IOAPIC/LAPIC and PIT. The probe needs none
    // and runs without, so its HLT exits to the VMM.
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
    let serial_evt = serial_irq.try_clone().map_err(host_err("eventfd clone"))?;
    let mut devices = DeviceManager::new(&vm, config.console, serial_evt, linux)?;
    for device in virtio {
        devices.add_virtio(&vm, memory.mem(), device)?;
    }

    let options = CpuidOptions {
        async_pf: config.memory_budget.as_ref().is_none_or(|s| s.async_pf),
    };
    let supported = supported.get(vm.kvm()).map_err(|source| {
        VmmError::Vm(crate::vstate::vm::VmError::Kvm {
            what: "KVM_GET_SUPPORTED_CPUID",
            source,
        })
    })?;
    let fds = (0..config.cpus)
        .map(|i| create_vcpu(&vm, i, config.cpus, &supported, options))
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
                set_lapic_lints(fd).map_err(vcpu_err(i as u32, "KVM_SET_LAPIC"))?;
            }
            let entry =
                linux::write_boot_data(memory.mem(), plan, cmdline, config.cpus, HIGH_RAM_START)?;
            crate::arch::vmgenid::write_new_id(memory.mem())
                .map_err(|e| VmmError::Config(e.to_string()))?;
            Box::new(entry)
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
    // The payload is in place: from here on RAM is kept under the budget.
    if let Some(settings) = &config.memory_budget {
        let mut ram = crate::balloon::lock_ram(&ram);
        crate::tiering::start(&memory, &mut ram, settings, None, vcpus.len())?;
    }
    trace.mark("vm_ready");
    let mut vmm = finish(
        vm,
        memory,
        vcpus,
        devices,
        trace,
        Extras {
            timeout: config.timeout,
            report_memory: config.report_memory,
            linux,
            ram,
            memory_bytes: config.memory_bytes,
            device_specs: config.device_specs,
            balloon,
        },
    );
    vmm.vcpu_threads = vcpu_threads;
    vmm.readonly_slots = external.slots;
    vmm.write_fault_hooks = external.hooks;
    vmm.external_flush = external.flush;
    Ok(vmm)
}

/// What [`finish`] needs besides the built parts.
pub(crate) struct Extras {
    pub timeout: Option<Duration>,
    pub report_memory: bool,
    pub linux: bool,
    pub ram: SharedRam,
    pub memory_bytes: u64,
    pub device_specs: serde_json::Value,
    pub balloon: Option<VmBalloon>,
}

/// Assembles a [`Vmm`] from its built parts (a fresh boot or a restore).
pub(crate) fn finish(
    vm: Vm,
    memory: GuestMemory,
    vcpus: Vec<Vcpu>,
    devices: DeviceManager,
    trace: BootTrace,
    extras: Extras,
) -> Vmm {
    let cpus = vcpus.len() as u32;
    let shared = Arc::new(VcpuShared::new(
        devices.pio.clone(),
        devices.mmio.clone(),
        vm.has_irqchip(),
        cpus,
    ));
    let (events_tx, events_rx) = std::sync::mpsc::channel();
    Vmm {
        vm,
        memory,
        vcpus,
        shared,
        devices,
        readonly_slots: ReadonlySlots::new(Vec::new()),
        trace,
        write_fault_hooks: Vec::new(),
        external_flush: Vec::new(),
        timeout: extras.timeout,
        cpus,
        report_memory: extras.report_memory,
        linux: extras.linux,
        ram: extras.ram,
        memory_bytes: extras.memory_bytes,
        device_specs: extras.device_specs,
        balloon: extras.balloon,
        notify_vmgenid: false,
        on_running: None,
        paused: false,
        events_tx,
        events_rx: Some(events_rx),
        vcpu_threads: Vec::new(),
    }
}
