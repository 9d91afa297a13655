//! virtio-vsock (device type 19) with its host side on unix sockets, compatible with
//! Firecracker's "hybrid vsock": see `muxer.rs` for the host protocol, `conn.rs` for a
//! connection's state and credit, `packet.rs` for the packet format and its checks.
//!
//! Three queues (rx 0, tx 1, event 2); the configuration space is the guest's CID (le64).
//! No feature bits beyond the common ones: stream sockets only (`SEQPACKET` packets are
//! answered with a reset). A driver reset or a snapshot restore drops every connection; a
//! restored device tells the guest with a transport-reset event (`VIRTIO_VSOCK_EVENT_
//! TRANSPORT_RESET`), after which Linux resets its sockets and reads the CID again.

pub mod conn;
#[cfg(any(test, feature = "test-utils"))]
pub mod fuzz;
pub mod muxer;
pub mod packet;

use crate::device::{ActivateError, DeviceQueue, VirtioDevice};
use crate::state::{decode, encode, QueuePosition, StateError};
use crate::worker::{QueueHandler, Service};
use crate::{device_type, features, Interrupt, Mem};
use muxer::Muxer;
use serde::{Deserialize, Serialize};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use virtio_queue::{Queue, QueueT};

/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;

/// The lowest CID a guest may have (0–2 are the hypervisor, local and host).
pub const MIN_GUEST_CID: u64 = 3;
/// The highest (`u32::MAX` is `VMADDR_CID_ANY`).
pub const MAX_GUEST_CID: u64 = u32::MAX as u64 - 1;

/// `--vsock cid=N,uds=PATH`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockConfig {
    /// The guest's context ID.
    pub guest_cid: u64,
    /// The unix socket host programs connect to; guest connections to port P reach
    /// `<uds>_P`.
    pub uds: PathBuf,
}

/// Why the device cannot be created.
#[derive(Debug, Error)]
pub enum VsockError {
    /// A CID outside 3..=2^32-2.
    #[error("guest CID {0} is not usable: give cid=N with 3 <= N < 4294967295 (0-2 are reserved)")]
    Cid(u64),
    /// Something that is not a stale socket is at the path.
    #[error(
        "{0} exists and is not a stale socket of an ended VM: remove it or choose another uds= path"
    )]
    PathExists(PathBuf),
    /// Another process serves the socket.
    #[error("{0} is in use by a running process (another VM?): choose another uds= path")]
    PathInUse(PathBuf),
    /// Binding failed.
    #[error("cannot create the vsock socket {path}: {source}; choose a uds= path in a writable directory")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What a snapshot holds of the device (connections are not saved: they are reset).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockState {
    /// Features the driver accepted.
    pub acked_features: u64,
    /// The guest's CID.
    pub guest_cid: u64,
}

/// The virtio-vsock device.
pub struct Vsock {
    cfg: VsockConfig,
    config_space: [u8; 8],
    listener: UnixListener,
    acked: u64,
    reset_event_on_activate: bool,
    worker: Service<Handler>,
}

/// Binds `path`, replacing a stale socket that nobody serves (left by a killed VM).
fn bind(path: &Path) -> Result<UnixListener, VsockError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(VsockError::PathExists(path.into()));
        }
        match UnixStream::connect(path) {
            Ok(_) => return Err(VsockError::PathInUse(path.into())),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                let _ = std::fs::remove_file(path);
            }
            Err(_) => return Err(VsockError::PathExists(path.into())),
        }
    }
    UnixListener::bind(path).map_err(|source| VsockError::Bind {
        path: path.into(),
        source,
    })
}

impl Vsock {
    /// Checks the CID and binds the socket (so that a bad option stops densevm before the
    /// guest runs). The socket file is removed when the device is dropped.
    pub fn open(cfg: VsockConfig) -> Result<Self, VsockError> {
        if !(MIN_GUEST_CID..=MAX_GUEST_CID).contains(&cfg.guest_cid) {
            return Err(VsockError::Cid(cfg.guest_cid));
        }
        let listener = bind(&cfg.uds)?;
        Ok(Vsock {
            config_space: cfg.guest_cid.to_le_bytes(),
            cfg,
            listener,
            acked: 0,
            reset_event_on_activate: false,
            worker: Service::default(),
        })
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &VsockConfig {
        &self.cfg
    }
}

impl Drop for Vsock {
    fn drop(&mut self) {
        drop(self.worker.stop());
        let _ = std::fs::remove_file(&self.cfg.uds);
    }
}

/// The worker's state.
struct Handler {
    rx: Queue,
    tx: Queue,
    event: Queue,
    mem: Mem,
    interrupt: Arc<dyn Interrupt>,
    muxer: Muxer,
    broken: bool,
}

impl Handler {
    fn check(&mut self, r: Result<usize, crate::queue::RingError>) {
        crate::queue::check_ring(r, "virtio-vsock", &mut self.broken, &*self.interrupt);
    }

