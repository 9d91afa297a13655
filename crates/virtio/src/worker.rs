//! A device's worker thread: waits on its queues' notification eventfds and runs the
//! device's handler, off the vCPU threads.

use std::io;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::Duration;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// Stack of a worker thread: request handling keeps its buffers on the heap.
pub const WORKER_STACK: usize = 256 << 10;

/// What a worker runs.
pub trait QueueHandler: Send + 'static {
    /// Queue `index` was notified by the driver. Also called once for every queue when the
    /// worker starts, for requests made available before activation finished.
    fn handle_queue(&mut self, index: usize);

    /// Timed work: called once the start-up calls are done and again after every wake-up
    /// (notifications handled, or the time it asked for passed). Runs whatever is due and
    /// returns how long the worker may wait for a notification before calling it again;
    /// `None` (the default: no timed work) waits for notifications only. No timer fd, no
    /// extra thread: the wait is `epoll_wait`'s timeout.
    fn tick(&mut self) -> Option<Duration> {
        None
    }

    /// A file descriptor of the device's own (a host socket, an epoll set of them) that the
    /// worker also waits on, level-triggered: [`handle_fd`](Self::handle_fd) runs whenever it
    /// is readable. Asked once when the worker starts; `None` (the default): queues only.
    fn extra_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// The [`extra_fd`](Self::extra_fd) is readable.
    fn handle_fd(&mut self) {}

    /// Other file descriptors the worker waits on besides the queues' eventfds (a tap),
    /// registered edge-triggered for input: when fd `i` of this list becomes readable (or
    /// fails) the worker calls `handle_queue(queues + i)`, where `queues` is the number of
    /// eventfds. The handler reads them itself, until `EAGAIN` (edge-triggered: a readiness
    /// it leaves unread is not reported again until new data arrives). Asked once per start.
    fn poll_fds(&self) -> Vec<std::os::fd::RawFd> {
        Vec::new()
    }
}

/// An `epoll_wait` timeout in milliseconds for `wait` (rounded up, so a deadline is never
/// reached early; -1 waits without one).
fn epoll_timeout(wait: Option<Duration>) -> i32 {
    wait.map_or(-1, |d| {
        i32::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
    })
}

/// A running worker; [`Worker::stop`] ends it and gives the handler back, [`Worker::park`]
/// ends it so that it can run again.
pub struct Worker<H: QueueHandler> {
    name: String,
    kill: EventFd,
    thread: Option<JoinHandle<(H, Vec<EventFd>)>>,
}

/// A worker stopped between two handler calls (see [`Worker::park`]): its handler and the
/// eventfds it waited on, ready to run again with [`Parked::resume`].
pub struct Parked<H: QueueHandler> {
    name: String,
    events: Vec<EventFd>,
    /// The handler as its last call left it (the device's queues and their positions).
    pub handler: H,
}

const KILL_TOKEN: u64 = u64::MAX;
const EXTRA_TOKEN: u64 = u64::MAX - 1;

