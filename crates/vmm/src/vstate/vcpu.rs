//! A vCPU thread: runs `KVM_RUN` and handles every exit reason on purpose.

use super::capture::Capture;
use super::kick;
use super::pause::PauseGate;
use crate::control::LoopEvent;
use crate::persist::VcpuState;
use crate::write_fault::{self, Outcome};
use densevm_devices::{Bus, GuestRequest};
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Writes to read-only slots keep finding their pages writable: the slots are out of
    /// date. The vCPUs are asked to park; the control thread refreshes the slots, resumes
    /// them, and re-arms the notice ([`VcpuShared::rearm_stale_notice`]).
    StaleReadonlySlot(u32),
}

/// Where vCPU threads report: the VM control loop's channel.
#[derive(Clone)]
pub struct EventSink(pub(crate) Sender<LoopEvent>);

impl EventSink {
    /// Sends `event` to the control loop; false once the loop has ended.
    pub fn send(&self, event: VcpuEvent) -> bool {
        self.0.send(LoopEvent::Vcpu(event)).is_ok()
    }
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
    /// Where vCPU threads park while the control thread changes memory slots.
    pub pause: PauseGate,
    /// Jobs parked vCPU threads run on their own vCPU (saving its state for a snapshot).
    pub capture: Capture<VcpuState>,
    /// Writes to read-only slots whose page was writable already.
    stale_exits: AtomicU64,
    /// The stale-exit count at which a vCPU parks itself and notifies the control thread.
    stale_notice_at: AtomicU64,
    /// A [`VcpuEvent::StaleReadonlySlot`] is on its way to the control thread.
    stale_notice_sent: AtomicBool,
    unknown_logged: Mutex<HashSet<(bool, u64)>>,
}

impl VcpuShared {
    /// Shared state for a VM with these buses and `vcpus` vCPU threads.
    pub fn new(pio: Bus, mmio: Bus, irqchip: bool, vcpus: u32) -> Self {
        Self {
            pio,
            mmio,
            stop: AtomicBool::new(false),
            irqchip,
            pause: PauseGate::new(vcpus),
            capture: Capture::new(vcpus),
            stale_exits: AtomicU64::new(0),
            stale_notice_at: AtomicU64::new(FIRST_STALE_NOTICE),
            stale_notice_sent: AtomicBool::new(false),
            unknown_logged: Mutex::new(HashSet::new()),
        }
    }

    /// Control side, after handling a [`VcpuEvent::StaleReadonlySlot`]: the next notice
    /// comes after `more` further stale exits.
    pub fn rearm_stale_notice(&self, more: u64) {
        let now = self.stale_exits.load(Ordering::Acquire);
        self.stale_notice_at
            .store(now.saturating_add(more.max(1)), Ordering::Release);
        self.stale_notice_sent.store(false, Ordering::Release);
    }

    /// The stale exits so far.
    pub fn stale_exits(&self) -> u64 {
        self.stale_exits.load(Ordering::Acquire)
    }

    /// A write exited although its page was writable: once enough did, the vCPU asks for a
    /// pause (so it stops exiting at once; it parks at the top of its loop) and tells the
    /// control thread, which refreshes the slots and resumes.
    fn note_stale(&self, id: u32, events: &EventSink) {
        let n = self.stale_exits.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= self.stale_notice_at.load(Ordering::Acquire)
            && !self.stale_notice_sent.swap(true, Ordering::AcqRel)
        {
            self.pause.request();
            let _ = events.send(VcpuEvent::StaleReadonlySlot(id));
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

/// Stale exits before the first [`VcpuEvent::StaleReadonlySlot`].
pub const FIRST_STALE_NOTICE: u64 = 16;

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
    pub fn run(mut self, shared: Arc<VcpuShared>, events: EventSink) {
        /// Leaves the run loop for good however the thread ends (a panic included): the
        /// pause gate stops waiting for it and the control loop learns it is gone.
        struct Leave<'a>(u32, &'a VcpuShared, &'a EventSink);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.1.pause.leave();
                kick::unbind();
                let _ = self.2.send(VcpuEvent::Stopped(self.0));
            }
        }
        let _leave = Leave(self.id, &shared, &events);
        let immediate_exit = std::ptr::addr_of_mut!(self.fd.get_kvm_run().immediate_exit);
        kick::bind(immediate_exit);
        let _ = events.send(VcpuEvent::FirstEntry(self.id, Instant::now()));
        loop {
            if shared.stop.load(Ordering::Acquire) {
                break;
            }
            if shared.pause.requested() {
                let id = self.id;
                let fd = &mut self.fd;
                shared.pause.park(&shared.stop, || {
                    if shared.capture.pending() {
                        shared.capture.service(id, fd);
                    }
                });
                continue;
            }
            match self.step(&shared, &events) {
                Step::Continue => {}
                Step::Stop => break,
            }
        }
    }

    fn rip(&self) -> u64 {
        self.fd.get_regs().map(|r| r.rip).unwrap_or(0)
    }

    fn fail(&self, events: &EventSink, failure: VcpuFailure) -> Step {
        let _ = events.send(VcpuEvent::Failed(self.id, failure));
        Step::Stop
    }

    fn request(&self, shared: &VcpuShared, events: &EventSink, req: GuestRequest) -> Step {
        if let GuestRequest::Sleep(ms) = req {
            shared
                .pause
                .nap(Duration::from_millis(ms.into()), &shared.stop);
            return Step::Continue;
        }
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

    fn step(&mut self, shared: &VcpuShared, events: &EventSink) -> Step {
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
                Some(Some(req)) => self.request(shared, events, req),
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
            // pmem: a write to a read-only page of a service-mapped region (a read-only
            // slot, or PVM's report of a read-only host page); the region's owner copies the
            // page up and stores the bytes.
            VcpuExit::MmioWrite(addr, data) => match write_fault::handle(addr, Some(data)) {
                Outcome::Served => Step::Continue,
                Outcome::Stale => {
                    shared.note_stale(id, events);
                    Step::Continue
                }
                Outcome::Failed => self.fail(events, VcpuFailure::MemoryFault { gpa: Some(addr) }),
                Outcome::NotCovered => match shared.mmio.write(addr, data) {
                    Some(Some(req)) => self.request(shared, events, req),
                    Some(None) => Step::Continue,
                    None => {
                        shared.log_unknown(true, addr, true);
                        Step::Continue
                    }
                },
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
            // pmem: a write to a read-only host page in a writable slot on hardware KVM; the
            // guest retries it after the copy-up.
            VcpuExit::MemoryFault { gpa, .. } => match write_fault::handle(gpa, None) {
                Outcome::Failed | Outcome::NotCovered => {
                    self.fail(events, VcpuFailure::MemoryFault { gpa: Some(gpa) })
                }
                Outcome::Served | Outcome::Stale => {
                    let (last, count) = self.repeated_fault;
                    let count = if last == gpa { count + 1 } else { 1 };
                    self.repeated_fault = (gpa, count);
                    if count > MAX_REPEATED_FAULTS {
                        return self.fail(events, VcpuFailure::MemoryFault { gpa: Some(gpa) });
                    }
                    Step::Continue
                }
            },
            VcpuExit::Intr | VcpuExit::IrqWindowOpen => Step::Continue,
            other => {
                let what = format!("{other:?}");
                self.fail(events, VcpuFailure::UnsupportedExit(what))
            }
        }
    }
}
