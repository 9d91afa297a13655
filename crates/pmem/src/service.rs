//! The two background threads: the fault service (userfaultfd messages and SIGSEGV
//! requests) and the pre-allocation pool refill.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::fault::{Inner, PAGE};
use crate::segv::{self, Request, DONE_FAILED, DONE_OK};
use crate::uffd::{Uffd, EVENT_PAGEFAULT, FLAG_WP, FLAG_WRITE};

/// A page of zeros, the source for read faults on placeholders.
#[repr(align(4096))]
struct ZeroPage([u8; PAGE as usize]);
static ZERO_PAGE: ZeroPage = ZeroPage([0; PAGE as usize]);

/// Runs the fault service until `stop` becomes readable.
pub(crate) fn serve(inner: &Inner, uffd: &Uffd, requests: OwnedFd, stop: &OwnedFd) {
    let mut fds = [
        libc::pollfd {
            fd: uffd.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: requests.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: polling three descriptors we hold for the lifetime of the loop.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            tracing::error!("pmem: poll failed: {}", std::io::Error::last_os_error());
            return;
        }
        if fds[2].revents != 0 {
            return;
        }
        loop {
            match uffd.read_msg() {
                Ok(Some(msg)) if msg.event == EVENT_PAGEFAULT => on_uffd_fault(inner, uffd, msg),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("pmem: reading userfaultfd failed: {e}");
                    return;
                }
            }
        }
        while let Some(req) = read_request(&requests) {
            inner.counters.segv_faults.fetch_add(1, Ordering::Relaxed);
            let value = match inner.offset_of(req.addr).and_then(|o| inner.write_fault(o)) {
                Ok(()) => DONE_OK,
                Err(e) => {
                    tracing::error!("pmem: write fault at {:#x} not served: {e}", req.addr);
                    DONE_FAILED
                }
            };
            // SAFETY: `done` was sent by a handler that waits for exactly this completion.
            unsafe { segv::complete(req.done, value) };
        }
    }
}

fn read_request(fd: &OwnedFd) -> Option<Request> {
    let mut req = Request { addr: 0, done: 0 };
    // SAFETY: reading one plain 16-byte record (written atomically by the handler).
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut req as *mut Request).cast(),
            std::mem::size_of::<Request>(),
        )
    };
    (n == std::mem::size_of::<Request>() as isize).then_some(req)
}

fn on_uffd_fault(inner: &Inner, uffd: &Uffd, msg: crate::uffd::Msg) {
    let page = msg.address & !(PAGE - 1);
    let Ok(offset) = inner.offset_of(page) else {
        let _ = uffd.wake(page, PAGE);
        return;
    };
    if msg.flags & (FLAG_WRITE | FLAG_WP) != 0 {
        inner
            .counters
            .uffd_write_faults
            .fetch_add(1, Ordering::Relaxed);
        if let Err(e) = inner.write_fault(offset) {
            tracing::error!("pmem: write fault at offset {offset:#x} not served: {e}");
            inner.poison(page);
        }
        let cluster_start = inner.base + offset / inner.cluster * inner.cluster;
        let _ = uffd.wake(cluster_start, inner.cluster.min(inner.reserved));
        return;
    }
    // Read of a placeholder: a write-protected zero page, so the next write still faults.
    inner.counters.read_faults.fetch_add(1, Ordering::Relaxed);
    // SAFETY: ZERO_PAGE is a readable static page.
    if unsafe { uffd.copy_wp(ZERO_PAGE.0.as_ptr(), page, PAGE) }.is_err() {
        // EEXIST/ENOENT: another fault mapped the page meanwhile; let the thread retry.
        let _ = uffd.wake(page, PAGE);
    }
}

/// Keeps `pool` clusters pre-allocated at the end of the top file: runs at start, then
/// whenever enough allocations have happened, until the region is dropped.
pub(crate) fn refill(inner: &Inner, pool: u64) {
    let mut r = inner.refill.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if r.1 {
            return;
        }
        r.0 = 0;
        drop(r);
        if let Err(e) = inner.chain.preallocate(pool) {
            tracing::warn!("pmem: pre-allocation failed: {e}");
        }
        r = inner.refill.lock().unwrap_or_else(|p| p.into_inner());
        while !r.1 && r.0 < crate::REFILL_EVERY {
            r = inner
                .refill_cv
                .wait_timeout(r, Duration::from_secs(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
