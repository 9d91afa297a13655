//! The VM's devices: legacy PC devices on the port bus, and virtio devices as virtio-pci
//! functions on PCI bus 0 — each with its BAR on the MMIO bus, a KVM ioeventfd per queue
//! (the guest's notification signals the device's worker without a VMM exit) and an irqfd
//! per MSI-X vector, routed by [`IrqRoutes`].

use crate::vmm::VmmError;
use crate::vstate::irq_routes::{IrqRoutes, IOAPIC_PINS};
use crate::vstate::vm::{Vm, VmError};
use densevm_devices::legacy::{self, AcpiPm, Cmos, DebugPort, Serial, I8042};
use densevm_devices::pci::PciRootState;
use densevm_devices::pci::{MsixVector, PciRoot, PCI_CONFIG_BASE, PCI_CONFIG_LEN};
use densevm_devices::Bus;
use densevm_virtio::transport::pci::{VirtioPci, VirtioPciState, BAR_SIZE};
use densevm_virtio::{Mem, VirtioDevice};
use kvm_ioctls::{IoEventAddress, NoDatamatch};
use std::io::Write;
use std::sync::{Arc, Mutex};
use vmm_sys_util::eventfd::EventFd;

/// Where PCI BARs are placed: in the 32-bit hole above low RAM, below the IOAPIC (the
/// window the DSDT's host bridge declares).
pub const PCI_MMIO_BASE: u32 = crate::arch::acpi::PCI_MMIO_WINDOW.0;
/// End of the BAR window.
pub const PCI_MMIO_END: u32 = crate::arch::acpi::PCI_MMIO_WINDOW.1;

/// The saved state of the legacy devices.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LegacyState {
    /// COM1.
    pub serial: legacy::SerialSnapshot,
    /// The CMOS (Linux guests).
    pub cmos: Option<legacy::CmosSnapshot>,
}

/// The buses and the devices on them.
pub struct DeviceManager {
    /// Port I/O bus.
    pub pio: Bus,
    /// MMIO bus (PCI BARs).
    pub mmio: Bus,
    pci: Option<Arc<Mutex<PciRoot>>>,
    routes: Option<Arc<IrqRoutes>>,
    next_gsi: u32,
    next_bar: u32,
    /// COM1 (its state goes into snapshots).
    pub serial: Arc<Mutex<Serial>>,
    cmos: Option<Arc<Mutex<Cmos>>>,
    /// The virtio-pci functions, in the order they were added.
    pub virtio: Vec<Arc<Mutex<VirtioPci>>>,
}

fn host_err(what: &'static str) -> impl Fn(std::io::Error) -> VmmError {
    move |source| VmmError::Host { what, source }
}

fn kvm_err(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Vm(VmError::Kvm { what, source })
}

impl DeviceManager {
    /// The legacy devices: COM1 (raising `serial_irq`), i8042, the debug ports and, for a
    /// Linux guest (`linux`), CMOS, the ACPI PM registers and the PCI root.
    pub fn new(
        vm: &Vm,
        console: Box<dyn Write + Send>,
        serial_irq: EventFd,
        linux: bool,
    ) -> Result<Self, VmmError> {
        Self::with_serial(vm, Serial::new(serial_irq, console), linux, 0)
    }

    /// The legacy devices of a restored VM, in their saved state.
    pub fn restore(
        vm: &Vm,
        console: Box<dyn Write + Send>,
        serial_irq: EventFd,
        linux: bool,
        state: &LegacyState,
        instance: u32,
    ) -> Result<Self, VmmError> {
        let serial =
            Serial::from_state(serial_irq, console, &state.serial).map_err(VmmError::Config)?;
        let dm = Self::with_serial(vm, serial, linux, instance)?;
        if let (Some(cmos), Some(saved)) = (&dm.cmos, &state.cmos) {
            let restored = Cmos::from_state(saved).map_err(VmmError::Config)?;
            *cmos.lock().unwrap_or_else(|p| p.into_inner()) = restored;
        }
        Ok(dm)
    }

