//! A vCPU thread: runs `KVM_RUN` and handles every exit reason on purpose.

use super::kick;
use densevm_devices::{Bus, GuestRequest};
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Why a vCPU stopped the VM with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuFailure {
    /// KVM_EXIT_SHUTDOWN: the guest triple-faulted.
    TripleFault {
        /// Guest RIP when it happened.
        rip: u64,
    },
    /// KVM_EXIT_INTERNAL_ERROR (e.g. an instruction KVM cannot emulate).
    InternalError {
        /// KVM's suberror code.
        suberror: u32,
        /// Guest RIP.
        rip: u64,
    },
    /// KVM_EXIT_FAIL_ENTRY: the CPU refused to enter the guest.
    FailEntry {
        /// Hardware failure reason.
        reason: u64,
    },
    /// The probe guest reported a CPU exception on its fault port.
    GuestException {
        /// Exception vector.
        vector: u8,
        /// Faulting guest RIP (as the probe reported it in RBX).
        rip: u64,
        /// CR2 at the fault (meaningful for #PF).
        cr2: u64,
    },
    /// A guest memory access KVM could not satisfy (EFAULT / KVM_EXIT_MEMORY_FAULT).
    MemoryFault {
        /// Guest-physical address, when known.
        gpa: Option<u64>,
    },
    /// An exit reason densevm does not support.
    UnsupportedExit(String),
    /// KVM_RUN itself failed.
    RunFailed(String),
}

impl std::fmt::Display for VcpuFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TripleFault { rip } => write!(
                f,
                "guest triple-faulted (KVM_EXIT_SHUTDOWN) at rip {rip:#x}"
            ),
            Self::InternalError { suberror, rip } => {
                let what = match suberror {
                    1 => "instruction emulation failed",
                    2 => "simultaneous exceptions",
                    3 => "delivery event failed",
                    _ => "unknown",
                };
                write!(f, "KVM internal error (suberror {suberror}: {what}) at rip {rip:#x}: the guest executed something KVM cannot handle")
            }
            Self::FailEntry { reason } => write!(
                f,
                "KVM could not enter the guest (KVM_EXIT_FAIL_ENTRY, reason {reason:#x})"
            ),
            Self::GuestException { vector, rip, cr2 } => {
                write!(
                    f,
                    "guest reported CPU exception {} (vector {vector}) at rip {rip:#x}",
                    exception_name(*vector)
                )?;
                if *vector == 14 {
                    write!(f, ", fault address {cr2:#x}")?;
                }
                Ok(())
            }
            Self::MemoryFault { gpa: Some(gpa) } => {
                write!(f, "guest memory access at gpa {gpa:#x} could not be served")
            }
            Self::MemoryFault { gpa: None } => {
                write!(f, "a guest memory access could not be served (EFAULT)")
            }
            Self::UnsupportedExit(what) => write!(f, "unsupported vCPU exit: {what}"),
            Self::RunFailed(e) => write!(f, "KVM_RUN failed: {e}"),
        }
    }
}

fn exception_name(vector: u8) -> &'static str {
    const NAMES: [&str; 22] = [
        "#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "CSO", "#TS", "#NP", "#SS",
        "#GP", "#PF", "reserved", "#MF", "#AC", "#MC", "#XM", "#VE", "#CP",
    ];
    NAMES.get(usize::from(vector)).copied().unwrap_or("unknown")
}

/// What a vCPU thread tells the VM's control loop.
#[derive(Debug, Clone)]
pub enum VcpuEvent {
    /// The vCPU is about to enter the guest for the first time.
    FirstEntry(u32, Instant),
    /// A device access asked the VMM to act.
    Request(u32, GuestRequest, Instant),
    /// The vCPU halted and nothing can wake it.
    Halted(u32),
    /// The guest powered off or reset through KVM_EXIT_SYSTEM_EVENT.
    SystemEvent(u32, u32),
    /// The vCPU hit a fatal condition.
    Failed(u32, VcpuFailure),
    /// The thread left its run loop after a stop request.
    Stopped(u32),
}

/// State shared by all vCPU threads of a VM.
pub struct VcpuShared {
    /// Port I/O bus.
    pub pio: Bus,
    /// MMIO bus.
    pub mmio: Bus,
    /// Set when the VM is stopping; threads leave their loop at the next exit or kick.
    pub stop: AtomicBool,
    /// Whether an in-kernel irqchip exists (HLT is then handled in the kernel).
    pub irqchip: bool,
    unknown_logged: Mutex<HashSet<(bool, u64)>>,
}

impl VcpuShared {
    /// Shared state for a VM with these buses.
    pub fn new(pio: Bus, mmio: Bus, irqchip: bool) -> Self {
        Self {
            pio,
            mmio,
            stop: AtomicBool::new(false),
            irqchip,
            unknown_logged: Mutex::new(HashSet::new()),
        }
    }

    fn log_unknown(&self, mmio: bool, addr: u64, write: bool) {
        let mut seen = self
            .unknown_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.insert((mmio, addr)) {
            let space = if mmio { "MMIO address" } else { "I/O port" };
            let dir = if write { "write to" } else { "read from" };
            tracing::info!(
                "guest {dir} unhandled {space} {addr:#x} (reads return all ones; logged once)"
            );
        }
    }
}

/// One vCPU and the thread-side loop that runs it.
pub struct Vcpu {
    id: u32,
    fd: VcpuFd,
    /// The last memory-fault gpa a write-fault handler served, and how many times in a row.
    repeated_fault: (u64, u32),
}

/// A memory fault served this many times in a row at one address means the handler is not
/// making progress; the vCPU fails instead of spinning.
const MAX_REPEATED_FAULTS: u32 = 64;

enum Step {
    Continue,
    Stop,
}

