//! Timestamps of the last fault's steps, for the latency breakdown in docs/benchmarks.md
//! (`cargo bench -p densevm-pmem --features fault-trace --bench pmem_bench -- profile`).
//!
//! With the `fault-trace` feature off (the default) every function here is an empty inline
//! function and [`now_ns`] returns 0, so the fault paths carry no cost. With it on, each step
//! stores a `CLOCK_MONOTONIC` timestamp into a process-wide slot: meaningful when one
//! thread faults at a time (the benchmark), where the last fault's steps are read back after
//! each store. Only atomics and `clock_gettime` (vDSO), so it is usable in signal context.

#[cfg(feature = "fault-trace")]
use std::sync::atomic::{AtomicU64, Ordering};

/// One step of a fault, in the order they happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The SIGSEGV handler was entered (host-thread CoW only).
    HandlerEntered,
    /// The serving thread picked the fault up (uffd message read, SIGSEGV request read, or
    /// the handler starting the work itself).
    PickedUp,
    /// `allocate` of the top-layer cluster returned.
    Allocated,
    /// The lower-layer data was read (CoW only).
    Read,
    /// The copy was written to the top file (CoW only).
    Written,
    /// The top-file page was mapped over the fault address.
    Mapped,
    /// The fault's work is done (after the optional pre-fault of the written page).
    WorkDone,
    /// The faulting thread is about to be told (`UFFDIO_WAKE`, or the completion stored).
    WakeSent,
    /// The SIGSEGV handler is about to return (host-thread CoW only).
    HandlerLeaving,
}

/// Number of [`Step`]s.
pub const STEPS: usize = 9;

#[cfg(feature = "fault-trace")]
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "fault-trace")]
static LAST: [AtomicU64; STEPS] = [ZERO; STEPS];

/// `CLOCK_MONOTONIC` in ns (0 without the `fault-trace` feature).
#[inline]
pub fn now_ns() -> u64 {
    #[cfg(feature = "fault-trace")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime fills a timespec we own (vDSO; async-signal-safe).
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
    #[cfg(not(feature = "fault-trace"))]
    0
}

/// Records that `step` of the current fault happened now.
#[inline]
pub fn mark(step: Step) {
    #[cfg(feature = "fault-trace")]
    LAST[step as usize].store(now_ns(), Ordering::Release);
    #[cfg(not(feature = "fault-trace"))]
    let _ = step;
}

/// Forgets the recorded steps (call before each traced fault).
pub fn reset() {
    #[cfg(feature = "fault-trace")]
    for s in &LAST {
        s.store(0, Ordering::Release);
    }
}

/// The timestamps of the last fault's steps (0 = not reached, or tracing compiled out).
pub fn last() -> [u64; STEPS] {
    #[allow(unused_mut)]
    let mut out = [0u64; STEPS];
    #[cfg(feature = "fault-trace")]
    for (o, s) in out.iter_mut().zip(&LAST) {
        *o = s.load(Ordering::Acquire);
    }
    out
}

/// Whether tracing is compiled in.
pub const ENABLED: bool = cfg!(feature = "fault-trace");