    /// The legacy devices' state for a snapshot.
    pub fn save_legacy(&self) -> LegacyState {
        LegacyState {
            serial: self
                .serial
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .state(),
            cmos: self
                .cmos
                .as_ref()
                .map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).state()),
        }
    }

    /// `instance` is what the guest reads at the debug port's instance register (0 for a
    /// VM booted or restored, K + 1 for clone K).
    fn with_serial(vm: &Vm, serial: Serial, linux: bool, instance: u32) -> Result<Self, VmmError> {
        let mut pio = Bus::new();
        let bus_err = |e: densevm_devices::BusError| VmmError::Config(e.to_string());
        let serial = Arc::new(Mutex::new(serial));
        pio.insert(serial.clone(), legacy::COM1_BASE, legacy::SERIAL_LEN)
            .map_err(bus_err)?;
        pio.insert(
            Arc::new(Mutex::new(I8042::new())),
            legacy::I8042_BASE,
            legacy::I8042_LEN,
        )
        .map_err(bus_err)?;
        pio.insert(
            Arc::new(Mutex::new(DebugPort::with_instance(instance))),
            legacy::DEBUG_PORT_BASE,
            legacy::DEBUG_PORT_LEN,
        )
        .map_err(bus_err)?;
        let mut pci = None;
        let mut routes = None;
        let mut cmos = None;
        if linux {
            let c = Arc::new(Mutex::new(Cmos::new()));
            pio.insert(c.clone(), legacy::CMOS_BASE, legacy::CMOS_LEN)
                .map_err(bus_err)?;
            cmos = Some(c);
            pio.insert(
                Arc::new(Mutex::new(AcpiPm)),
                legacy::ACPI_PM_BASE,
                legacy::ACPI_PM_LEN,
            )
            .map_err(bus_err)?;
            let root = Arc::new(Mutex::new(PciRoot::new()));
            pio.insert(root.clone(), PCI_CONFIG_BASE, PCI_CONFIG_LEN)
                .map_err(bus_err)?;
            pci = Some(root);
            routes = Some(Arc::new(IrqRoutes::new(vm.shared_fd())));
        }
        Ok(Self {
            pio,
            mmio: Bus::new(),
            pci,
            routes,
            next_gsi: IOAPIC_PINS,
            next_bar: PCI_MMIO_BASE,
            serial,
            cmos,
            virtio: Vec::new(),
        })
    }

    /// Adds `device` as a virtio-pci function: BAR, ioeventfds, MSI-X vectors with irqfds.
    pub fn add_virtio(
        &mut self,
        vm: &Vm,
        mem: &Mem,
        device: Box<dyn VirtioDevice>,
    ) -> Result<(), VmmError> {
        self.add_function(vm, mem, device, None)
    }

    /// Adds `device` as a virtio-pci function in a saved state (a restored VM; functions are
    /// added in the saved order, so each gets its saved slot and BAR). It starts serving at
    /// [`resume_virtio`](Self::resume_virtio).
    pub fn add_virtio_restored(
        &mut self,
        vm: &Vm,
        mem: &Mem,
        device: Box<dyn VirtioDevice>,
        state: &VirtioPciState,
    ) -> Result<(), VmmError> {
        self.add_function(vm, mem, device, Some(state))
    }

    /// The PCI root's and every virtio function's state. Each function's device is left
    /// quiesced (its worker parked): call [`resume_virtio`](Self::resume_virtio) after. On
    /// an error every function serves again.
    pub fn save_pci(&self) -> Result<(Option<PciRootState>, Vec<VirtioPciState>), String> {
        let mut states = Vec::with_capacity(self.virtio.len());
        for t in &self.virtio {
            match t.lock().unwrap_or_else(|p| p.into_inner()).save_state() {
                Ok(state) => states.push(state),
                Err(e) => {
                    self.resume_virtio();
                    return Err(e.to_string());
                }
            }
        }
        let root = self
            .pci
            .as_ref()
            .map(|r| r.lock().unwrap_or_else(|p| p.into_inner()).save_state());
        Ok((root, states))
    }

    /// Lets every virtio function serve (after a save, or the first time after a restore).
    pub fn resume_virtio(&self) {
        for t in &self.virtio {
            if let Err(e) = t.lock().unwrap_or_else(|p| p.into_inner()).resume() {
                tracing::error!("virtio device cannot serve again: {e}");
            }
        }
    }

    /// Applies the PCI root's saved state (after every function was added).
    pub fn restore_pci_root(&self, state: &PciRootState) -> Result<(), VmmError> {
        match &self.pci {
            Some(root) => root
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .restore_state(state)
                .map_err(|e| VmmError::Config(format!("PCI state: {e}"))),
            None => Err(VmmError::Config(
                "the snapshot has PCI state but the VM has no PCI bus".into(),
            )),
        }
    }

    fn add_function(
        &mut self,
        vm: &Vm,
        mem: &Mem,
        device: Box<dyn VirtioDevice>,
        state: Option<&VirtioPciState>,
    ) -> Result<(), VmmError> {
        let (Some(pci), Some(routes)) = (&self.pci, &self.routes) else {
            return Err(VmmError::Config(
                "virtio devices need a Linux guest (--kernel); the probe guest has no PCI".into(),
            ));
        };
        if self.next_bar > PCI_MMIO_END - BAR_SIZE {
            return Err(VmmError::Config(
                "too many virtio devices for the PCI window".into(),
            ));
        }
        let mut vectors = Vec::new();
        for _ in 0..VirtioPci::vectors_needed(device.as_ref()) {
            let trigger = EventFd::new(libc::EFD_NONBLOCK).map_err(host_err("eventfd"))?;
            let gsi = self.next_gsi;
            self.next_gsi += 1;
            vm.fd()
                .register_irqfd(&trigger, gsi)
                .map_err(kvm_err("KVM_IRQFD (MSI-X vector)"))?;
            vectors.push(MsixVector { gsi, trigger });
        }
        let bar = self.next_bar;
        let transport = match state {
            None => VirtioPci::new(device, mem.clone(), bar, vectors, routes.clone())
                .map_err(host_err("virtio queue eventfds"))?,
            Some(state) => {
                VirtioPci::restore(device, mem.clone(), bar, vectors, routes.clone(), state)
                    .map_err(|e| VmmError::Config(format!("snapshot: {e}")))?
            }
        };
        for (addr, event) in transport.notify_addresses() {
            vm.fd()
                .register_ioevent(event, &IoEventAddress::Mmio(addr), NoDatamatch)
                .map_err(kvm_err("KVM_IOEVENTFD (virtio notification)"))?;
        }
        let transport = Arc::new(Mutex::new(transport));
        self.mmio
            .insert(transport.clone(), u64::from(bar), u64::from(BAR_SIZE))
            .map_err(|e| VmmError::Config(e.to_string()))?;
        pci.lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(transport.clone())
            .ok_or_else(|| VmmError::Config("PCI bus 0 is full (31 devices)".into()))?;
        self.next_bar += BAR_SIZE;
        self.virtio.push(transport);
        Ok(())
    }
}
