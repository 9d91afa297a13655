//! Errors of the mapping service.

use thiserror::Error;

/// What went wrong while mapping a pcow chain or serving one of its faults.
#[derive(Debug, Error)]
pub enum PmemError {
    /// The pcow library failed (I/O on an image file, full image, read-only chain, ...).
    #[error("pcow image: {0}")]
    Pcow(#[from] pcow::PcowError),
    /// A system call on the mapping failed.
    #[error("{op} at {addr:#x} (+{len:#x}) failed: {source}")]
    Sys {
        /// The call (`mmap`, `userfaultfd register`, ...).
        op: &'static str,
        /// Host address it was applied to (0 if none).
        addr: u64,
        /// Length of the range.
        len: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// userfaultfd is unavailable (no /dev/userfaultfd access and the syscall is refused).
    #[error(
        "cannot open userfaultfd ({0}); run as root or give access to /dev/userfaultfd \
         (kernel faults from KVM need a descriptor without UFFD_USER_MODE_ONLY)"
    )]
    Userfaultfd(std::io::Error),
    /// The request does not fit the chain.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The address is not inside this region.
    #[error("address {addr:#x} is outside the mapped region {base:#x}+{size:#x}")]
    OutOfRegion {
        /// Faulting address.
        addr: u64,
        /// Region base.
        base: u64,
        /// Region size.
        size: u64,
    },
    /// Too many live regions in this process for the write-fault signal handler.
    #[error("too many pmem regions in one process (limit {0})")]
    TooManyRegions(usize),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, PmemError>;

pub(crate) fn sys(op: &'static str, addr: u64, len: u64) -> PmemError {
    PmemError::Sys {
        op,
        addr,
        len,
        source: std::io::Error::last_os_error(),
    }
}
