//! Write faults of host threads on read-only (lower-layer) file pages arrive as SIGSEGV.
//!
//! The handler does no work itself: it sends the faulting address through a pipe to the
//! region's fault-service thread and waits until the page has been copied up and remapped
//! writable, then returns so the instruction is retried. It first polls the completion word
//! for a while (`MapOptions::spin`), yielding the CPU (the service usually answers within that, and a
//! polling waiter needs no futex wake-up), then sleeps on a futex. Only async-signal-safe
//! calls (`write`, `sched_yield`, `clock_gettime`, `futex`, `sigaction`) are made in signal
//! context. Faults outside every region are
//! passed to the previous handler (Rust's stack-overflow handler, or the default action).

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{PmemError, Result};
use crate::trace::{mark, Step};

/// Maximum number of live regions per process.
pub const MAX_REGIONS: usize = 64;

struct Slot {
    base: AtomicU64,
    end: AtomicU64,
    fd: AtomicI32,
    /// How long the handler polls for completion before sleeping on the futex.
    poll_ns: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    base: AtomicU64::new(0),
    end: AtomicU64::new(0),
    fd: AtomicI32::new(-1),
    poll_ns: AtomicU64::new(0),
};
static SLOTS: [Slot; MAX_REGIONS] = [EMPTY; MAX_REGIONS];
static INSTALL: Mutex<bool> = Mutex::new(false);
/// The previous SIGSEGV action (written once, before our handler is installed).
static mut OLD_ACTION: Option<libc::sigaction> = None;

/// Request sent from the handler: faulting address and the futex word to complete.
#[repr(C)]
pub(crate) struct Request {
    pub addr: u64,
    pub done: u64,
}

/// Completion values of [`Request::done`]'s word.
pub(crate) const DONE_OK: u32 = 1;
/// The fault could not be served; the handler falls back to the previous action.
pub(crate) const DONE_FAILED: u32 = 2;
/// Still pending, and the handler sleeps on the futex (the completer must wake it).
const PENDING_SLEEPING: u32 = 3;

/// CLOCK_MONOTONIC in ns (vDSO; async-signal-safe).
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Registers `[base, base+len)` as served through pipe `fd`, the handler polling for
/// completion for `poll` before sleeping; returns the slot number.
pub(crate) fn register(base: u64, len: u64, fd: i32, poll: std::time::Duration) -> Result<usize> {
    install()?;
    for (i, s) in SLOTS.iter().enumerate() {
        if s.fd
            .compare_exchange(-1, -2, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            s.base.store(base, Ordering::Release);
            s.end.store(base + len, Ordering::Release);
            s.poll_ns.store(
                poll.as_nanos().min(u64::MAX as u128) as u64,
                Ordering::Release,
            );
            s.fd.store(fd, Ordering::Release);
            return Ok(i);
        }
    }
    Err(PmemError::TooManyRegions(MAX_REGIONS))
}

/// Forgets slot `i`.
pub(crate) fn unregister(i: usize) {
    let s = &SLOTS[i];
    s.end.store(0, Ordering::Release);
    s.base.store(0, Ordering::Release);
    s.fd.store(-1, Ordering::Release);
}

/// Completes a request: stores `value` into the waiter's futex word and wakes it if it
/// sleeps on the futex (a polling waiter sees the value without a wake-up).
///
/// # Safety
/// `done` must be the address sent by a handler that is still waiting on it.
pub(crate) unsafe fn complete(done: u64, value: u32) {
    // SAFETY: the waiting handler keeps the word alive on its stack until it sees a final
    // value; after the swap we only pass the address to FUTEX_WAKE (no access).
    let word = unsafe { &*(done as *const AtomicU32) };
    if word.swap(value, Ordering::AcqRel) != PENDING_SLEEPING {
        return;
    }
    // SAFETY: FUTEX_WAKE on a valid aligned u32 (at worst a word the handler has left,
    // which FUTEX_WAKE only uses as a key; a spuriously woken waiter re-checks its word).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            done as *const u32,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

fn install() -> Result<()> {
    let mut done = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if *done {
        return Ok(());
    }
    // SAFETY: zeroed sigaction is a valid "query" argument; we fill the fields we use.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = handler as *const () as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
    // SAFETY: sigemptyset on a sigset we own.
    unsafe { libc::sigemptyset(&mut new.sa_mask) };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: installing a handler with valid sigaction structures.
    if unsafe { libc::sigaction(libc::SIGSEGV, &new, &mut old) } != 0 {
        return Err(crate::error::sys("sigaction(SIGSEGV)", 0, 0));
    }
    // SAFETY: written once under the INSTALL lock, before any fault can reach our handler for
    // an address that is not ours (the handler reads it only on the fallback path).
    unsafe { OLD_ACTION = Some(old) };
    *done = true;
    Ok(())
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    mark(Step::HandlerEntered);
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as u64;
    for s in SLOTS.iter() {
        let fd = s.fd.load(Ordering::Acquire);
        if fd < 0 {
            continue;
        }
        if addr < s.base.load(Ordering::Acquire) || addr >= s.end.load(Ordering::Acquire) {
            continue;
        }
        let done = AtomicU32::new(0);
        let req = Request {
            addr,
            done: &done as *const AtomicU32 as u64,
        };
        // SAFETY: write(2) of a 16-byte plain struct (atomic for a pipe: < PIPE_BUF).
        let n = unsafe {
            libc::write(
                fd,
                (&req as *const Request).cast(),
                std::mem::size_of::<Request>(),
            )
        };
        if n != std::mem::size_of::<Request>() as isize {
            break;
        }
        let poll_ns = s.poll_ns.load(Ordering::Acquire);
        let started = now_ns();
        loop {
            let v = done.load(Ordering::Acquire);
            if v == DONE_OK {
                mark(Step::HandlerLeaving);
                return;
            }
            if v != 0 && v != PENDING_SLEEPING {
                break;
            }
            if v == 0 && now_ns().saturating_sub(started) < poll_ns {
                // SAFETY: sched_yield has no arguments and is async-signal-safe.
                unsafe { libc::sched_yield() };
                continue;
            }
            if v == 0
                && done
                    .compare_exchange(0, PENDING_SLEEPING, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                continue; // completed meanwhile
            }
            // SAFETY: FUTEX_WAIT on our own stack word, expecting "pending, sleeping".
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    &done as *const AtomicU32 as *const u32,
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    PENDING_SLEEPING,
                    std::ptr::null::<libc::timespec>(),
                );
            }
        }
        if done.load(Ordering::Acquire) == DONE_OK {
            return;
        }
        break;
    }
    fallback(sig, info, ctx);
}

fn fallback(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: OLD_ACTION was written before our handler was installed and never changes.
    let old = unsafe { *std::ptr::addr_of!(OLD_ACTION) };
    match old {
        Some(old)
            if old.sa_flags & libc::SA_SIGINFO != 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN =>
        {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this type.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(old.sa_sigaction) };
            f(sig, info, ctx);
        }
        _ => {
            // Restore the default action and return: the access faults again and the
            // process dies with SIGSEGV as it would without us.
            // SAFETY: zeroed sigaction with SIG_DFL is valid.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: sigaction is async-signal-safe.
            unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
        }
    }
}
