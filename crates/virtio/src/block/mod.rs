//! virtio-blk (virtio 1.2 §5.2): a disk backed by a raw file, a host block device or a pcow
//! image chain, served from one queue on the device's worker thread.
//!
//! - `mod.rs` — [`Block`]: opening the disk, features, configuration space, activation and
//!   reset;
//! - `request.rs` — one descriptor chain: parsing, checking and executing a request;
//! - `backend.rs` — the storage ([`backend::Backend`]: [`backend::RawFile`],
//!   [`backend::PcowDisk`]).
//!
//! Writes reach the backend before their request completes; they are durable once a FLUSH
//! request completes (raw: fdatasync; pcow: the chain's flush), or at once when the driver
//! did not negotiate `VIRTIO_BLK_F_FLUSH` (it then assumes a write-through disk). The backend
//! is flushed again on reset and when the device is dropped.

pub mod backend;
#[cfg(any(test, feature = "test-utils"))]
pub mod fuzz;
mod request;
mod state;
#[cfg(test)]
mod tests;

pub use request::{
    MAX_DWZ_SECTORS, MAX_DWZ_SEG, MAX_REQUEST_BYTES, SECTOR_SIZE, SEG_MAX, SIZE_MAX,
};
pub use state::BlockState;

use crate::queue::{self, RingError};
use crate::worker::{QueueHandler, Service};
use crate::{
    device_type, features, ActivateError, DeviceQueue, Interrupt, Mem, QueuePosition, StateError,
    VirtioDevice,
};
use backend::{Backend, PcowDisk, RawFile};
use request::DiskInfo;
use std::mem::offset_of;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use thiserror::Error;
use virtio_bindings::bindings::virtio_blk::{
    virtio_blk_config, VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
    VIRTIO_BLK_ID_BYTES,
};
use virtio_queue::Queue;

/// Entries in the device's one queue.
pub const QUEUE_SIZE: u16 = 256;

/// How the disk's file is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImageFormat {
    /// The file (or block device) is the disk, byte for byte.
    #[default]
    Raw,
    /// A pcow image, with its backing chain.
    Pcow,
}

/// What disk to serve and how.
#[derive(Clone, Debug)]
pub struct BlockConfig {
    /// Image file or host block device.
    pub path: PathBuf,
    /// The guest may only read (the file is opened read-only and `VIRTIO_BLK_F_RO` offered).
    pub readonly: bool,
    /// Raw or pcow.
    pub format: ImageFormat,
}

/// Why a disk could not be opened.
#[derive(Debug, Error)]
pub enum BlockError {
    /// No file at the path.
    #[error(
        "disk image {} does not exist: create it first (`truncate -s 1G FILE` for a raw disk, \
         `densevm image create FILE 1G` for a pcow image)",
        path.display()
    )]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// A directory was given as a disk.
    #[error(
        "{} is a directory, not a disk: give a disk image file or a block device \
         (to share a directory with the guest use 9p)",
        path.display()
    )]
    IsDirectory {
        /// The path given.
        path: PathBuf,
    },
    /// A FIFO, socket or character device was given as a disk.
    #[error(
        "{} is a {kind}, not a regular file or a block device: give a disk image file or a \
         block device",
        path.display()
    )]
    NotFileOrBlockDevice {
        /// The path given.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The disk is writable but its file cannot be written.
    #[error(
        "cannot open {} for writing ({source}): make it writable, or attach the disk \
         read-only (`--disk PATH,readonly`)",
        path.display()
    )]
    ReadOnlyFile {
        /// The path given.
        path: PathBuf,
        /// What open said.
        source: std::io::Error,
    },
    /// Any other failure to open or inspect the file.
    #[error("cannot open disk image {}: {source}", path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The pcow image (or one of its bases) cannot be opened.
    #[error(
        "cannot open pcow image {}: {source} (is it a pcow image? a plain disk file is format \
         raw; `densevm image check FILE` inspects a pcow image)",
        path.display()
    )]
    Pcow {
        /// The path given.
        path: PathBuf,
        /// What pcow said.
        source: pcow::PcowError,
    },
    /// A replacement storage does not have the disk's size.
    #[error("the new disk image holds {to} bytes, the disk has {from}: an overlay must keep its base's size")]
    Resize {
        /// The disk's size.
        from: u64,
        /// The replacement's size.
        to: u64,
    },
    /// Flushing the storage being replaced failed.
    #[error("cannot flush the disk before moving it to an overlay: {0}")]
    Flush(std::io::Error),
}

/// A virtio-blk device.
pub struct Block {
    backend: Arc<Mutex<Box<dyn Backend>>>,
    readonly: bool,
    serial: [u8; VIRTIO_BLK_ID_BYTES as usize],
    /// Disk size in sectors.
    capacity: u64,
    discard_granularity: u64,
    acked: u64,
    worker: Service<BlockWorker>,
    queue_sizes: [u16; 1],
}

