//! A built VM and its event loop: vCPU threads report to the control thread, which decides
//! how the VM ends, refreshes read-only memory slots, and tears everything down.

use crate::balloon::{BalloonReport, SharedRam, VmBalloon};
use crate::control::{LoopEvent, VmmHandle};
use crate::device_manager::DeviceManager;
use crate::memory::{GuestMemory, MemoryError};
use crate::report::{memory_report, MemoryReport};
use crate::trace::{mark_name, BootTrace};
use crate::vstate::kick;
use crate::vstate::readonly_slots::{ReadonlySlotStats, ReadonlySlots};
use crate::vstate::vcpu::EventSink;
use crate::vstate::vcpu::{Vcpu, VcpuEvent, VcpuFailure, VcpuShared};
use crate::vstate::vm::{Vm, VmError};
use crate::{boot::linux, boot::probe, config::VmConfig};
use densevm_devices::GuestRequest;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long after start a VM drops the code mappings only its start-up used.
const TEXT_TRIM_AFTER: Duration = Duration::from_millis(500);

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
    /// What the balloon did, if the VM has one.
    pub balloon: Option<BalloonReport>,
    /// The memory tier's counters at the end, if the VM ran with `--memory-budget`.
    pub tier: Option<crate::tiering::TierStats>,
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

/// A VM ready to run (see [`crate::builder::build`]).
pub struct Vmm {
    pub(crate) vm: Vm,
    pub(crate) memory: GuestMemory,
    pub(crate) vcpus: Vec<Vcpu>,
    pub(crate) shared: Arc<VcpuShared>,
    pub(crate) devices: DeviceManager,
    pub(crate) readonly_slots: ReadonlySlots,
    pub(crate) trace: BootTrace,
    pub(crate) write_fault_hooks: Vec<crate::write_fault::Registration>,
    /// Each external region's flush, called before a snapshot refers to its image.
    pub(crate) external_flush: Vec<densevm_virtio::pmem::FlushFn>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) cpus: u32,
    pub(crate) report_memory: bool,
    /// A Linux guest (PCI, virtio, CMOS): not snapshottable yet.
    pub(crate) linux: bool,
    /// How guest RAM is held (for snapshots and templates; shared with the balloon, which
    /// releases RAM through it).
    pub(crate) ram: SharedRam,
    /// The balloon device, if the VM has one.
    pub(crate) balloon: Option<VmBalloon>,
    /// Guest RAM in bytes.
    pub(crate) memory_bytes: u64,
    /// How the caller opened the virtio devices (saved in snapshots).
    pub(crate) device_specs: serde_json::Value,
    /// A restored Linux guest got a new VM generation ID: tell it once its vCPUs run.
    pub(crate) notify_vmgenid: bool,
    /// Called once the vCPU threads are started (a clone tells its parent it runs).
    pub(crate) on_running: Option<Box<dyn FnOnce() + Send>>,
    /// Paused by a control request (as opposed to a slot refresh).
    pub(crate) paused: bool,
    pub(crate) events_tx: Sender<LoopEvent>,
    pub(crate) events_rx: Option<Receiver<LoopEvent>>,
    /// The vCPU threads, started (and their seccomp filter installed) while the VM was
    /// built; [`Vmm::run`] hands each its vCPU.
    pub(crate) vcpu_threads: Vec<densevm_seccomp::Prestarted>,
}

/// Starts vCPU threads ahead of their vCPUs until `threads` holds `count`, so that each
/// installs its seccomp filter (0.04–0.1 ms of kernel time here, 0.5 ms before the
/// filters became a search) while the VM is built rather than before the guest's first
/// instruction. Threads that cannot be started now are
/// started by [`Vmm::run`] later, as before.
///
/// The builders start vCPU 0's thread as they begin and the others' once guest memory is
/// registered: on two host CPUs, four threads installing their filters at once held up
/// the build by 1.4 ms, and KVM's memory registration, which waits for an SRCU grace
/// period, is slowest while the other CPU is busy.
///
/// `first` runs on the first thread started, before its filter (see
/// [`densevm_seccomp::Prestarted::start_after`]).
pub(crate) fn prestart_vcpu_threads(
    threads: &mut Vec<densevm_seccomp::Prestarted>,
    count: u32,
    mut first: Option<densevm_seccomp::Work>,
) {
    while threads.len() < count as usize {
        let kind = densevm_seccomp::ThreadKind::Vcpu;
        match densevm_seccomp::Prestarted::start_after(kind, "vcpu", first.take()) {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                tracing::debug!("cannot start a vCPU thread ahead: {e}");
                break;
            }
        }
    }
}

/// Builds the VM described by `config` and runs it until it ends.
pub fn run_vm(config: VmConfig) -> Result<RunOutcome, VmmError> {
    crate::builder::build(config)?.run()
}

impl Vmm {
    /// COM1, e.g. to feed it console input (`Serial::enqueue_input`).
    pub fn serial(&self) -> Arc<std::sync::Mutex<densevm_devices::legacy::Serial>> {
        self.devices.serial.clone()
    }

