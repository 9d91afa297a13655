//! Swap-file reads off the service thread.
//!
//! A page read back from the swap file waits for the disk: ~130 µs on the development
//! host's virtio disk, during which the one service thread would serve no other fault and
//! move no page. With readers, the service thread hands such a fault to a reader thread
//! (a [`Job`]) and goes on; the reader reads the page into a buffer of its own without the
//! state lock, then takes the lock, checks that the page is still the one it was sent for
//! and installs it (`UFFDIO_COPY`, which wakes every thread waiting on the page). Faults
//! of several threads (vCPUs, device workers) then wait for the disk side by side instead
//! of one behind the other.
//!
//! A page in flight keeps its swap slot until its reader is done, so nothing writes the
//! slot meanwhile. Whatever changes such a page's place first (a discard, a snapshot's
//! materialization, a prefetch that reads it) forgets it, which also cancels the job: the
//! reader then only wakes the waiters, whose access faults again and finds the page where
//! it now is. Each job has a number of its own, so a page cancelled and sent again is not
//! taken for the old job.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use densevm_uffd::Resolved;

use crate::store::AlignedPage;
use crate::table::Location;
use crate::{Counters, Shared, State, PAGE};

/// One page to read from the swap file and install.
pub(crate) struct Job {
    pub pg: usize,
    pub addr: u64,
    pub slot: u32,
    pub id: u64,
    pub file: Arc<File>,
}

/// The jobs waiting for a reader.
#[derive(Default)]
pub(crate) struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

impl Queue {
    pub fn push(&self, job: Job) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(job);
        self.ready.notify_one();
    }

    /// Wakes every reader (to stop).
    pub fn wake_all(&self) {
        let _guard = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        self.ready.notify_all();
    }

    /// The next job; `None` once the tier stops and the queue is empty.
    fn pop(&self, sh: &Shared) -> Option<Job> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(j) = jobs.pop_front() {
                return Some(j);
            }
            if sh.stop.load(Ordering::Relaxed) {
                return None;
            }
            jobs = self.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Sends page `pg`'s fault (at `addr`, its data in swap slot `slot`) to a reader.
pub(crate) fn send(sh: &Shared, st: &mut State, pg: usize, addr: u64, slot: u32, file: Arc<File>) {
    let id = st.next_job;
    st.next_job += 1;
    st.inflight.insert(pg, id);
    Counters::add(&sh.counters.swap_reads_behind, 1);
    sh.jobs.push(Job {
        pg,
        addr,
        slot,
        id,
        file,
    });
}

/// A reader thread's loop; `buf` is where its reads land.
pub(crate) fn run(sh: Arc<Shared>, mut buf: Box<AlignedPage>) {
    while let Some(job) = sh.jobs.pop(&sh) {
        // An aligned page at an aligned offset: a direct read when the descriptor has
        // O_DIRECT on (see `Swap`), a page-cache read otherwise; right either way.
        let read = job
            .file
            .read_exact_at(&mut buf.0, u64::from(job.slot) * PAGE);
        // The lock as the service thread takes it, not ahead of it as callers do: making
        // it step aside for every read cost more CPU than the wait it saved (2 faulting
        // threads: 3-5 µs more per operation, 1.6-2.3 µs this way).
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.inflight.get(&job.pg) != Some(&job.id) {
            // Cancelled: the page is elsewhere now; the waiters fault again and find it.
            drop(st);
            let _ = sh.uffd.wake(job.addr, PAGE);
            continue;
        }
        st.inflight.remove(&job.pg);
        debug_assert_eq!(st.table.get(job.pg), Location::Swap(job.slot));
        if let Err(e) = read {
            crate::service::fatal(
                &format!("reading page {} back (swap {})", job.pg, job.slot),
                e,
            );
        }
        // SAFETY: `buf` is a live buffer of one page.
        match unsafe { sh.uffd.copy(buf.0.as_ptr(), job.addr, PAGE, false, true) } {
            Ok(Resolved::Filled(_)) => {}
            // The file got the page some other way (it wins): wake the waiters.
            Ok(Resolved::Exists) => {
                let _ = sh.uffd.wake(job.addr, PAGE);
            }
            Err(e) => crate::service::fatal(&format!("copying a page back to {:#x}", job.addr), e),
        }
        st.table.set_in_file(job.pg, true);
        sh.forget(&mut st, job.pg);
    }
    // Callers read the running thread's CPU clock (`Tier::stats`); once it has ended, this.
    Counters::add(&sh.counters.service_cpu_ns, crate::service::thread_cpu_ns());
}