fn open_error_is_readonly(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY)
    )
}

/// A handle on a disk device's storage, kept by whoever opened it: it can move the device
/// onto another image while the device is quiesced (a clone template freezes the image
/// and the VM goes on in a copy-on-write overlay over it).
#[derive(Clone)]
pub struct BackendHandle(Arc<Mutex<Box<dyn Backend>>>);

impl BackendHandle {
    /// Flushes the current storage and replaces it with `backend`, which must present the
    /// same size. Call only while the device is quiesced (no request in flight).
    pub fn replace(&self, backend: Box<dyn Backend>) -> Result<(), BlockError> {
        let mut current = lock(&self.0);
        if backend.size() != current.size() {
            return Err(BlockError::Resize {
                from: current.size(),
                to: backend.size(),
            });
        }
        current.flush().map_err(BlockError::Flush)?;
        *current = backend;
        Ok(())
    }
}

/// Opens a pcow image (its chain) as a disk backend.
pub fn open_pcow(path: &std::path::Path, writable: bool) -> Result<Box<dyn Backend>, BlockError> {
    let opts = pcow::OpenOptions {
        writable,
        ..Default::default()
    };
    pcow::Chain::open(path, opts)
        .map(|chain| Box::new(PcowDisk::new(chain)) as Box<dyn Backend>)
        .map_err(|source| BlockError::Pcow {
            path: path.to_path_buf(),
            source,
        })
}

impl Block {
    /// A handle on this device's storage (see [`BackendHandle`]).
    pub fn backend_handle(&self) -> BackendHandle {
        BackendHandle(self.backend.clone())
    }

    /// Opens the disk `cfg` describes.
    pub fn open(cfg: BlockConfig) -> Result<Block, BlockError> {
        let path = cfg.path;
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(BlockError::NotFound { path })
            }
            Err(source) => return Err(BlockError::Open { path, source }),
        };
        let ft = meta.file_type();
        if ft.is_dir() {
            return Err(BlockError::IsDirectory { path });
        }
        if !ft.is_file() && !ft.is_block_device() {
            let kind = if ft.is_fifo() {
                "FIFO"
            } else if ft.is_socket() {
                "socket"
            } else if ft.is_char_device() {
                "character device"
            } else {
                "special file"
            };
            return Err(BlockError::NotFileOrBlockDevice { path, kind });
        }
        let serial = serial_of(meta.dev(), meta.ino());
        let backend: Box<dyn Backend> = match cfg.format {
            ImageFormat::Raw => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(!cfg.readonly)
                    .open(&path);
                let file = match file {
                    Ok(f) => f,
                    Err(source) if !cfg.readonly && open_error_is_readonly(&source) => {
                        return Err(BlockError::ReadOnlyFile { path, source })
                    }
                    Err(source) => return Err(BlockError::Open { path, source }),
                };
                match RawFile::new(file) {
                    Ok(raw) => Box::new(raw),
                    Err(source) => return Err(BlockError::Open { path, source }),
                }
            }
            ImageFormat::Pcow => {
                let opts = pcow::OpenOptions {
                    writable: !cfg.readonly,
                    ..Default::default()
                };
                match pcow::Chain::open(&path, opts) {
                    Ok(chain) => Box::new(PcowDisk::new(chain)),
                    Err(pcow::PcowError::Io {
                        op: "open", source, ..
                    }) if !cfg.readonly && open_error_is_readonly(&source) => {
                        return Err(BlockError::ReadOnlyFile { path, source })
                    }
                    Err(source) => return Err(BlockError::Pcow { path, source }),
                }
            }
        };
        Ok(Self::from_backend(backend, cfg.readonly, serial))
    }

    /// A device serving `backend` (what [`open`](Block::open) builds; tests and the fuzz
    /// target bring their own). `serial` is the GET_ID answer.
    pub fn from_backend(
        backend: Box<dyn Backend>,
        readonly: bool,
        serial: [u8; VIRTIO_BLK_ID_BYTES as usize],
    ) -> Block {
        let capacity = backend.size() / SECTOR_SIZE;
        let discard_granularity = backend.discard_granularity().max(SECTOR_SIZE);
        Block {
            backend: Arc::new(Mutex::new(backend)),
            readonly,
            serial,
            capacity,
            discard_granularity,
            acked: 0,
            worker: Service::Idle,
            queue_sizes: [QUEUE_SIZE],
        }
    }

    /// Disk size in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The GET_ID answer (zero padded).
    pub fn serial(&self) -> [u8; VIRTIO_BLK_ID_BYTES as usize] {
        self.serial
    }

    fn disk_info(&self) -> DiskInfo {
        DiskInfo {
            readonly: self.readonly,
            write_through: self.acked & (1 << VIRTIO_BLK_F_FLUSH) == 0,
            serial: self.serial,
            capacity: self.capacity,
        }
    }

    /// Serves every request available on `queue` on the calling thread, as the worker does
    /// after a notification (queue index 0). For tests and the fuzz target: the device must
    /// not be active at the same time.
    pub fn process_queue(
        &self,
        mem: &Mem,
        queue: &mut Queue,
        interrupt: &dyn Interrupt,
    ) -> Result<usize, RingError> {
        let disk = self.disk_info();
        let mut backend = lock(&self.backend);
        queue::drain(queue, 0, mem, interrupt, |chain| {
            request::serve(&mut **backend, &disk, mem, chain)
        })
    }

    /// Stops the worker and makes everything written durable.
    fn stop_and_flush(&mut self) {
        self.worker.stop();
        if let Err(e) = self.flush() {
            tracing::error!("virtio-blk: flushing the disk failed: {e}");
        }
    }

    fn flush(&self) -> std::io::Result<()> {
        if self.readonly {
            return Ok(());
        }
        lock(&self.backend).flush()
    }

    /// The configuration space (virtio 1.2 §5.2.4), little-endian, up to
    /// `write_zeroes_may_unmap` and its padding.
    fn config(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        let mut put = |at: usize, bytes: &[u8]| c[at..at + bytes.len()].copy_from_slice(bytes);
        let sectors = |bytes: u64| u32::try_from(bytes / SECTOR_SIZE).unwrap_or(u32::MAX);
        put(
            offset_of!(virtio_blk_config, capacity),
            &self.capacity.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, size_max),
            &SIZE_MAX.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, seg_max),
            &SEG_MAX.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, blk_size),
            &(SECTOR_SIZE as u32).to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, num_queues),
            &1u16.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, max_discard_sectors),
            &MAX_DWZ_SECTORS.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, max_discard_seg),
            &MAX_DWZ_SEG.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, discard_sector_alignment),
            &sectors(self.discard_granularity).to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, max_write_zeroes_sectors),
            &MAX_DWZ_SECTORS.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, max_write_zeroes_seg),
            &MAX_DWZ_SEG.to_le_bytes(),
        );
        put(offset_of!(virtio_blk_config, write_zeroes_may_unmap), &[1]);
        c
    }
}

