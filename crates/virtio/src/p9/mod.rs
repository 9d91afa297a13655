//! virtio-9p: a host directory exported to the guest over the 9P2000.L server of
//! `densevm-9p`, the way Linux's `trans_virtio` speaks it.
//!
//! The device has one request queue. Each chain carries one T-message in its driver-readable
//! buffers; the R-message goes into its device-writable buffers and the chain's used length
//! is the R-message's size (0 means "no reply", which Linux treats as a cancelled request).
//!
//! Requests are served concurrently: the queue's worker thread ([`crate::worker::Worker`])
//! only pops chains and hands them to a small pool of threads (see `serve.rs`), so a slow
//! read does not hold up the stat storm behind it. `Tflush` is answered in the order the
//! driver relies on: the flushed request's chain is returned before the `Rflush`.
//!
//! Configuration space (`struct virtio_9p_config`): `le16 tag_len` followed by the mount tag
//! (not NUL-terminated). The guest mounts the share with
//! `mount -t 9p -o trans=virtio,version=9p2000.L TAG /mnt`.

mod serve;
mod state;

pub use densevm_9p::{Config as ServerConfig, IdMap, Session};
pub use serve::{process_queue, MAX_CHAIN_DESCRIPTORS};
pub use state::{P9State, QUIESCE_TIMEOUT};

use crate::device::{ActivateError, DeviceQueue, VirtioDevice};
use crate::worker::Service;
use crate::{device_type, features, Interrupt, Mem};
use densevm_9p::{Server, ServerError};
use serve::{Dispatcher, Pool};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// VIRTIO_9P_MOUNT_TAG: the configuration space holds a mount tag.
pub const MOUNT_TAG: u64 = 1 << 0;

/// Largest mount tag: its length is a le16 in the configuration space.
pub const MAX_TAG_LEN: usize = u16::MAX as usize;

/// Size of the request queue: Linux puts at most 128 scatter-gather entries in one request
/// and keeps few requests in flight, and every chain popped and not yet answered costs host
/// memory, so the ring is kept small.
pub const QUEUE_SIZE: u16 = 256;

/// One shared directory.
#[derive(Debug, Clone)]
pub struct ShareConfig {
    /// The host directory exported (the jail's root).
    pub root: PathBuf,
    /// The mount tag the guest names the share by (1 to [`MAX_TAG_LEN`] bytes, no NUL).
    pub tag: String,
    /// Server options: `readonly`, `uid_map`/`gid_map` (guest → host ids), `max_msize`,
    /// `max_fids`.
    pub server: ServerConfig,
}

impl ShareConfig {
    /// Exports `root` under `tag`, read-write, identity id maps, default msize.
    pub fn new(root: impl Into<PathBuf>, tag: impl Into<String>) -> Self {
        Self {
            root: root.into(),
            tag: tag.into(),
            server: ServerConfig::default(),
        }
    }
}

