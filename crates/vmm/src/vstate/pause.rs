//! Parking every vCPU thread outside `KVM_RUN` while the control thread changes VM state
//! that a running vCPU must not see half-done (re-registering memory slots).
//!
//! vCPU threads check [`PauseGate::requested`] before each `KVM_RUN` and [`park`] while it
//! is set; the control thread [`pause`]s (request, kick, wait until every running vCPU is
//! parked), does its work, and [`resume`]s. A vCPU thread that leaves its loop for good
//! calls [`leave`], so a pause never waits for it.
//!
//! [`park`]: PauseGate::park
//! [`pause`]: PauseGate::pause
//! [`resume`]: PauseGate::resume
//! [`leave`]: PauseGate::leave

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Counts {
    /// vCPU threads still in their run loop.
    running: u32,
    /// Of those, the ones parked right now.
    parked: u32,
}

/// The rendezvous between vCPU threads and the VM's control thread.
#[derive(Debug)]
pub struct PauseGate {
    requested: AtomicBool,
    counts: Mutex<Counts>,
    changed: Condvar,
}

/// How long a parked vCPU sleeps between checks of the stop flag.
const PARK_POLL: Duration = Duration::from_millis(20);

impl PauseGate {
    /// A gate for `running` vCPU threads (all of them, before any starts).
    pub fn new(running: u32) -> Self {
        Self {
            requested: AtomicBool::new(false),
            counts: Mutex::new(Counts { running, parked: 0 }),
            changed: Condvar::new(),
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// vCPU side: whether the thread must park before entering the guest again.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Asks the vCPUs to park without waiting for them (a vCPU may call this for itself
    /// before it tells the control thread why; the control thread then [`pause`]s or
    /// [`resume`]s).
    ///
    /// [`pause`]: PauseGate::pause
    /// [`resume`]: PauseGate::resume
    pub fn request(&self) {
        self.requested.store(true, Ordering::Release);
    }

    /// vCPU side: waits until the pause ends or `stop` is set, calling `work` (e.g. a
    /// posted [`super::capture::Capture`] job) whenever it wakes.
    pub fn park(&self, stop: &AtomicBool, mut work: impl FnMut()) {
        let mut c = self.counts();
        c.parked += 1;
        self.changed.notify_all();
        while self.requested() && !stop.load(Ordering::Acquire) {
            drop(c);
            work();
            c = self.counts();
            if !self.requested() || stop.load(Ordering::Acquire) {
                break;
            }
            c = self
                .changed
                .wait_timeout(c, PARK_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        c.parked -= 1;
        self.changed.notify_all();
    }

    /// vCPU side: idles up to `duration` outside the guest (the probe's sleep port),
    /// returning early once a pause is requested or `stop` is set.
    pub fn nap(&self, duration: Duration, stop: &AtomicBool) {
        let deadline = Instant::now() + duration;
        let mut c = self.counts();
        while !self.requested() && !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            c = self
                .changed
                .wait_timeout(c, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// vCPU side: the thread has left its run loop and will not enter the guest again.
    pub fn leave(&self) {
        let mut c = self.counts();
        c.running = c.running.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Control side: asks every vCPU to park and waits until all running ones have, calling
    /// `kick` (which must get threads out of `KVM_RUN`) until they do. Returns false if that
    /// takes longer than `timeout`. Either way the request stands until [`resume`].
    ///
    /// [`resume`]: PauseGate::resume
    pub fn pause(&self, kick: impl Fn(), timeout: Duration) -> bool {
        self.requested.store(true, Ordering::Release);
        // Wake vCPU threads napping outside the guest ([`nap`](Self::nap)).
        self.poke();
        let deadline = Instant::now() + timeout;
        let mut c = self.counts();
        while c.parked < c.running {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            drop(c);
            kick();
            c = self.counts();
            if c.parked < c.running {
                let wait = (deadline - now).min(Duration::from_millis(1));
                c = self
                    .changed
                    .wait_timeout(c, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        true
    }

    /// Control side: wakes the parked vCPUs so they look for posted work.
    pub fn poke(&self) {
        let _c = self.counts();
        self.changed.notify_all();
    }

    /// Control side: lets the parked vCPUs run again.
    pub fn resume(&self) {
        self.requested.store(false, Ordering::Release);
        let _c = self.counts();
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// Threads that count "guest entries" and park when asked: while paused, no thread
    /// enters; after resume they all continue; a thread that left is not waited for.
    #[test]
    fn pause_waits_for_every_running_thread_and_resume_releases_them() {
        let gate = Arc::new(PauseGate::new(3));
        let stop = Arc::new(AtomicBool::new(false));
        let entries = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for i in 0..3 {
            let (gate, stop, entries) = (gate.clone(), stop.clone(), entries.clone());
            threads.push(std::thread::spawn(move || {
                if i == 2 {
                    gate.leave();
                    return;
                }
                while !stop.load(Ordering::Acquire) {
                    if gate.requested() {
                        gate.park(&stop, || {});
                        continue;
                    }
                    entries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(200));
                }
                gate.leave();
            }));
        }
        for _ in 0..5 {
            assert!(gate.pause(|| {}, Duration::from_secs(5)), "pause timed out");
            let before = entries.load(Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(
                entries.load(Ordering::Relaxed),
                before,
                "a paused thread ran"
            );
            gate.resume();
            let resumed = entries.load(Ordering::Relaxed);
            let t0 = Instant::now();
            while entries.load(Ordering::Relaxed) == resumed {
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "threads did not resume"
                );
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::Release);
        for t in threads {
            t.join().unwrap();
        }
    }

    /// A thread that never parks (stuck outside the gate) makes the pause give up in time;
    /// resume lifts the request.
    #[test]
    fn pause_gives_up_after_its_timeout() {
        let gate = PauseGate::new(1);
        let t0 = Instant::now();
        assert!(!gate.pause(|| {}, Duration::from_millis(30)));
        assert!(t0.elapsed() >= Duration::from_millis(30));
        assert!(gate.requested());
        gate.resume();
        assert!(!gate.requested());
    }

    #[test]
    fn a_nap_ends_early_when_a_pause_is_requested() {
        let gate = Arc::new(PauseGate::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        // Undisturbed, a nap lasts its duration.
        let t0 = Instant::now();
        gate.nap(Duration::from_millis(20), &stop);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        let napper = {
            let (gate, stop) = (gate.clone(), stop.clone());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                gate.nap(Duration::from_secs(30), &stop);
                gate.park(&stop, || {});
                t0.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            gate.pause(|| {}, Duration::from_secs(5)),
            "the napping thread parked"
        );
        gate.resume();
        let napped = napper.join().unwrap();
        assert!(napped < Duration::from_secs(10), "napped {napped:?}");
    }
}
