//! How the service thread waits for the next fault: a short poll, then a sleep.
//!
//! A fault served by a sleeping service thread costs two wake-ups: the fault's thread
//! wakes the service thread, which wakes the fault's thread when the page is in. Where the
//! two run on different CPUs, each is a cross-CPU wake-up of a CPU that went idle: an
//! inter-processor interrupt, and on a host that is itself a VM an exit to its hypervisor.
//! With one thread faulting on compressed pages at process level they cost more than the
//! tier's own work (docs/benchmarks.md, "One faulting thread, and one CPU").
//!
//! So after a turn that served faults the thread polls the userfaultfd for a while before
//! it sleeps; a fault that arrives meanwhile is read without a wake-up. How long it polls
//! adapts to how soon faults come, as the kernel's `haltpoll` idle governor does for a
//! guest's halts: the window grows when a fault ended a sleep soon after it began (a
//! longer poll would have caught it), shrinks when a sleep lasted past the longest window
//! (faults come too rarely to poll for), and is 0 (no poll) below a few microseconds. An
//! idle VM's tier never polls; one whose faults come further apart than [`POLL_MAX`] soon
//! stops. While polling the thread offers its CPU to any other thread that wants it every
//! [`YIELD_EVERY`].
//!
//! Polling needs a clock read from user space (the vDSO) and a second CPU: where reading
//! the clock is a system call (a guest whose clock source is the HPET) or the thread may
//! run on one CPU only, the tier does not poll. Where faults come further apart than
//! [`POLL_MAX`] it stops by itself: in the nested lab's L1 under TCG, a thread faulting back
//! to back had none of its 24,000 faults found by polling.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::Shared;

/// The longest poll after a served turn.
pub(crate) const POLL_MAX: Duration = Duration::from_micros(200);
/// The window a growing poll starts from.
const POLL_START: Duration = Duration::from_micros(25);
/// A shrinking window below this is 0.
const POLL_MIN: Duration = Duration::from_micros(8);
/// How often a poll yields its CPU (`sched_yield`: to other threads that want it, if any).
const YIELD_EVERY: Duration = Duration::from_micros(40);

/// The poll's state: its window and when the current idle period began.
#[derive(Debug)]
pub(crate) struct FaultPoll {
    enabled: bool,
    window: Duration,
    /// When the idle period after a served turn began (the poll, then the sleep).
    idle_since: Option<Instant>,
}

impl FaultPoll {
    /// A poll that is `enabled` (see [`worth_polling`]), its window at [`POLL_START`].
    pub(crate) fn new(enabled: bool) -> FaultPoll {
        FaultPoll {
            enabled,
            window: if enabled { POLL_START } else { Duration::ZERO },
            idle_since: None,
        }
    }