    /// Calls `f` once the vCPU threads have started.
    pub fn on_running(&mut self, f: Box<dyn FnOnce() + Send>) {
        self.on_running = Some(f);
    }

    /// A handle through which other threads (the API server) control this VM.
    pub fn handle(&self) -> VmmHandle {
        VmmHandle::new(self.events_tx.clone())
    }

    /// The balloon's handle (target, `actual`, statistics; usable from any thread) and how
    /// the device was created, if the VM has a balloon.
    pub fn balloon(
        &self,
    ) -> Option<(
        densevm_virtio::balloon::BalloonHandle,
        densevm_virtio::balloon::BalloonConfig,
    )> {
        self.balloon.as_ref().map(|b| (b.handle.clone(), b.config))
    }

    /// The memory tier's handle (budget, counters), if the VM runs with
    /// `--memory-budget`.
    pub fn tier(&self) -> Option<crate::tiering::TierHandle> {
        crate::balloon::lock_ram(&self.ram)
            .tier
            .is_some()
            .then(|| crate::tiering::TierHandle::new(self.ram.clone()))
    }

    /// Guest RAM in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    fn spawn_vcpus(&mut self) -> Result<Vec<JoinHandle<()>>, VmmError> {
        let mut threads = Vec::new();
        let mut prestarted = std::mem::take(&mut self.vcpu_threads).into_iter();
        for vcpu in self.vcpus.drain(..) {
            let (shared, tx) = (self.shared.clone(), EventSink(self.events_tx.clone()));
            let work: densevm_seccomp::Work = Box::new(move || vcpu.run(shared, tx));
            let work = match prestarted.next() {
                Some(thread) => match thread.run(work) {
                    Ok(handle) => {
                        threads.push(handle);
                        continue;
                    }
                    Err(work) => work,
                },
                None => work,
            };
            let handle = std::thread::Builder::new()
                .name("vcpu".into())
                .spawn(move || {
                    densevm_seccomp::enter(densevm_seccomp::ThreadKind::Vcpu);
                    work()
                })
                .map_err(|source| VmmError::Host {
                    what: "spawning a vCPU thread",
                    source,
                })?;
            threads.push(handle);
        }
        Ok(threads)
    }

    /// Runs the VM until it ends, then stops every vCPU and device.
    pub fn run(mut self) -> Result<RunOutcome, VmmError> {
        let threads = self.spawn_vcpus()?;
        // The control thread filters itself once the vCPUs (which filter themselves) run;
        // everything built before, it built unfiltered.
        densevm_seccomp::enter(densevm_seccomp::ThreadKind::Vmm);
        if self.notify_vmgenid {
            // The irqchip and LAPICs are restored: the GED's edge reaches the guest.
            if let Err(e) = crate::arch::vmgenid::notify_guest(self.vm.fd()) {
                tracing::warn!("cannot tell the guest its VM generation ID changed: {e}");
            }
        }
        if let Some(f) = self.on_running.take() {
            f();
        }
        let rx = self
            .events_rx
            .take()
            .ok_or_else(|| VmmError::Config("the VM's event loop already ran".into()))?;
        let deadline = self.timeout.map(|t| Instant::now() + t);
        // Half a second after start the code only start-up ran is dropped from the page
        // tables (crate::text_trim): an idle VM's USS is then the code it still runs.
        let mut trim_at = Some(Instant::now() + TEXT_TRIM_AFTER);
        let (mut halted, mut left) = (0, 0);
        let end = loop {
            let wait = deadline.map_or(Duration::from_secs(3600), |d| {
                d.saturating_duration_since(Instant::now())
            });
            if let Some(at) = trim_at {
                let now = Instant::now();
                if now >= at {
                    trim_at = None;
                    match crate::text_trim::trim_own_text() {
                        Ok(b) => {
                            tracing::debug!("dropped {} KiB of start-up code mappings", b >> 10)
                        }
                        Err(e) => tracing::debug!("cannot drop start-up code mappings: {e}"),
                    }
                    continue;
                }
            }
            let wait = trim_at.map_or(wait, |at| {
                wait.min(at.saturating_duration_since(Instant::now()))
            });
            let event = match rx.recv_timeout(wait) {
                Ok(LoopEvent::Vcpu(event)) => event,
                Ok(LoopEvent::Control(request)) => {
                    self.handle_control(request, &threads);
                    continue;
                }
                Err(RecvTimeoutError::Timeout) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    break VmEnd::TimedOut(self.timeout.unwrap_or_default());
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break VmEnd::AllHalted,
            };
            if let VcpuEvent::Halted(_) = event {
                halted += 1;
                if halted == self.cpus {
                    break VmEnd::AllHalted;
                }
                continue;
            }
            // Every vCPU thread says so when it leaves (even by a panic, see `Vcpu::run`):
            // when all have left unasked, nothing runs the guest any more.
            if let VcpuEvent::Stopped(_) = event {
                left += 1;
                if left == self.cpus {
                    break VmEnd::AllHalted;
                }
                continue;
            }
            if let Some(end) = self.handle_event(event, &threads) {
                break end;
            }
        };
        self.trace.mark("vm_end");
        let balloon = self.balloon.as_ref().map(VmBalloon::report);
        let tier = self.tier().and_then(|t| t.stats());
        let memory_report = if self.report_memory {
            memory_report(self.memory.regions()).ok()
        } else {
            None
        };

        self.shared.stop.store(true, Ordering::Release);
        stop_vcpu_threads(&rx, threads, left as usize);
        // Devices stop (workers joined, disks flushed) before guest memory goes away.
        drop(self.devices);
        drop(self.write_fault_hooks);
        Ok(RunOutcome {
            end,
            trace: self.trace,
            memory: memory_report,
            readonly_slots: self.readonly_slots.stats(self.shared.stale_exits()),
            balloon,
            tier,
        })
    }

    /// Acts on one vCPU event; returns how the VM ends if it does.
    fn handle_event(&mut self, event: VcpuEvent, threads: &[JoinHandle<()>]) -> Option<VmEnd> {
        match event {
            VcpuEvent::FirstEntry(0, at) => self.trace.mark_at("vcpu0_first_entry", at),
            VcpuEvent::FirstEntry(..) | VcpuEvent::Stopped(_) | VcpuEvent::Halted(_) => {}
            VcpuEvent::Request(_, GuestRequest::TraceMark(id), at) => {
                self.trace.mark_at(&mark_name(id), at)
            }
            VcpuEvent::Request(_, GuestRequest::Exit(code), _) => {
                return Some(VmEnd::GuestExit(code))
            }
            VcpuEvent::Request(_, GuestRequest::Reset, _) => return Some(VmEnd::Reset),
            VcpuEvent::Request(_, GuestRequest::PowerOff, _) => return Some(VmEnd::PowerOff),
            // Served on the vCPU thread (a nap), never sent.
            VcpuEvent::Request(_, GuestRequest::Sleep(_), _) => {}
            VcpuEvent::Request(vcpu, GuestRequest::GuestFault(vector), _) => {
                return Some(VmEnd::Failed {
                    vcpu,
                    failure: VcpuFailure::GuestException {
                        vector,
                        rip: 0,
                        cr2: 0,
                    },
                })
            }
            VcpuEvent::SystemEvent(_, kind) => {
                return Some(if kind == kvm_bindings::KVM_SYSTEM_EVENT_RESET {
                    VmEnd::Reset
                } else {
                    VmEnd::PowerOff
                });
            }
            VcpuEvent::Failed(vcpu, failure) => return Some(VmEnd::Failed { vcpu, failure }),
            VcpuEvent::StaleReadonlySlot(_) => {
                let kick_all = || {
                    for handle in threads.iter().filter(|h| !h.is_finished()) {
                        kick::kick(handle.as_pthread_t());
                    }
                };
                let refreshed =
                    self.readonly_slots
                        .refresh(&mut self.vm, &self.shared.pause, kick_all);
                if let Ok(more) = refreshed {
                    self.shared.rearm_stale_notice(more);
                }
                if !self.paused {
                    self.shared.pause.resume();
                }
                if let Err(e) = refreshed {
                    return Some(VmEnd::HostError(format!(
                        "re-registering the read-only memory slots of a --pmem region: {e}"
                    )));
                }
            }
        }
        None
    }
}

