//! Write faults of host threads on read-only (lower-layer) file pages arrive as SIGSEGV.
//!
//! By default the handler serves the fault itself, on the faulting thread
//! (`MapOptions::cow_on_faulting_thread`): it runs the region's write-fault path (copy the
//! 4 KiB up and map it writable) and returns, so the instruction is retried. This
//! saves the hand-over to the service thread and, above all, the TLB shoot-down IPI that
//! the service thread's `mmap` over the read-only page needs while the faulting thread keeps
//! its CPU polling (docs/benchmarks.md `## pmem`, the profile). The work needs more stack
//! than a thread's small alternate signal stack has, so when the handler runs on one it
//! moves to the interrupted thread's own stack, below the interrupted frame and its red
//! zone, for the duration of the call (x86-64 only; elsewhere, and when the interrupted
//! code itself ran on the alternate stack, the fault goes to the service thread). The
//! handler blocks every asynchronous signal while it runs (`sa_mask`): one delivered on the
//! alternate stack meanwhile would overwrite this handler's frame. Running the fault path in
//! signal context relies on what a synchronous fault on the region guarantees: the thread
//! was storing to the region, not inside `malloc` or holding one of the region's locks (the
//! fault paths never touch region memory under them). Errors are not handled here: the
//! fault then goes to the service thread, which retries it and logs why it failed.
//!
//! Otherwise (or as that fallback) the handler sends the faulting address through a pipe
//! to the region's fault-service thread and waits until the page has been copied up and
//! remapped writable. It first polls the completion word for a while
//! (`MapOptions::spin`), yielding the CPU, then sleeps on a futex. Faults outside every
//! region are passed to the previous handler (Rust's stack-overflow handler, or the default
//! action).

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{PmemError, Result};
use crate::fault::Inner;
use crate::trace::{mark, Step};

/// Maximum number of live regions per process.
pub const MAX_REGIONS: usize = 64;

struct Slot {
    base: AtomicU64,
    end: AtomicU64,
    fd: AtomicI32,
    /// How long the handler polls for completion before sleeping on the futex.
    poll_ns: AtomicU64,
    /// The region's fault state when the handler serves faults itself, else null.
    inner: AtomicPtr<Inner>,
    /// Handlers inside this slot right now ([`unregister`] waits for them to leave).
    active: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    base: AtomicU64::new(0),
    end: AtomicU64::new(0),
    fd: AtomicI32::new(-1),
    poll_ns: AtomicU64::new(0),
    inner: AtomicPtr::new(std::ptr::null_mut()),
    active: AtomicU32::new(0),
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
/// completion for `poll` before sleeping; with `inner`, the handler first tries to serve the
/// fault itself on the faulting thread. Returns the slot number.
///
/// `inner` must stay alive until [`unregister`] of the returned slot has returned.
pub(crate) fn register(
    base: u64,
    len: u64,
    fd: i32,
    poll: std::time::Duration,
    inner: Option<&Inner>,
) -> Result<usize> {
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
            s.inner.store(
                inner.map_or(std::ptr::null_mut(), |i| i as *const Inner as *mut Inner),
                Ordering::Release,
            );
            s.fd.store(fd, Ordering::SeqCst);
            return Ok(i);
        }
    }
    Err(PmemError::TooManyRegions(MAX_REGIONS))
}

/// Forgets slot `i`, waiting until no handler is inside it any more (a handler that is
/// waiting for the service thread needs that thread alive: call this before stopping it).
pub(crate) fn unregister(i: usize) {
    let s = &SLOTS[i];
    s.fd.store(-2, Ordering::SeqCst);
    while s.active.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    s.inner.store(std::ptr::null_mut(), Ordering::Release);
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
    // Block every asynchronous signal while the handler runs (they are delivered when it
    // returns): one delivered on the alternate stack while the fault is served on the
    // interrupted stack would overwrite this handler's frame there. Synchronous ones stay
    // deliverable (a fault inside the fault path reaches the previous handler), SIGSYS
    // included: a system call the thread's seccomp filter denies inside the fault path must
    // reach the SIGSYS handler, which names it; blocked, the kernel would kill the process
    // silently.
    // SAFETY: sigfillset/sigdelset on a sigset we own.
    unsafe {
        libc::sigfillset(&mut new.sa_mask);
        for sync in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut new.sa_mask, sync);
        }
    }
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
        if s.fd.load(Ordering::Acquire) < 0 {
            continue;
        }
        if addr < s.base.load(Ordering::Acquire) || addr >= s.end.load(Ordering::Acquire) {
            continue;
        }
        // Enter the slot, then check it is still registered (pairs with `unregister`, which
        // marks it gone, then waits for `active` to drop to zero).
        s.active.fetch_add(1, Ordering::SeqCst);
        let fd = s.fd.load(Ordering::SeqCst);
        let served = fd >= 0
            && (addr >= s.base.load(Ordering::Acquire) && addr < s.end.load(Ordering::Acquire))
            && (serve_here(s, addr, ctx) || request(s, fd, addr));
        s.active.fetch_sub(1, Ordering::SeqCst);
        if served {
            mark(Step::HandlerLeaving);
            return;
        }
        break;
    }
    fallback(sig, info, ctx);
}

