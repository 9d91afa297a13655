//! Threads started ahead of their work, so that their filter is in place by the time the
//! work is ready.
//!
//! Installing a filter costs its thread 0.04–0.1 ms on this project's host (the kernel
//! converts, JIT-compiles and runs the program for every system call number; 0.2–0.75 ms
//! with seccompiler's linear programs), plus the kind's compile for the first thread of a
//! kind. A vCPU thread started when its vCPU is ready pays that between "VM ready" and the
//! guest's first instruction; started when the VM's build begins, it pays it beside the
//! build, on another CPU.

use crate::ThreadKind;
use std::io;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;

/// The work a prestarted thread runs.
pub type Work = Box<dyn FnOnce() + Send + 'static>;

/// A thread that has entered its kind (see [`crate::enter`]) and waits for its work.
/// Dropped unused, it ends without running anything.
pub struct Prestarted {
    work: SyncSender<Work>,
    thread: JoinHandle<()>,
}

impl Prestarted {
    /// Starts a thread named `name` that enters `kind` at once, then waits for its work.
    pub fn start(kind: ThreadKind, name: &str) -> io::Result<Self> {
        Self::start_after(kind, name, None)
    }

    /// As [`Prestarted::start`], the thread running `first` before it enters its kind:
    /// start-up work of the VMM's own, unfiltered like the control thread's build (never
    /// anything a guest can reach), done beside the build instead of on its path.
    pub fn start_after(kind: ThreadKind, name: &str, first: Option<Work>) -> io::Result<Self> {
        let (work, rx) = sync_channel::<Work>(1);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Some(first) = first {
                    first();
                }
                crate::enter(kind);
                if let Ok(work) = rx.recv() {
                    work();
                }
            })?;
        Ok(Prestarted { work, thread })
    }

    /// Hands the thread its work; returns its handle, or the work back if the thread has
    /// gone (then the caller runs it on a thread of its own).
    pub fn run(self, work: Work) -> Result<JoinHandle<()>, Work> {
        match self.work.send(work) {
            Ok(()) => Ok(self.thread),
            Err(e) => Err(e.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn runs_its_work_on_its_own_thread() {
        let ran = Arc::new(AtomicBool::new(false));
        let thread = Prestarted::start(ThreadKind::Vcpu, "prestarted").unwrap();
        let flag = ran.clone();
        let handle = thread
            .run(Box::new(move || {
                assert_eq!(std::thread::current().name(), Some("prestarted"));
                flag.store(true, Ordering::Release);
            }))
            .unwrap_or_else(|_| panic!("the prestarted thread was gone"));
        handle.join().unwrap();
        assert!(ran.load(Ordering::Acquire));
    }

    #[test]
    fn runs_first_before_its_work() {
        let (tx, rx) = std::sync::mpsc::channel();
        let tx2 = tx.clone();
        let first: Work = Box::new(move || tx.send("first").unwrap());
        let thread = Prestarted::start_after(ThreadKind::Vcpu, "first", Some(first)).unwrap();
        let handle = thread
            .run(Box::new(move || tx2.send("work").unwrap()))
            .unwrap_or_else(|_| panic!("the prestarted thread was gone"));
        handle.join().unwrap();
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["first", "work"]);
    }

    #[test]
    fn dropped_unused_it_ends() {
        let thread = Prestarted::start(ThreadKind::Vcpu, "unused").unwrap();
        let handle = {
            let Prestarted { work, thread } = thread;
            drop(work);
            thread
        };
        // Joins (rather than hanging): with its sender gone, the thread's wait ends.
        handle.join().unwrap();
    }
}
