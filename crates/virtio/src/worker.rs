//! A device's worker thread: waits on its queues' notification eventfds and runs the
//! device's handler, off the vCPU threads.

use std::io;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

/// Stack of a worker thread: request handling keeps its buffers on the heap.
pub const WORKER_STACK: usize = 256 << 10;

/// What a worker runs.
pub trait QueueHandler: Send + 'static {
    /// Queue `index` was notified by the driver. Also called once for every queue when the
    /// worker starts, for requests made available before activation finished.
    fn handle_queue(&mut self, index: usize);
}

/// A running worker; [`Worker::stop`] ends it and gives the handler back.
pub struct Worker<H: QueueHandler> {
    kill: EventFd,
    thread: Option<JoinHandle<H>>,
}

const KILL_TOKEN: u64 = u64::MAX;

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
        let thread_kill = kill.try_clone()?;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .stack_size(WORKER_STACK)
            .spawn(move || {
                for i in 0..events.len() {
                    handler.handle_queue(i);
                }
                let mut ready = vec![EpollEvent::default(); events.len() + 1];
                loop {
                    let n = match epoll.wait(-1, &mut ready) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            tracing::error!("virtio worker: epoll_wait failed: {e}");
                            break;
                        }
                    };
                    for ev in &ready[..n] {
                        let token = ev.data();
                        if token == KILL_TOKEN {
                            let _ = thread_kill.read();
                            return handler;
                        }
                        let index = token as usize;
                        // Clear the count first: a notification after this read runs the
                        // handler again.
                        let _ = events[index].read();
                        handler.handle_queue(index);
                    }
                }
                handler
            })?;
        Ok(Self {
            kill,
            thread: Some(thread),
        })
    }

    /// Stops the worker after the request it is serving and returns its handler.
    pub fn stop(mut self) -> Option<H> {
        let _ = self.kill.write(1);
        self.thread.take()?.join().ok()
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
