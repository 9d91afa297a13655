//! Building a VM from a snapshot directory: the saved layout (RAM and boot-image windows)
//! mapped `MAP_PRIVATE` over the memory file (or an inherited template descriptor), the VM and vCPU state put
//! back before any vCPU runs. With a memory budget, RAM is instead a fresh memfd of the
//! VM's own, mapped shared and filled page by page from the memory file on first access by
//! the memory tier (crate::tiering), which keeps it under the budget.

use super::ram::{create_ram_file, RamFile};
use super::{SnapshotState, MEMORY_FILE, STATE_FILE};
use crate::builder::{finish, new_vcpu};
use crate::device_manager::DeviceManager;
use crate::memory::{is_ram, Backing, GuestMemory, RegionSpec};
use crate::persist;
use crate::trace::BootTrace;
use crate::vmm::{Vmm, VmmError};
use crate::vstate::kick;
use crate::vstate::vcpu::Vcpu;
use crate::vstate::vm::Vm;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

/// Where a restored VM comes from.
#[derive(Debug)]
pub struct RestoreSource {
    /// The snapshot directory (holds `state`, and `memory` unless `ram` is given).
    pub dir: PathBuf,
    /// A clone template's RAM file, inherited from the VM that froze it.
    pub ram: Option<OwnedFd>,
    /// The instance number the guest reads at the debug port (K + 1 for clone K, else 0).
    pub instance: u32,
    /// `--memory-budget`: RAM in a memfd of its own, tiered over the memory file.
    pub memory_budget: Option<crate::tiering::TierSettings>,
}

fn bad(dir: &Path, what: impl std::fmt::Display) -> VmmError {
    VmmError::Config(format!("snapshot {}: {what}", dir.display()))
}

/// Reads and checks a snapshot's state: container, CPU model, layout.
pub fn read_snapshot(dir: &Path) -> Result<SnapshotState, VmmError> {
    let state: SnapshotState =
        persist::read_state(&dir.join(STATE_FILE)).map_err(|e| bad(dir, e))?;
    persist::check_same_cpu(&state.host_cpu).map_err(|e| bad(dir, e))?;
    check_state(&state).map_err(|e| bad(dir, e))?;
    Ok(state)
}

/// The checks of [`read_snapshot`] that need neither KVM nor this host's CPU (fuzzed).
pub(crate) fn check_state(state: &SnapshotState) -> Result<(), String> {
    let cpus = state.vcpus.len();
    if cpus == 0 || cpus > 254 {
        return Err(format!("{cpus} vCPUs saved (1..=254 allowed)"));
    }
    if state.linux && !state.irqchip {
        return Err("a Linux guest saved without its irqchip".into());
    }
    if state.regions.iter().all(|r| !is_ram(&r.name)) {
        return Err("the saved layout has no RAM region".into());
    }
    if state.balloon.is_some() && !state.linux {
        return Err("a balloon device saved for a guest without PCI (the probe)".into());
    }
    Ok(())
}

/// What the caller opened again for a restore, from the snapshot's `device_specs`.
pub struct Reopened {
    /// The external (`--pmem`) regions, mapped again, in their saved order.
    pub external: Vec<crate::config::ExternalRegion>,
    /// The virtio devices, in their saved order (pmem devices excluded: the restore makes
    /// those for the external regions).
    pub virtio: Vec<Box<dyn densevm_virtio::VirtioDevice>>,
}

/// Checks that `external` (the regions the caller mapped again) land where the snapshot's
/// external regions were, by name, place and size; returns their placement.
fn check_external(
    state: &SnapshotState,
    external: &[crate::config::ExternalRegion],
) -> Result<Vec<crate::external::Placement>, String> {
    let saved: Vec<_> = state.regions.iter().filter(|r| r.external).collect();
    if saved.len() != external.len() {
        return Err(format!(
            "it has {} --pmem region(s) but {} image(s) were opened for it",
            saved.len(),
            external.len()
        ));
    }
    let placed = crate::config::place_external_regions(state.memory_bytes, external);
    for (r, (name, gpa, size)) in saved.iter().zip(&placed) {
        if (&r.name, r.gpa, r.size) != (name, *gpa, *size) {
            return Err(format!(
                "region {} was at {:#x}+{:#x} but the image opened for it lands at {:#x}+{:#x} as {name}: not the image the VM had",
                r.name, r.gpa, r.size, gpa, size
            ));
        }
    }
    Ok(placed)
}