/// Stops the vCPU threads once `stop` is set, `left` of them having already said they
/// left: kicks the others out of `KVM_RUN` at once (`kick.rs`: a kick is never lost), then
/// waits for each to say it left (`VcpuEvent::Stopped`, sent as the thread leaves its
/// loop), kicking again every millisecond while some have not, and joins them. (It used
/// to kick one thread, sleep 1 ms, look again, then the next: a VM's end waited 1 ms per
/// vCPU where a thread takes ~0.1 ms to leave.) Other events that come meanwhile are
/// dropped: the VM has ended.
fn stop_vcpu_threads(rx: &Receiver<LoopEvent>, threads: Vec<JoinHandle<()>>, mut left: usize) {
    const KICK_AGAIN: Duration = Duration::from_millis(1);
    while left < threads.len() {
        for handle in threads.iter().filter(|h| !h.is_finished()) {
            kick::kick(handle.as_pthread_t());
        }
        let again = Instant::now() + KICK_AGAIN;
        while left < threads.len() {
            let wait = again.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(LoopEvent::Vcpu(VcpuEvent::Stopped(_))) => left += 1,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => break,
                // Every sender is gone, the vCPU threads' too: they have all left.
                Err(RecvTimeoutError::Disconnected) => left = threads.len(),
            }
        }
        if threads.iter().all(JoinHandle::is_finished) {
            break;
        }
    }
    for handle in threads {
        let _ = handle.join();
    }
}