impl<H: QueueHandler> Worker<H> {
    /// Starts thread `name` serving `handler` whenever one of `events` (queue `i`'s eventfd at
    /// index `i`) is signalled.
    pub fn spawn(name: &str, events: Vec<EventFd>, mut handler: H) -> io::Result<Self> {
        let kill = EventFd::new(libc::EFD_NONBLOCK)?;
        let epoll = Epoll::new()?;
        for (i, e) in events.iter().enumerate() {
            epoll.ctl(
                ControlOperation::Add,
                e.as_raw_fd(),
                EpollEvent::new(EventSet::IN, i as u64),
            )?;
        }
        epoll.ctl(
            ControlOperation::Add,
            kill.as_raw_fd(),
            EpollEvent::new(EventSet::IN, KILL_TOKEN),
        )?;
        if let Some(fd) = handler.extra_fd() {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, EXTRA_TOKEN),
            )?;
        }
        let extra = handler.poll_fds();
        for (i, fd) in extra.iter().enumerate() {
            epoll.ctl(
                ControlOperation::Add,
                *fd,
                EpollEvent::new(
                    EventSet::IN | EventSet::EDGE_TRIGGERED,
                    (events.len() + i) as u64,
                ),
            )?;
        }
        let thread_kill = kill.try_clone()?;
        let kind = densevm_seccomp::ThreadKind::virtio_worker(name);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .stack_size(WORKER_STACK)
            .spawn(move || {
                densevm_seccomp::enter(kind);
                for i in 0..events.len() {
                    handler.handle_queue(i);
                }
                let mut ready = vec![EpollEvent::default(); events.len() + extra.len() + 2];
                let mut wait = handler.tick();
                loop {
                    let n = match epoll.wait(epoll_timeout(wait), &mut ready) {
                        Ok(n) => n,
                        // A signal: nothing to handle, but the timed work may be due.
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                        Err(e) => {
                            tracing::error!("virtio worker: epoll_wait failed: {e}");
                            break;
                        }
                    };
                    for ev in &ready[..n] {
                        let token = ev.data();
                        if token == KILL_TOKEN {
                            let _ = thread_kill.read();
                            return (handler, events);
                        }
                        if token == EXTRA_TOKEN {
                            handler.handle_fd();
                            continue;
                        }
                        let index = token as usize;
                        // Clear the count first: a notification after this read runs the
                        // handler again. (Past the eventfds: a `poll_fds` descriptor.)
                        if let Some(e) = events.get(index) {
                            let _ = e.read();
                        }
                        handler.handle_queue(index);
                    }
                    wait = handler.tick();
                }
                (handler, events)
            })?;
        Ok(Self {
            name: name.into(),
            kill,
            thread: Some(thread),
        })
    }

    /// Stops the worker after the request it is serving and returns its handler.
    pub fn stop(self) -> Option<H> {
        self.park().map(|p| p.handler)
    }

    /// Stops the worker between two handler calls and joins its thread: the call in
    /// progress finishes first (a handler returns only after completing every chain it
    /// popped, with its interrupt raised). A notification not yet handled stays in its
    /// eventfd and in the available ring; the worker serves it when it resumes. `None` when
    /// the thread panicked.
    pub fn park(mut self) -> Option<Parked<H>> {
        let _ = self.kill.write(1);
        let (handler, events) = self.thread.take()?.join().ok()?;
        Some(Parked {
            name: std::mem::take(&mut self.name),
            events,
            handler,
        })
    }
}

impl<H: QueueHandler> Parked<H> {
    /// Starts the worker again with the same handler and eventfds; like a fresh worker it
    /// first handles every queue once, for requests made available while it was parked.
    pub fn resume(self) -> io::Result<Worker<H>> {
        Worker::spawn(&self.name, self.events, self.handler)
    }
}

impl<H: QueueHandler> Drop for Worker<H> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.kill.write(1);
            let _ = t.join();
        }
    }
}

/// A device's worker as the device holds it: none, running, or parked by a quiesce.
#[derive(Default)]
pub enum Service<H: QueueHandler> {
    /// Not activated (or reset since).
    #[default]
    Idle,
    /// Serving.
    Running(Worker<H>),
    /// Activated but stopped for a snapshot; [`Service::resume`] continues.
    Parked(Parked<H>),
}

/// The worker thread of a device ended by a panic: its queues are gone.
#[derive(Debug, Clone, Copy)]
pub struct WorkerLost;

impl<H: QueueHandler> Service<H> {
    /// Starts serving with a new worker (a running or parked one is stopped first).
    pub fn start(&mut self, name: &str, events: Vec<EventFd>, handler: H) -> io::Result<()> {
        self.stop();
        *self = Service::Running(Worker::spawn(name, events, handler)?);
        Ok(())
    }

    /// Stops serving (a reset): the worker is joined; returns its handler.
    pub fn stop(&mut self) -> Option<H> {
        match std::mem::take(self) {
            Service::Idle => None,
            Service::Running(w) => w.stop(),
            Service::Parked(p) => Some(p.handler),
        }
    }

    /// Parks a running worker (see [`Worker::park`]) and returns the parked handler, also
    /// when it was parked already; `None` when idle. When the thread had panicked the
    /// service is idle afterwards.
    pub fn quiesce(&mut self) -> Result<Option<&mut H>, WorkerLost> {
        match std::mem::take(self) {
            Service::Running(w) => *self = Service::Parked(w.park().ok_or(WorkerLost)?),
            other => *self = other,
        }
        Ok(match self {
            Service::Parked(p) => Some(&mut p.handler),
            _ => None,
        })
    }

    /// Runs a parked worker again; a running or idle service is left as it is. When the
    /// thread cannot be started the service is idle (the device no longer serves).
    pub fn resume(&mut self) -> io::Result<()> {
        match std::mem::take(self) {
            Service::Parked(p) => *self = Service::Running(p.resume()?),
            other => *self = other,
        }
        Ok(())
    }

    /// Whether the device is activated (running or parked).
    pub fn is_active(&self) -> bool {
        !matches!(self, Service::Idle)
    }

