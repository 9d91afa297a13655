//! Controlling a running VM from another thread (the API server): pause, resume, state,
//! snapshots and clone templates. Requests travel on the control loop's own channel, so
//! the loop serializes them with vCPU events; each carries a reply channel.

use crate::vstate::vcpu::VcpuEvent;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Sender, SyncSender};
use std::time::Duration;
use thiserror::Error;

/// What arrives on the control loop's channel.
pub enum LoopEvent {
    /// A vCPU thread's report.
    Vcpu(VcpuEvent),
    /// A control request.
    Control(ControlRequest),
}

/// Whether the guest runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// vCPUs run.
    Running,
    /// Every vCPU is parked outside `KVM_RUN`.
    Paused,
}

/// A frozen clone template: the state file plus the RAM file clones map `MAP_PRIVATE`
/// (handed to the [`TemplateHook`], which starts the clones).
#[derive(Debug)]
pub struct Template {
    /// The snapshot directory (holds `state`).
    pub dir: PathBuf,
    /// How long the VM was paused for it.
    pub paused_for: Duration,
}

/// What a finished snapshot took.
#[derive(Debug, Clone)]
pub struct SnapshotInfo {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// Bytes of guest memory written (zero pages are holes).
    pub memory_bytes: u64,
    /// How long the VM was paused for it.
    pub paused_for: Duration,
}

/// A control request could not be carried out.
#[derive(Debug, Error)]
pub enum ControlError {
    /// The request does not fit the VM's state (e.g. resume while running).
    #[error("{0}")]
    Conflict(String),
    /// The request is valid but the VM cannot do it.
    #[error("{0}")]
    Unsupported(String),
    /// Doing it failed.
    #[error("{0}")]
    Failed(String),
    /// The VM has ended (or its control loop is gone).
    #[error("the VM has ended; nothing to control")]
    Ended,
    /// No answer in time.
    #[error("the VM did not answer within {0:.0?}; it may be busy (a large snapshot?), try again")]
    Timeout(Duration),
}

type Reply<T> = SyncSender<Result<T, ControlError>>;

/// Work done while a template's VM is still paused with its devices quiesced, after its
/// state is written, given the frozen RAM file (e.g. move disks onto overlays, start the
/// clones). The VM's own RAM is moved off the file only after the hook, so that the clones
/// start meanwhile; nothing writes the file in between. An error fails the template.
pub type TemplateHook = Box<dyn FnOnce(BorrowedFd<'_>) -> Result<(), String> + Send>;

/// A control request with its reply channel.
pub enum ControlRequest {
    /// Park every vCPU.
    Pause(Reply<()>),
    /// Let them run again.
    Resume(Reply<()>),
    /// Report the run state.
    State(Reply<RunState>),
    /// Write a full snapshot (state + memory file) into a directory.
    Snapshot(PathBuf, Reply<SnapshotInfo>),
    /// Write the state into a directory and freeze the RAM file as a clone template; the
    /// hook runs before the devices and vCPUs go on (e.g. to move disks onto overlays).
    Template(PathBuf, TemplateHook, Reply<Template>),
}

/// A cloneable handle on a VM's control loop.
#[derive(Clone)]
pub struct VmmHandle {
    tx: Sender<LoopEvent>,
}

/// How long a request may take before the caller gives up (snapshots write memory).
const QUICK: Duration = Duration::from_secs(10);
const SLOW: Duration = Duration::from_secs(600);

impl VmmHandle {
    pub(crate) fn new(tx: Sender<LoopEvent>) -> Self {
        Self { tx }
    }

    fn call<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> ControlRequest,
        timeout: Duration,
    ) -> Result<T, ControlError> {
        let (reply, rx) = sync_channel(1);
        self.tx
            .send(LoopEvent::Control(make(reply)))
            .map_err(|_| ControlError::Ended)?;
        match rx.recv_timeout(timeout) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(ControlError::Timeout(timeout)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(ControlError::Ended),
        }
    }

    /// Pauses the VM (every vCPU parked outside `KVM_RUN`).
    pub fn pause(&self) -> Result<(), ControlError> {
        self.call(ControlRequest::Pause, QUICK)
    }

    /// Resumes a paused VM.
    pub fn resume(&self) -> Result<(), ControlError> {
        self.call(ControlRequest::Resume, QUICK)
    }

    /// Whether the VM runs or is paused.
    pub fn state(&self) -> Result<RunState, ControlError> {
        self.call(ControlRequest::State, QUICK)
    }

    /// Writes a full snapshot into `dir` (created; must not exist or be empty).
    pub fn snapshot(&self, dir: PathBuf) -> Result<SnapshotInfo, ControlError> {
        self.call(|r| ControlRequest::Snapshot(dir, r), SLOW)
    }

    /// Writes the state into `dir` and freezes the VM's RAM file as a clone template;
    /// `hook` runs before the VM goes on.
    pub fn template(&self, dir: PathBuf, hook: TemplateHook) -> Result<Template, ControlError> {
        self.call(|r| ControlRequest::Template(dir, hook, r), SLOW)
    }
}