impl Vcpu {
    /// Wraps a configured vCPU.
    pub fn new(id: u32, fd: VcpuFd) -> Self {
        Self {
            id,
            fd,
            repeated_fault: (u64::MAX, 0),
        }
    }

    /// Runs until the VM stops; reports through `events`. Call on the vCPU's own thread.
    pub fn run(mut self, shared: Arc<VcpuShared>, events: Sender<VcpuEvent>) {
        let immediate_exit = std::ptr::addr_of_mut!(self.fd.get_kvm_run().immediate_exit);
        kick::bind(immediate_exit);
        let _ = events.send(VcpuEvent::FirstEntry(self.id, Instant::now()));
        loop {
            if shared.stop.load(Ordering::Acquire) {
                break;
            }
            match self.step(&shared, &events) {
                Step::Continue => {}
                Step::Stop => break,
            }
        }
        kick::unbind();
        let _ = events.send(VcpuEvent::Stopped(self.id));
    }

    fn rip(&self) -> u64 {
        self.fd.get_regs().map(|r| r.rip).unwrap_or(0)
    }

    fn fail(&self, events: &Sender<VcpuEvent>, failure: VcpuFailure) -> Step {
        let _ = events.send(VcpuEvent::Failed(self.id, failure));
        Step::Stop
    }

    fn request(&self, events: &Sender<VcpuEvent>, req: GuestRequest) -> Step {
        if let GuestRequest::GuestFault(vector) = req {
            let (rip, cr2) = self.fd.get_regs().map(|r| (r.rbx, r.rcx)).unwrap_or((0, 0));
            return self.fail(events, VcpuFailure::GuestException { vector, rip, cr2 });
        }
        let stop = matches!(req, GuestRequest::Exit(_) | GuestRequest::Reset);
        let _ = events.send(VcpuEvent::Request(self.id, req, Instant::now()));
        if stop {
            Step::Stop
        } else {
            Step::Continue
        }
    }

    fn step(&mut self, shared: &VcpuShared, events: &Sender<VcpuEvent>) -> Step {
        let id = self.id;
        let exit = match self.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.fd.set_kvm_immediate_exit(0);
                return Step::Continue;
            }
            Err(e) if e.errno() == libc::EFAULT => {
                return self.fail(events, VcpuFailure::MemoryFault { gpa: None });
            }
            Err(e) => return self.fail(events, VcpuFailure::RunFailed(e.to_string())),
        };
        match exit {
            VcpuExit::IoOut(port, data) => match shared.pio.write(u64::from(port), data) {
                Some(Some(req)) => self.request(events, req),
                Some(None) => Step::Continue,
                None => {
                    shared.log_unknown(false, u64::from(port), true);
                    Step::Continue
                }
            },
            VcpuExit::IoIn(port, data) => {
                if !shared.pio.read(u64::from(port), data) {
                    data.fill(0xff);
                    shared.log_unknown(false, u64::from(port), false);
                }
                Step::Continue
            }
            // pmem: a write to a read-only page of a service-mapped region (PVM reports it
            // as MMIO); the region's owner copies the page up and stores the bytes.
            VcpuExit::MmioWrite(addr, data) if crate::write_fault::handle(addr, Some(data)) => {
                Step::Continue
            }
            VcpuExit::MmioWrite(addr, data) => match shared.mmio.write(addr, data) {
                Some(Some(req)) => self.request(events, req),
                Some(None) => Step::Continue,
                None => {
                    shared.log_unknown(true, addr, true);
                    Step::Continue
                }
            },
            VcpuExit::MmioRead(addr, data) => {
                if !shared.mmio.read(addr, data) {
                    data.fill(0xff);
                    shared.log_unknown(true, addr, false);
                }
                Step::Continue
            }
            VcpuExit::Hlt => {
                // Without an in-kernel irqchip nothing can deliver an interrupt, so a
                // halted vCPU stays halted whatever its IF flag says.
                let _ = events.send(VcpuEvent::Halted(id));
                Step::Stop
            }
            VcpuExit::Shutdown => {
                let rip = self.rip();
                self.fail(events, VcpuFailure::TripleFault { rip })
            }
            VcpuExit::InternalError => {
                let run = self.fd.get_kvm_run();
                // SAFETY: KVM filled the `internal` member of the exit union because
                // exit_reason is KVM_EXIT_INTERNAL_ERROR.
                let suberror = unsafe { run.__bindgen_anon_1.internal.suberror };
                let rip = self.rip();
                self.fail(events, VcpuFailure::InternalError { suberror, rip })
            }
            VcpuExit::FailEntry(reason, _cpu) => {
                self.fail(events, VcpuFailure::FailEntry { reason })
            }
            VcpuExit::SystemEvent(kind, _data) => {
                let _ = events.send(VcpuEvent::SystemEvent(id, kind));
                Step::Stop
            }
            // pmem: the same write on hardware KVM; the guest retries it after the copy-up.
            VcpuExit::MemoryFault { gpa, .. } if crate::write_fault::handle(gpa, None) => {
                let (last, count) = self.repeated_fault;
                let count = if last == gpa { count + 1 } else { 1 };
                self.repeated_fault = (gpa, count);
                if count > MAX_REPEATED_FAULTS {
                    return self.fail(events, VcpuFailure::MemoryFault { gpa: Some(gpa) });
                }
                Step::Continue
            }
            VcpuExit::MemoryFault { gpa, .. } => {
                self.fail(events, VcpuFailure::MemoryFault { gpa: Some(gpa) })
            }
            VcpuExit::Intr | VcpuExit::IrqWindowOpen => Step::Continue,
            other => {
                let what = format!("{other:?}");
                self.fail(events, VcpuFailure::UnsupportedExit(what))
            }
        }
    }
}