/// Bytes of configuration space the device defines: everything up to the secure-erase
/// fields (which need `VIRTIO_BLK_F_SECURE_ERASE`, not offered).
pub const CONFIG_LEN: usize = offset_of!(virtio_blk_config, max_secure_erase_sectors);

/// GET_ID: the hex device and inode numbers of the image file, `dev-ino`, keeping the last
/// 20 characters when longer (the inode's low digits tell files apart), zero padded.
fn serial_of(dev: u64, ino: u64) -> [u8; VIRTIO_BLK_ID_BYTES as usize] {
    let s = format!("{dev:x}-{ino:x}");
    let s = s.as_bytes();
    let s = &s[s.len().saturating_sub(VIRTIO_BLK_ID_BYTES as usize)..];
    let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
    id[..s.len()].copy_from_slice(s);
    id
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        device_type::BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        let mut f = features::COMMON
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_DISCARD
            | 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        if self.readonly {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features & self.features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::device::read_config_bytes(&self.config(), offset, data);
    }

    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError> {
        let dq = crate::device::single_queue(queues, &mem, self.acked)?;
        let queue = dq.queue;
        let handler = BlockWorker {
            mem,
            interrupt,
            queue,
            backend: self.backend.clone(),
            disk: self.disk_info(),
            broken: false,
        };
        self.worker.start("virtio-blk", vec![dq.event], handler)?;
        Ok(())
    }

    fn reset(&mut self) {
        self.stop_and_flush();
        self.acked = 0;
    }

    fn is_active(&self) -> bool {
        self.worker.is_active()
    }

    fn quiesce(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        self.quiesce_worker()
    }

    fn resume(&mut self) -> Result<(), StateError> {
        self.resume_worker()
    }

    fn save_state(&self) -> Result<serde_json::Value, StateError> {
        self.state()
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        self.apply_state(state)
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.stop_and_flush();
    }
}

/// The worker thread's side of an active device.
struct BlockWorker {
    mem: Mem,
    interrupt: Arc<dyn Interrupt>,
    queue: Queue,
    backend: Arc<Mutex<Box<dyn Backend>>>,
    disk: DiskInfo,
    /// The driver corrupted the ring: nothing is served until reset.
    broken: bool,
}

impl QueueHandler for BlockWorker {
    fn handle_queue(&mut self, index: usize) {
        if self.broken || index != 0 {
            return;
        }
        let Self {
            mem,
            interrupt,
            queue,
            backend,
            disk,
            broken,
        } = self;
        let mut backend = lock(backend);
        let served = queue::drain(queue, 0, mem, &**interrupt, |chain| {
            request::serve(&mut **backend, disk, mem, chain)
        });
        queue::check_ring(served, "virtio-blk", broken, &**interrupt);
    }
}