/// Serves the fault on this thread if the slot allows it and there is stack room; true if
/// the page is now writable.
fn serve_here(s: &Slot, addr: u64, ctx: *mut libc::c_void) -> bool {
    let inner = s.inner.load(Ordering::Acquire);
    if inner.is_null() {
        return false;
    }
    // SAFETY: a non-null pointer stays valid while this handler is counted in `active`
    // (`register`'s contract and `unregister`'s wait).
    let inner = unsafe { &*inner };
    let mut ok = false;
    let mut job = || {
        mark(Step::PickedUp);
        ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            inner
                .offset_of(addr)
                .and_then(|o| inner.write_fault_segv(o))
                .is_ok()
        }))
        .unwrap_or(false);
        mark(Step::WakeSent);
    };
    run_with_stack(ctx, &mut job) && ok && {
        inner.counters.segv_faults.fetch_add(1, Ordering::Relaxed);
        inner
            .counters
            .segv_in_handler
            .fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// Runs `job` on a stack with room for the fault path: this one if the handler does not run
/// on the alternate signal stack, else the interrupted thread's stack. False (and `job` not
/// run) if neither is usable.
fn run_with_stack(ctx: *mut libc::c_void, job: &mut dyn FnMut()) -> bool {
    // SAFETY: sigaltstack only queries (null new stack) into a struct we own.
    let mut ss: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut ss) } != 0 {
        return false;
    }
    if ss.ss_flags & libc::SS_ONSTACK == 0 {
        job(); // the handler runs on the thread's own stack
        return true;
    }
    on_interrupted_stack(ctx, &ss, job)
}

#[cfg(target_arch = "x86_64")]
fn on_interrupted_stack(ctx: *mut libc::c_void, ss: &libc::stack_t, job: &mut dyn FnMut()) -> bool {
    /// Bytes left alone below the interrupted stack pointer: the x86-64 red zone (128)
    /// and some margin.
    const SKIP: u64 = 512;
    extern "C" fn trampoline(job: *mut libc::c_void) {
        // SAFETY: `job` is the `&mut &mut dyn FnMut()` passed in by the caller below, alive
        // for the whole call.
        let job = unsafe { &mut *(job as *mut &mut dyn FnMut()) };
        job();
    }
    // SAFETY: for SA_SIGINFO handlers the third argument is the interrupted context.
    let rsp =
        unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RSP as usize] }
            as u64;
    let (lo, hi) = (ss.ss_sp as u64, ss.ss_sp as u64 + ss.ss_size as u64);
    if (lo..hi).contains(&rsp) || rsp < SKIP + 4096 {
        return false; // the interrupted code ran on the alternate stack itself
    }
    let sp = (rsp - SKIP) & !15;
    let mut job = job;
    let arg = &mut job as *mut &mut dyn FnMut() as *mut libc::c_void;
    // SAFETY: switches to the interrupted thread's stack below its live frame and red zone
    // (memory that thread does not use until this handler returns), 16-byte aligned so the
    // call leaves it ABI-aligned, calls `trampoline(arg)` there and switches back. r12 is
    // callee-saved, so it holds the old stack pointer across the call; it is declared
    // clobbered so the compiler saves its own value, and `clobber_abi("C")` covers the rest.
    unsafe {
        std::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {sp}",
            "call {f}",
            "mov rsp, r12",
            sp = in(reg) sp,
            f = in(reg) trampoline as extern "C" fn(*mut libc::c_void),
            in("rdi") arg,
            out("r12") _,
            clobber_abi("C"),
        );
    }
    true
}

#[cfg(not(target_arch = "x86_64"))]
fn on_interrupted_stack(_: *mut libc::c_void, _: &libc::stack_t, _: &mut dyn FnMut()) -> bool {
    false
}

/// Sends the fault to the service thread through pipe `fd` and waits for its completion;
/// true if the page is now writable.
fn request(s: &Slot, fd: i32, addr: u64) -> bool {
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
        return false;
    }
    let poll_ns = s.poll_ns.load(Ordering::Acquire);
    let started = now_ns();
    loop {
        let v = done.load(Ordering::Acquire);
        if v == DONE_OK {
            return true;
        }
        if v != 0 && v != PENDING_SLEEPING {
            return false;
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