/// Why a share cannot be set up.
#[derive(Debug, Error)]
pub enum P9Error {
    /// The mount tag is empty.
    #[error("the 9p mount tag is empty")]
    EmptyTag,
    /// The mount tag does not fit its le16 length field.
    #[error("the 9p mount tag is {len} bytes long, more than the {MAX_TAG_LEN} bytes its le16 length field allows")]
    TagTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The mount tag contains a NUL byte (the guest would see a shorter tag).
    #[error("the 9p mount tag {0:?} contains a NUL byte")]
    TagNul(String),
    /// The export directory does not exist.
    #[error("9p share {0}: no such directory")]
    Missing(PathBuf),
    /// The export path is not a directory.
    #[error("9p share {0} is not a directory")]
    NotADirectory(PathBuf),
    /// The export path cannot be examined.
    #[error("9p share {path}: {source}")]
    Access {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The 9P server refused the export (directory not openable, msize out of range, no /proc).
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// The virtio-9p device.
pub struct P9 {
    server: Arc<Server>,
    tag: String,
    config: Vec<u8>,
    acked: u64,
    active: Option<Active>,
    /// A session rebuilt by `restore_state`, served from the next activation on.
    restored: Option<Session>,
    /// How long a quiesce waits for the requests in flight.
    quiesce_timeout: Duration,
    #[cfg(test)]
    hook: Option<serve::Hook>,
}

/// A serving device: the dispatcher thread (parked while quiesced) and the pool it feeds.
struct Active {
    dispatcher: Service<Dispatcher>,
    pool: Arc<Pool>,
}

impl P9 {
    /// Checks the tag and the directory and opens the export.
    pub fn new(cfg: ShareConfig) -> Result<Self, P9Error> {
        let ShareConfig { root, tag, server } = cfg;
        if tag.is_empty() {
            return Err(P9Error::EmptyTag);
        }
        if tag.len() > MAX_TAG_LEN {
            return Err(P9Error::TagTooLong { len: tag.len() });
        }
        if tag.as_bytes().contains(&0) {
            return Err(P9Error::TagNul(tag));
        }
        match std::fs::metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(P9Error::NotADirectory(root)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(P9Error::Missing(root))
            }
            Err(source) => return Err(P9Error::Access { path: root, source }),
        }
        let server = Server::new(&root, server)?;
        let mut config = Vec::with_capacity(2 + tag.len());
        config.extend_from_slice(&(tag.len() as u16).to_le_bytes());
        config.extend_from_slice(tag.as_bytes());
        Ok(Self {
            server,
            tag,
            config,
            acked: 0,
            active: None,
            restored: None,
            quiesce_timeout: QUIESCE_TIMEOUT,
            #[cfg(test)]
            hook: None,
        })
    }

    /// The mount tag.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The export options.
    pub fn server_config(&self) -> &ServerConfig {
        self.server.config()
    }

    /// A fresh 9P session on this export, for [`process_queue`] (the synchronous entry point;
    /// an activated device makes its own).
    pub fn session(&self) -> Session {
        self.server.session()
    }

    /// How long [`quiesce`](VirtioDevice::quiesce) waits for the requests in flight before
    /// it gives up (default [`QUIESCE_TIMEOUT`]).
    pub fn set_quiesce_timeout(&mut self, timeout: Duration) {
        self.quiesce_timeout = timeout;
    }

    /// Test hook: runs on a pool thread with each request's tag before it is served.
    #[cfg(test)]
    pub(crate) fn set_hook(&mut self, hook: serve::Hook) {
        self.hook = Some(hook);
    }
}

impl VirtioDevice for P9 {
    fn device_type(&self) -> u32 {
        device_type::P9
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        features::COMMON | MOUNT_TAG
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features & self.features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::device::read_config_bytes(&self.config, offset, data);
    }

    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError> {
        self.reset();
        let DeviceQueue { queue, event } = crate::device::single_queue(queues, &mem, self.acked)?;
        #[cfg(test)]
        let hook = self.hook.clone();
        #[cfg(not(test))]
        let hook = None;
        let session = self
            .restored
            .take()
            .unwrap_or_else(|| self.server.session());
        let pool = Arc::new(Pool::new(
            session,
            mem,
            interrupt,
            queue,
            event.try_clone()?,
            hook,
        ));
        let mut dispatcher = Service::default();
        dispatcher.start("virtio-9p", vec![event], Dispatcher::new(pool.clone()))?;
        self.active = Some(Active { dispatcher, pool });
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(Active {
            mut dispatcher,
            pool,
        }) = self.active.take()
        {
            // No new requests, then the requests in flight finish; the last reference to
            // the pool drops the session and with it every fid the guest held.
            drop(dispatcher.stop());
            pool.shutdown();
        }
    }

    fn is_active(&self) -> bool {
        self.active.is_some()
    }

    fn quiesce(&mut self) -> Result<Vec<crate::QueuePosition>, crate::StateError> {
        self.quiesce_device()
    }

    fn resume(&mut self) -> Result<(), crate::StateError> {
        self.resume_device()
    }

    fn save_state(&self) -> Result<serde_json::Value, crate::StateError> {
        self.state()
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), crate::StateError> {
        self.apply_state(state)
    }
}

impl Drop for P9 {
    fn drop(&mut self) {
        self.reset();
    }
}

#[cfg(test)]
mod tests;
