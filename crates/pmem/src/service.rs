//! The two background threads: the fault service (userfaultfd messages and SIGSEGV
//! requests) and the pre-allocation pool refill.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::fault::{Inner, PAGE};
use crate::segv::{self, Request, DONE_FAILED, DONE_OK};
use crate::trace::{mark, Step};
use crate::uffd::{Uffd, EVENT_PAGEFAULT, FLAG_WP, FLAG_WRITE};

/// A page of zeros, the source for read faults on placeholders.
#[repr(align(4096))]
struct ZeroPage([u8; PAGE as usize]);
static ZERO_PAGE: ZeroPage = ZeroPage([0; PAGE as usize]);

/// Runs the fault service until `stop` becomes readable. After serving something it keeps
/// polling (non-blocking reads, `sched_yield` in between) for `spin` before sleeping in
/// `poll` again. Yielding rather than spinning matters: the faulting thread is usually woken
/// on this CPU, and a spinning service thread would delay its retry by the whole window.
pub(crate) fn serve(inner: &Inner, uffd: &Uffd, requests: OwnedFd, stop: &OwnedFd, spin: Duration) {
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
        let mut spinning_since: Option<Instant> = None;
        loop {
            let Some(served) = serve_pending(inner, uffd, &requests) else {
                return;
            };
            if served > 0 {
                if spinning_since.is_some() {
                    inner
                        .counters
                        .spin_hits
                        .fetch_add(served, Ordering::Relaxed);
                }
                spinning_since = Some(Instant::now());
            }
            match spinning_since {
                Some(t) if t.elapsed() < spin => std::thread::yield_now(),
                _ => break,
            }
        }
    }
}

/// Serves every queued userfaultfd message and SIGSEGV request; returns how many, or `None`
/// if the userfaultfd failed (the service stops).
fn serve_pending(inner: &Inner, uffd: &Uffd, requests: &OwnedFd) -> Option<u64> {
    let mut served = 0;
    loop {
        match uffd.read_msg() {
            Ok(Some(msg)) if msg.event == EVENT_PAGEFAULT => {
                mark(Step::PickedUp);
                on_uffd_fault(inner, uffd, msg)
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                tracing::error!("pmem: reading userfaultfd failed: {e}");
                return None;
            }
        }
        served += 1;
    }
    while let Some(req) = read_request(requests) {
        mark(Step::PickedUp);
        inner.counters.segv_faults.fetch_add(1, Ordering::Relaxed);
        let value = match inner
            .offset_of(req.addr)
            .and_then(|o| inner.write_fault_segv(o))
        {
            Ok(_) => DONE_OK,
            Err(e) => {
                tracing::error!("pmem: write fault at {:#x} not served: {e}", req.addr);
                DONE_FAILED
            }
        };
        mark(Step::WakeSent);
        // SAFETY: `done` was sent by a handler that waits for exactly this completion.
        unsafe { segv::complete(req.done, value) };
        served += 1;
    }
    Some(served)
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
        mark(Step::WakeSent);
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

/// Keeps `pool` clusters pre-allocated at the end of the top file, the next of them
/// zero-filled and the next few staged (mapped and pre-faulted, see `staging`): runs at
/// start, then whenever enough allocations have happened, until the region is dropped.
pub(crate) fn refill(inner: &Inner, pool: u64) {
    let mut zeroed_to = inner.next_tail.load(Ordering::Relaxed);
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
        let tail = inner.next_tail.load(Ordering::Relaxed);
        let from = zeroed_to.max(tail);
        let ahead = (from - tail).min(ZERO_AHEAD);
        match zero_fill(inner, from, ZERO_AHEAD.min(pool) - ahead) {
            Ok(n) => zeroed_to = n,
            Err(e) => tracing::warn!("pmem: zero-filling the pool failed: {e}"),
        }
        if let Err(e) = stage(inner, zeroed_to) {
            tracing::warn!("pmem: staging pool clusters failed: {e}");
        }
        r = inner.refill.lock().unwrap_or_else(|p| p.into_inner());
        while !r.1 && r.0 < inner.refill_every() {
            r = inner
                .refill_cv
                .wait_timeout(r, Duration::from_secs(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Pool clusters kept zero-filled ahead of allocation.
const ZERO_AHEAD: u64 = 128;

/// The image's tail at open (first slot of the free run that ends the entry table and lies
/// beyond the file's end): where the first `Zeroed` allocation lands.
pub(crate) fn initial_tail(inner: &Inner) -> u64 {
    let c = inner.chain.read();
    let img = &c.images()[0];
    let len = img.storage().len().unwrap_or(0);
    let geo = img.geometry();
    let mut s = img.slot_count();
    while s > 0 && img.slot(s - 1).kind == pcow::EntryKind::Free && geo.data_offset(s - 1) >= len {
        s -= 1;
    }
    s
}

/// Stages free tail slots below `zeroed_to` (zero-filled, inside the file) from the predicted
/// tail on, up to the staging target, one mapping per run of file-contiguous slots.
fn stage(inner: &Inner, zeroed_to: u64) -> crate::Result<()> {
    let want = inner.staging.target().saturating_sub(inner.staging.len());
    if want == 0 {
        return Ok(());
    }
    let start = inner
        .next_tail
        .load(Ordering::Relaxed)
        .max(inner.staging.end());
    let end = (start + want).min(zeroed_to);
    let mut runs: Vec<(std::ops::Range<u64>, u64)> = Vec::new();
    {
        let c = inner.chain.read();
        let img = &c.images()[0];
        let geo = img.geometry();
        for slot in start..end {
            if img.slot(slot).kind != pcow::EntryKind::Free {
                continue;
            }
            let off = geo.data_offset(slot);
            match runs.last_mut() {
                Some((r, first))
                    if r.end == slot && *first + (slot - r.start) * inner.cluster == off =>
                {
                    r.end = slot + 1;
                }
                _ => runs.push((slot..slot + 1, off)),
            }
        }
    }
    for (slots, file_offset) in runs {
        inner.staging.stage(slots, file_offset)?;
    }
    Ok(())
}

/// Writes zeros over the data clusters of up to `count` free slots from `from`, within the
/// preallocated file. A fallocated cluster is an unwritten extent: the first store to each
/// of its pages through the mapping then costs ~100 µs (extent conversion); a written one
/// costs a few µs. Runs under the fault lock, so no slot is allocated meanwhile, and only
/// touches free slots, whose data nobody reads. Returns the next slot to fill.
fn zero_fill(inner: &Inner, mut slot: u64, count: u64) -> crate::Result<u64> {
    let zeros = vec![0u8; inner.cluster as usize];
    let file_len = inner.chain.read().images()[0].storage().len()?;
    let end = slot + count;
    while slot < end {
        let _faults = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        let c = inner.chain.read();
        let img = &c.images()[0];
        let geo = img.geometry();
        // Two clusters per hold of the fault lock: a fault waits at most two `pwrite`s.
        for _ in 0..2 {
            if slot >= end || geo.data_offset(slot) + inner.cluster > file_len {
                return Ok(slot);
            }
            if img.slot(slot).kind == pcow::EntryKind::Free {
                crate::fault::pwrite_all(inner.fds[0], &zeros, geo.data_offset(slot))?;
            }
            slot += 1;
        }
    }
    Ok(slot)
}