/// Builds a paused-at-birth VM from `source`, whose state the caller read with
/// [`read_snapshot`] (and opened `devices` from); it continues where the snapshot was
/// taken when run.
pub fn build_restored(
    source: RestoreSource,
    state: SnapshotState,
    reopened: Reopened,
    console: Box<dyn Write + Send>,
    timeout: Option<Duration>,
    origin: Instant,
    report_memory: bool,
) -> Result<Vmm, VmmError> {
    let mut trace = BootTrace::new(origin);
    trace.mark("state_read");
    let dir = source.dir;
    let Reopened {
        external,
        virtio: devices,
    } = reopened;
    kick::install().map_err(|source| VmmError::Host {
        what: "installing the vCPU kick signal handler",
        source,
    })?;
    let mut vcpu_threads = Vec::new();
    crate::vmm::prestart_vcpu_threads(&mut vcpu_threads, state.vcpus.len().min(1) as u32, None);
    let file = match source.ram {
        Some(fd) => File::from(fd),
        None => File::open(dir.join(MEMORY_FILE))
            .map_err(|e| bad(&dir, format!("cannot open its memory file: {e}")))?,
    };
    let placed = check_external(&state, &external).map_err(|e| bad(&dir, e))?;
    let ram_end = state
        .regions
        .iter()
        .filter(|r| !r.external)
        .map(|r| r.gpa.saturating_add(r.size))
        .max()
        .unwrap_or(0);
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len < ram_end {
        return Err(bad(
            &dir,
            format!("the memory file holds {len} bytes but the saved RAM ends at {ram_end}: it is truncated"),
        ));
    }
    let file = Arc::new(file);
    // With a budget, RAM regions map a memfd of the VM's own, filled from `file` by the tier
    // (boot-image windows stay private over `file`: the tier does not serve them).
    let own = match &source.memory_budget {
        Some(settings) => {
            let own = create_ram_file(len)
                .map_err(|e| bad(&dir, format!("cannot create its RAM file: {e}")))?;
            Some((Arc::new(own), settings))
        }
        None => None,
    };
    let mut specs = Vec::with_capacity(state.regions.len());
    for r in state.regions.iter().filter(|r| !r.external) {
        let (backing, shared) = match &own {
            Some((own, _)) if is_ram(&r.name) => (own.clone(), true),
            _ => (file.clone(), false),
        };
        specs.push(RegionSpec {
            name: r.name.clone(),
            gpa: r.gpa,
            size: r.size,
            backing: Backing::RamFile {
                file: backing,
                offset: r.gpa,
                shared,
            },
        });
    }
    specs.extend(crate::external::region_specs(&external, &placed));
    let memory = GuestMemory::new(specs)?;
    let parts = crate::external::attach(&external, &placed, &memory, state.linux);
    let mut devices: Vec<_> = parts.devices.into_iter().chain(devices).collect();
    let ram_file = match own {
        Some((own, settings)) => {
            // The tier serves RAM from here on, before anything reads or writes it.
            let mut ram_file = RamFile::new(Some(own), true);
            crate::tiering::start(
                &memory,
                &mut ram_file,
                settings,
                Some(file.clone()),
                state.vcpus.len(),
            )?;
            trace.mark("tier_started");
            ram_file
        }
        None => {
            // The RAM is private over the memory file (or template): a balloon release maps
            // zeros over the range and remembers it (`RamFile::discard`).
            // Writes into the file's holes go to anonymous memory, not into the file and
            // then a private copy (crate::snapshot::holes).
            let mut ram_file = RamFile::new(Some(file.clone()), false);
            ram_file.set_anon_holes(crate::snapshot::holes::cover_holes(memory.regions(), &file));
            trace.mark("holes_covered");
            ram_file
        }
    };
    let ram = Arc::new(std::sync::Mutex::new(ram_file));
    let balloon = match &state.balloon {
        Some(config) => {
            let (device, balloon) =
                crate::balloon::create(config, state.memory_bytes, memory.regions(), ram.clone())
                    .map_err(|e| bad(&dir, e))?;
            devices.push(Box::new(device));
            Some(balloon)
        }
        None => None,
    };
    let mut vm = Vm::new()?;
    vm.register_memory(&memory)?;
    crate::vmm::prestart_vcpu_threads(&mut vcpu_threads, state.vcpus.len() as u32, None);
    trace.mark("memory_mapped");
    if state.irqchip {
        vm.create_irqchip()?;
    }
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| VmmError::Host {
        what: "eventfd",
        source,
    })?;
    if state.linux {
        vm.fd()
            .register_irqfd(&serial_irq, densevm_devices::legacy::COM1_GSI)
            .map_err(|source| {
                VmmError::Vm(crate::vstate::vm::VmError::Kvm {
                    what: "KVM_IRQFD (serial)",
                    source,
                })
            })?;
    }
    let serial_evt = serial_irq.try_clone().map_err(|source| VmmError::Host {
        what: "eventfd clone",
        source,
    })?;
    let mut manager = DeviceManager::restore(
        &vm,
        console,
        serial_evt,
        state.linux,
        &state.legacy,
        source.instance,
    )?;
    if devices.len() != state.virtio.len() {
        return Err(bad(
            &dir,
            format!(
                "it saved {} virtio devices but {} were opened for it",
                state.virtio.len(),
                devices.len()
            ),
        ));
    }
    for (device, saved) in devices.into_iter().zip(&state.virtio) {
        manager.add_virtio_restored(&vm, memory.mem(), device, saved)?;
    }
    if let Some(pci) = &state.pci {
        manager.restore_pci_root(pci)?;
    }
    trace.mark("devices_restored");
    persist::restore_vm(vm.fd(), &state.vm).map_err(|e| bad(&dir, e))?;
    let cpus = state.vcpus.len() as u32;
    let mut vcpus = Vec::with_capacity(state.vcpus.len());
    for (i, saved) in (0..cpus).zip(&state.vcpus) {
        // The saved CPUID and MSRs go back as they were: a restored guest keeps the async
        // page faults it had, budget or not. Turning them off under it (the MSR) would
        // strand any task that waited on one when the snapshot was taken: only enabling the
        // MSR wakes them all.
        let fd = new_vcpu(&vm, i)?;
        persist::restore_vcpu(&fd, vm.kvm(), saved)
            .map_err(|e| bad(&dir, format!("vCPU {i}: {e}")))?;
        vcpus.push(Vcpu::new(i, fd));
    }
    if state.linux {
        // A restored or cloned guest is a new instance: a new VM generation ID (Linux
        // reseeds its RNG when told, see Vmm::run).
        crate::arch::vmgenid::write_new_id(memory.mem()).map_err(|e| bad(&dir, e))?;
    }
    drop(serial_irq);
    // Devices serve from here: the irqchip and vCPUs that take their interrupts are back.
    manager.resume_virtio();
    trace.mark("vm_ready");
    let mut vmm = finish(
        vm,
        memory,
        vcpus,
        manager,
        trace,
        crate::builder::Extras {
            timeout,
            report_memory,
            linux: state.linux,
            ram,
            memory_bytes: state.memory_bytes,
            device_specs: state.device_specs,
            balloon,
        },
    );
    vmm.vcpu_threads = vcpu_threads;
    vmm.notify_vmgenid = state.linux;
    vmm.readonly_slots = parts.slots;
    vmm.write_fault_hooks = parts.hooks;
    vmm.external_flush = parts.flush;
    Ok(vmm)
}
