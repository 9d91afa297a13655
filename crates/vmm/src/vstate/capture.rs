//! Running a job on every vCPU thread while the VM is paused (saving each vCPU's state
//! for a snapshot): only the thread that owns a vCPU's file descriptor touches it.
//!
//! The control thread [`post`]s a job and wakes the parked threads; each parked vCPU
//! thread [`service`]s it once, on its own vCPU, and stores the result; the control thread
//! [`wait`]s for all of them.
//!
//! [`post`]: Capture::post
//! [`service`]: Capture::service
//! [`wait`]: Capture::wait

use kvm_ioctls::VcpuFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A job run once on each vCPU thread: gets the vCPU index and its file descriptor.
pub type Job<T> = dyn Fn(u32, &mut VcpuFd) -> Result<T, String> + Send + Sync;

struct Inner<T> {
    job: Option<Arc<Job<T>>>,
    results: Vec<Option<Result<T, String>>>,
}

/// The per-VM job board.
pub struct Capture<T> {
    inner: Mutex<Inner<T>>,
    done: Condvar,
}

impl<T: Send> Capture<T> {
    /// A board for `vcpus` vCPU threads.
    pub fn new(vcpus: u32) -> Self {
        Self {
            inner: Mutex::new(Inner {
                job: None,
                results: (0..vcpus).map(|_| None).collect(),
            }),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Control side: posts `job` for every vCPU (replacing any unfinished one).
    pub fn post(&self, job: Arc<Job<T>>) {
        let mut inner = self.lock();
        inner.job = Some(job);
        inner.results.iter_mut().for_each(|r| *r = None);
    }

    /// Whether a job is posted (cheap enough for a vCPU's park loop).
    pub fn pending(&self) -> bool {
        self.lock().job.is_some()
    }

    /// vCPU side: runs the posted job on vCPU `id` if it has not run there yet.
    pub fn service(&self, id: u32, fd: &mut VcpuFd) {
        let job = {
            let inner = self.lock();
            match (&inner.job, inner.results.get(id as usize)) {
                (Some(job), Some(None)) => job.clone(),
                _ => return,
            }
        };
        let result = job(id, fd);
        let mut inner = self.lock();
        if let Some(slot) = inner.results.get_mut(id as usize) {
            *slot = Some(result);
        }
        self.done.notify_all();
    }

    /// Control side: waits until every vCPU ran the job (or `timeout` passes), then
    /// clears the board. Results come in vCPU order; the first failure is returned.
    pub fn wait(&self, timeout: Duration) -> Result<Vec<T>, String> {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            let mut failure = None;
            for (id, slot) in inner.results.iter_mut().enumerate() {
                if matches!(slot, Some(Err(_))) {
                    if let Some(Err(e)) = slot.take() {
                        failure = Some(format!("vCPU {id}: {e}"));
                    }
                    break;
                }
            }
            if let Some(failure) = failure {
                inner.job = None;
                return Err(failure);
            }
            if inner.results.iter().all(Option::is_some) {
                inner.job = None;
                return Ok(inner
                    .results
                    .iter_mut()
                    .filter_map(|r| r.take().and_then(Result::ok))
                    .collect());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = inner
                    .results
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.is_none())
                    .map(|(i, _)| i.to_string())
                    .collect();
                inner.job = None;
                return Err(format!(
                    "vCPU {} did not answer within {:.1} s (has it stopped?)",
                    missing.join(", "),
                    timeout.as_secs_f64()
                ));
            }
            inner = self
                .done
                .wait_timeout(inner, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