    fn rx(&mut self) {
        if !self.broken {
            let r = self
                .muxer
                .process_rx(&mut self.rx, &self.mem, &*self.interrupt);
            self.check(r);
        }
    }
}

impl QueueHandler for Handler {
    fn handle_queue(&mut self, index: usize) {
        if self.broken {
            return;
        }
        match index as u16 {
            muxer::RX => {}
            muxer::TX => {
                let r = self
                    .muxer
                    .process_tx(&mut self.tx, &self.mem, &*self.interrupt);
                self.check(r);
            }
            _ => {
                let r = self
                    .muxer
                    .process_event(&mut self.event, &self.mem, &*self.interrupt)
                    .map(|()| 0);
                self.check(r);
            }
        }
        self.rx();
    }

    fn tick(&mut self) -> Option<Duration> {
        let next = self.muxer.expire(Instant::now());
        self.rx();
        next
    }

    fn extra_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.muxer.epoll_fd())
    }

    fn handle_fd(&mut self) {
        self.muxer.handle_host_events();
        self.rx();
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        device_type::VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn features(&self) -> u64 {
        features::COMMON
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features & self.features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::device::read_config_bytes(&self.config_space, offset, data);
    }

    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError> {
        self.reset();
        if queues.len() != 3 {
            return Err(ActivateError::QueueCount {
                want: 3,
                got: queues.len(),
            });
        }
        let event_idx = self.acked & features::RING_EVENT_IDX != 0;
        let mut qs = Vec::new();
        let mut events = Vec::new();
        for (i, mut dq) in queues.into_iter().enumerate() {
            if !dq.queue.is_valid(&mem) {
                return Err(ActivateError::InvalidQueue(i));
            }
            dq.queue.set_event_idx(event_idx);
            qs.push(dq.queue);
            events.push(dq.event);
        }
        let listener = self.listener.try_clone()?;
        let mut muxer = Muxer::new(listener, &self.cfg.uds, self.cfg.guest_cid)?;
        muxer.reset_event_pending = std::mem::take(&mut self.reset_event_on_activate);
        let mut qs = qs.into_iter();
        let (Some(rx), Some(tx), Some(event)) = (qs.next(), qs.next(), qs.next()) else {
            return Err(ActivateError::QueueCount { want: 3, got: 0 });
        };
        let handler = Handler {
            rx,
            tx,
            event,
            mem,
            interrupt,
            muxer,
            broken: false,
        };
        self.worker.start("virtio-vsock", events, handler)?;
        Ok(())
    }

    fn reset(&mut self) {
        // Dropping the muxer closes every host socket of a connection.
        drop(self.worker.stop());
    }

    fn is_active(&self) -> bool {
        self.worker.is_active()
    }

    fn quiesce(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        match self.worker.quiesce() {
            Ok(handler) => Ok(handler
                .map(|h| {
                    [&h.rx, &h.tx, &h.event]
                        .iter()
                        .map(|q| QueuePosition {
                            next_avail: q.next_avail(),
                            next_used: q.next_used(),
                        })
                        .collect()
                })
                .unwrap_or_default()),
            Err(_) => Err(StateError::worker_lost(device_type::VSOCK)),
        }
    }

    fn resume(&mut self) -> Result<(), StateError> {
        self.worker.resume().map_err(|source| StateError::Host {
            device: "virtio-vsock",
            op: "restart the worker thread",
            source,
        })
    }

    fn save_state(&self) -> Result<serde_json::Value, StateError> {
        encode(
            device_type::VSOCK,
            &VsockState {
                acked_features: self.acked,
                guest_cid: self.cfg.guest_cid,
            },
        )
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        let s: VsockState = decode(device_type::VSOCK, state)?;
        StateError::check_restore(
            device_type::VSOCK,
            self.is_active(),
            s.acked_features,
            self.features(),
        )?;
        if s.guest_cid != self.cfg.guest_cid {
            return Err(StateError::device_state(
                device_type::VSOCK,
                format!(
                    "the snapshot's guest has CID {}, this device {}: restore with the same \
                     --vsock cid",
                    s.guest_cid, self.cfg.guest_cid
                ),
            ));
        }
        self.acked = s.acked_features;
        // Connections of the snapshot's VM are gone: the guest must learn it.
        self.reset_event_on_activate = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
