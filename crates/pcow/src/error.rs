//! Typed errors of the pcow library.

use std::path::PathBuf;

/// Result type of the pcow library.
pub type Result<T> = std::result::Result<T, PcowError>;

/// Everything that can go wrong while reading or modifying a pcow image.
#[derive(Debug, thiserror::Error)]
pub enum PcowError {
    /// An I/O call failed.
    #[error("I/O error on {path}: {op} at offset {offset}: {source}")]
    Io {
        /// File the operation was on.
        path: PathBuf,
        /// What was being done (read, write, flush, ...).
        op: &'static str,
        /// Byte offset of the operation.
        offset: u64,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Neither header slot is valid.
    #[error("header slot {slot} is invalid: {reason}")]
    BadHeader {
        /// Header slot index (0 or 1).
        slot: usize,
        /// Why it was rejected.
        reason: String,
    },
    /// The image uses a version or feature this build does not support.
    #[error("unsupported image: {0}")]
    Unsupported(String),
    /// Both slots of an entry are damaged.
    #[error("entry of physical slot {slot} (file offset {offset}) is corrupt: {reason}")]
    BadEntry {
        /// Physical slot number.
        slot: u64,
        /// File offset of the entry pair.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A snapshot record is damaged.
    #[error("snapshot record in physical slot {slot} is corrupt: {reason}")]
    BadSnapshotRecord {
        /// Physical slot holding the record.
        slot: u64,
        /// What is wrong.
        reason: String,
    },
    /// The metadata is inconsistent in a way that prevents safe use.
    #[error("inconsistent metadata in {path}: {reason} (run `densevm image check --repair`)")]
    Inconsistent {
        /// Image file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The backing chain cannot be opened as recorded.
    #[error("backing chain of {path}: {reason}")]
    Backing {
        /// Image whose backing file is the problem.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A caller-supplied value is invalid.
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    /// A request falls outside the virtual size.
    #[error("range {offset}+{len} is outside the virtual size {size}")]
    OutOfRange {
        /// Start of the request.
        offset: u64,
        /// Length of the request.
        len: u64,
        /// Virtual size of the image.
        size: u64,
    },
    /// No snapshot with that name.
    #[error("no snapshot named {0:?}")]
    NoSuchSnapshot(String),
    /// A snapshot with that name already exists.
    #[error("a snapshot named {0:?} already exists")]
    SnapshotExists(String),
    /// The image was opened read-only.
    #[error("image {0} is open read-only")]
    ReadOnly(PathBuf),
    /// The image is full (too many physical slots).
    #[error("image {0} has no room for more clusters")]
    Full(PathBuf),
}