    /// The handler of a parked worker.
    pub fn parked(&self) -> Option<&H> {
        match self {
            Service::Parked(p) => Some(&p.handler),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Counts calls begun and finished; each call takes 30 ms.
    struct Slow {
        begun: Arc<AtomicU32>,
        done: u32,
    }
    impl QueueHandler for Slow {
        fn handle_queue(&mut self, _index: usize) {
            self.begun.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            self.done += 1;
        }
    }

    /// Counts ticks; asks to be called again every 5 ms.
    struct Ticking {
        ticks: Arc<AtomicU32>,
        calls: u32,
    }
    impl QueueHandler for Ticking {
        fn handle_queue(&mut self, _index: usize) {
            self.calls += 1;
        }
        fn tick(&mut self) -> Option<Duration> {
            self.ticks.fetch_add(1, Ordering::SeqCst);
            Some(Duration::from_millis(5))
        }
    }

    /// Records the indexes it is called with; polls `fd` besides its eventfd.
    struct Polling {
        fd: std::os::fd::RawFd,
        calls: Arc<std::sync::Mutex<Vec<usize>>>,
    }
    impl QueueHandler for Polling {
        fn handle_queue(&mut self, index: usize) {
            self.calls.lock().unwrap().push(index);
        }
        fn poll_fds(&self) -> Vec<std::os::fd::RawFd> {
            vec![self.fd]
        }
    }

    #[test]
    fn poll_fds_are_handled_after_the_queues_once_per_readiness() {
        let event = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let other = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handler = Polling {
            fd: other.as_raw_fd(),
            calls: calls.clone(),
        };
        let w = Worker::spawn("test-poll", vec![event], handler).unwrap();
        let wait_for = |n: usize| {
            let t = Instant::now();
            while calls.lock().unwrap().len() < n && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        wait_for(1);
        // Edge-triggered and left unread: one call for the one write.
        other.write(1).unwrap();
        wait_for(2);
        std::thread::sleep(Duration::from_millis(30));
        other.write(1).unwrap();
        wait_for(3);
        std::thread::sleep(Duration::from_millis(30));
        drop(w.stop());
        assert_eq!(
            *calls.lock().unwrap(),
            vec![0, 1, 1],
            "start-up call, then index 1 per write"
        );
    }

    #[test]
    fn tick_runs_timed_work_without_notifications() {
        assert_eq!(epoll_timeout(None), -1);
        assert_eq!(
            epoll_timeout(Some(Duration::from_micros(1))),
            1,
            "rounded up"
        );
        assert_eq!(epoll_timeout(Some(Duration::from_secs(u64::MAX))), i32::MAX);
        let ticks = Arc::new(AtomicU32::new(0));
        let event = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let handler = Ticking {
            ticks: ticks.clone(),
            calls: 0,
        };
        let w = Worker::spawn("test-tick", vec![event], handler).unwrap();
        let t = Instant::now();
        while ticks.load(Ordering::SeqCst) < 4 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let h = w.stop().unwrap();
        assert!(
            ticks.load(Ordering::SeqCst) >= 4,
            "ticks without any notification"
        );
        assert_eq!(h.calls, 1, "only the start-up call");
    }

    #[test]
    fn quiesce_waits_for_the_call_in_progress_and_resume_serves_what_came_meanwhile() {
        let begun = Arc::new(AtomicU32::new(0));
        let event = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let notify = event.try_clone().unwrap();
        let mut s = Service::default();
        assert!(!s.is_active());
        assert!(s.quiesce().unwrap().is_none(), "idle: nothing to park");
        let handler = Slow {
            begun: begun.clone(),
            done: 0,
        };
        s.start("test-worker", vec![event], handler).unwrap();
        // The start-up call, then one for a notification; park while it runs.
        let t = Instant::now();
        while begun.load(Ordering::SeqCst) < 1 && t.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        notify.write(1).unwrap();
        while begun.load(Ordering::SeqCst) < 2 && t.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        let done = s.quiesce().unwrap().expect("parked").done;
        assert_eq!(done, begun.load(Ordering::SeqCst), "no call cut short");
        assert!(s.is_active() && s.parked().is_some());
        // Parked: a notification waits in its eventfd.
        notify.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(begun.load(Ordering::SeqCst), done);
        assert_eq!(
            s.quiesce().unwrap().map(|h| h.done),
            Some(done),
            "parks once"
        );
        s.resume().unwrap();
        s.resume().unwrap(); // running: nothing to do
        let t = Instant::now();
        while begun.load(Ordering::SeqCst) < done + 2 && t.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        let h = s.stop().expect("handler back");
        assert_eq!(
            h.done,
            done + 2,
            "the start-up call and the waiting notification"
        );
        assert!(!s.is_active());
    }
}