    /// After a turn that served faults, before the thread sleeps: polls with `fault_waiting`
    /// for up to the window; whether a fault arrived (the thread then need not sleep).
    pub(crate) fn poll(&mut self, fault_waiting: impl Fn() -> bool) -> bool {
        if !self.enabled {
            return false;
        }
        let start = Instant::now();
        self.idle_since = Some(start);
        if self.window.is_zero() {
            return false;
        }
        let mut next_yield = YIELD_EVERY;
        loop {
            if fault_waiting() {
                self.idle_since = None;
                return true;
            }
            let spent = start.elapsed();
            if spent >= self.window {
                return false;
            }
            if spent >= next_yield {
                next_yield += YIELD_EVERY;
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// After the sleep that followed a poll: `fault` says whether a fault ended it.
    pub(crate) fn slept(&mut self, fault: bool) {
        if let Some(since) = self.idle_since.take() {
            self.adapt(since.elapsed(), fault);
        }
    }

    /// The window after an idle period of `idle` (poll and sleep) that a fault ended, or
    /// not.
    fn adapt(&mut self, idle: Duration, fault: bool) {
        if fault && idle <= POLL_MAX {
            self.window = (self.window * 2).clamp(POLL_START, POLL_MAX);
        } else if idle > POLL_MAX {
            self.window /= 2;
            if self.window < POLL_MIN {
                self.window = Duration::ZERO;
            }
        }
    }
}

/// Sleeps until a fault message or a wake-up arrives, or `timeout` passes; whether a fault
/// message waits.
pub(crate) fn sleep(sh: &Shared, timeout: Duration) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: sh.uffd.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: sh.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: poll on two pollfds we own, for at most `timeout`.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis() as i32) };
    if fds[1].revents & libc::POLLIN != 0 {
        let mut v = [0u8; 8];
        // SAFETY: draining the eventfd counter into a local buffer.
        unsafe { libc::read(sh.wake.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
    }
    fds[0].revents & libc::POLLIN != 0
}

/// Whether polling can pay here: the service thread may run on more than one CPU and the
/// clock is read without a system call: a read through the vDSO takes less than half as
/// long as the same read by the system call (timed over a few of each; where the clock
/// source cannot be read from user space, such as the HPET, the vDSO makes the system
/// call too). A relative test, as a host under emulation (the nested lab's L1 under TCG)
/// is slower at both.
pub(crate) fn worth_polling() -> bool {
    // SAFETY: a cpu_set_t is a bitmask, for which all zeros is a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity fills the set we own, of the size we pass.
    let ok = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } == 0;
    // SAFETY: CPU_COUNT only reads the set we own.
    if !ok || unsafe { libc::CPU_COUNT(&set) } < 2 {
        return false;
    }
    // The fastest of three rounds of 32 reads each way: a round the thread was preempted
    // in does not decide.
    let fastest = |read: &dyn Fn()| {
        (0..3)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..32 {
                    read();
                }
                start.elapsed()
            })
            .min()
            .unwrap_or_default()
    };
    let vdso = fastest(&|| {
        std::hint::black_box(Instant::now());
    });
    let syscall = fastest(&|| {
        // SAFETY: a timespec is plain integers, for which all zeros is a valid value.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: clock_gettime by its system call, filling a timespec we own.
        unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_MONOTONIC, &mut ts) };
    });
    vdso * 2 < syscall
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_disabled_poll_never_polls() {
        let mut p = FaultPoll::new(false);
        assert!(!p.poll(|| panic!("polled")));
        p.slept(true);
        assert_eq!(p.window, Duration::ZERO);
    }

    #[test]
    fn faults_soon_after_a_sleep_grow_the_window_to_its_cap() {
        let mut p = FaultPoll::new(true);
        assert_eq!(p.window, POLL_START);
        p.adapt(60 * US, true);
        assert_eq!(p.window, 2 * POLL_START);
        for _ in 0..10 {
            p.adapt(150 * US, true);
        }
        assert_eq!(p.window, POLL_MAX);
    }

    #[test]
    fn long_sleeps_shrink_the_window_to_nothing_and_a_near_fault_restarts_it() {
        let mut p = FaultPoll::new(true);
        p.adapt(POLL_MAX + US, true);
        assert_eq!(p.window, POLL_START / 2);
        p.adapt(Duration::from_millis(100), false);
        assert_eq!(p.window, Duration::ZERO, "below the floor");
        // A timeout shorter than the cap is no evidence either way.
        p.adapt(50 * US, false);
        assert_eq!(p.window, Duration::ZERO);
        p.adapt(30 * US, true);
        assert_eq!(p.window, POLL_START);
    }

    #[test]
    fn a_poll_returns_when_a_fault_waits_and_gives_up_after_its_window() {
        let mut p = FaultPoll::new(true);
        let calls = std::cell::Cell::new(0);
        assert!(p.poll(|| {
            calls.set(calls.get() + 1);
            calls.get() == 3
        }));
        assert_eq!(calls.get(), 3);
        // A fault the poll read leaves nothing for `slept` to learn from.
        assert!(p.idle_since.is_none());
        p.slept(false);
        assert_eq!(p.window, POLL_START);

        let start = Instant::now();
        assert!(!p.poll(|| false));
        assert!(start.elapsed() >= POLL_START);
        // The sleep that follows is timed from the poll's start: one past the cap halves
        // the window.
        std::thread::sleep(POLL_MAX * 2);
        p.slept(true);
        assert_eq!(p.window, POLL_START / 2);
        assert!(p.idle_since.is_none());
    }

    #[test]
    fn with_no_window_the_idle_period_is_still_timed() {
        let mut p = FaultPoll::new(true);
        p.adapt(Duration::from_secs(1), false);
        p.adapt(Duration::from_secs(1), false);
        assert_eq!(p.window, Duration::ZERO);
        assert!(!p.poll(|| panic!("polled with no window")));
        assert!(p.idle_since.is_some(), "the idle period began");
        std::thread::sleep(POLL_MAX * 2);
        p.slept(true);
        assert_eq!(
            p.window,
            Duration::ZERO,
            "a fault after the cap is no reason to poll"
        );
    }
}
