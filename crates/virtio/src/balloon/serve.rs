//! The balloon's worker: serves the page queues as they are notified, holds the statistics
//! buffer and gives it back every polling interval (or on demand), so the guest refills it.
//! Its timer is the worker's `epoll_wait` timeout ([`QueueHandler::tick`]): no timer fd, no
//! thread of its own, no wake-up while polling is off.

use super::handle::{Counters, Shared};
use super::request::{serve_pages, serve_report, PageOp};
use super::{stats, BalloonMemory, QueueLayout};
use crate::queue::{self, RingError};
use crate::state::QueuePosition;
use crate::worker::QueueHandler;
use crate::{Interrupt, Mem};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_queue::{Queue, QueueOwnedT, QueueT};

/// What each of the worker's eventfds stands for (index = the worker's event index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Inflate,
    Deflate,
    Stats,
    Reporting,
    /// The handle's wake-up eventfd.
    Wake,
}

/// The worker's state: every queue the transport gave (for their positions), the layout the
/// driver's features imply, and the held statistics buffer.
pub(crate) struct Handler {
    mem: Mem,
    interrupt: Arc<dyn Interrupt>,
    memory: Arc<dyn BalloonMemory>,
    shared: Arc<Shared>,
    queues: Vec<Queue>,
    layout: QueueLayout,
    roles: Vec<Role>,
    /// The statistics chain the device holds (its head), to give back when it wants new
    /// values.
    stats_head: Option<u16>,
    /// When the held buffer goes back next, and the interval that was computed with.
    next_stats: Option<(Instant, u16)>,
    broken: bool,
}

impl Handler {
    /// A handler for `queues` (index = queue index; at least `layout.count()`, the used
    /// ones valid and ready).
    pub(crate) fn new(
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        memory: Arc<dyn BalloonMemory>,
        shared: Arc<Shared>,
        queues: Vec<Queue>,
        layout: QueueLayout,
    ) -> Self {
        let mut roles = vec![Role::Inflate, Role::Deflate];
        if layout.stats.is_some() {
            roles.push(Role::Stats);
        }
        if layout.reporting.is_some() {
            roles.push(Role::Reporting);
        }
        roles.push(Role::Wake);
        Self {
            mem,
            interrupt,
            memory,
            shared,
            queues,
            layout,
            roles,
            stats_head: None,
            next_stats: None,
            broken: false,
        }
    }

    /// Takes over the statistics buffer a snapshot says the device held; a head beyond the
    /// queue is dropped (the guest's stats then stop until it is reset: logged).
    pub(crate) fn restore_stats_head(&mut self, head: Option<u16>) {
        let Some(head) = head else { return };
        let size = self
            .layout
            .stats
            .and_then(|i| self.queues.get(i))
            .map(|q| q.size());
        match size {
            Some(size) if head < size => self.stats_head = Some(head),
            _ => tracing::warn!(
                "virtio-balloon: the snapshot's statistics buffer {head} does not fit the \
                 statistics queue; the guest's statistics will not be refreshed"
            ),
        }
    }

    /// Every queue's position (a quiesced device).
    pub(crate) fn positions(&self) -> Vec<QueuePosition> {
        self.queues
            .iter()
            .map(|q| QueuePosition {
                next_avail: q.next_avail(),
                next_used: q.next_used(),
            })
            .collect()
    }

    /// The statistics buffer the device holds.
    pub(crate) fn stats_head(&self) -> Option<u16> {
        self.stats_head
    }

    /// Whether a ring error stopped the device.
    #[cfg(test)]
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Serves a page queue (inflate, deflate or reporting) at `index`.
    fn serve_page_queue(&mut self, index: usize, role: Role) -> Result<usize, RingError> {
        let Self {
            mem,
            interrupt,
            memory,
            shared,
            queues,
            ..
        } = self;
        let counters = &shared.counters;
        let memory = &**memory;
        let q = &mut queues[index];
        queue::drain(q, index as u16, mem, &**interrupt, |chain| match role {
            Role::Inflate => serve_pages(chain, mem, memory, counters, PageOp::Inflate),
            Role::Deflate => serve_pages(chain, mem, memory, counters, PageOp::Deflate),
            _ => serve_report(chain, mem, memory, counters),
        })
    }

    /// Takes every statistics buffer the driver made available: parses it and holds it
    /// (one buffer at most: an older one goes back at once, used length 0).
    fn take_stats(&mut self, index: usize) -> Result<usize, RingError> {
        let mut taken = 0;
        loop {
            let q = &mut self.queues[index];
            q.disable_notification(&self.mem)?;
            while let Some(chain) = q.iter(&self.mem)?.next() {
                let head = chain.head_index();
                match stats::read_chain(chain, &self.mem) {
                    Ok(s) => self.shared.store_stats(s),
                    Err(e) => {
                        Counters::add(&self.shared.counters.stats_errors, 1);
                        tracing::debug!("virtio-balloon: statistics buffer refused: {e}");
                    }
                }
                taken += 1;
                if let Some(old) = self.stats_head.replace(head) {
                    queue::complete(q, index as u16, &self.mem, &*self.interrupt, old, 0)?;
                }
            }
            if !q.enable_notification(&self.mem)? {
                return Ok(taken);
            }
        }
    }

    /// Gives the held statistics buffer back, so the driver refills it.
    fn return_stats(&mut self) -> Result<usize, RingError> {
        let (Some(index), Some(head)) = (self.layout.stats, self.stats_head.take()) else {
            return Ok(0);
        };
        let q = &mut self.queues[index];
        queue::complete(q, index as u16, &self.mem, &*self.interrupt, head, 0).map(|()| 1)
    }

    fn check(&mut self, result: Result<usize, RingError>) {
        queue::check_ring(result, "virtio-balloon", &mut self.broken, &*self.interrupt);
    }
}

impl QueueHandler for Handler {
    fn handle_queue(&mut self, index: usize) {
        if self.broken {
            return;
        }
        let Some(&role) = self.roles.get(index) else {
            return;
        };
        let result = match role {
            Role::Inflate => self.serve_page_queue(QueueLayout::INFLATE, role),
            Role::Deflate => self.serve_page_queue(QueueLayout::DEFLATE, role),
            Role::Reporting => match self.layout.reporting {
                Some(i) => self.serve_page_queue(i, role),
                None => Ok(0),
            },
            Role::Stats => match self.layout.stats {
                Some(i) => self.take_stats(i),
                None => Ok(0),
            },
            // The handle asked for something: `tick` runs next and does it.
            Role::Wake => Ok(0),
        };
        self.check(result);
    }

    fn tick(&mut self) -> Option<Duration> {
        if self.broken || self.layout.stats.is_none() {
            return None;
        }
        if self.shared.take_stats_request() {
            let r = self.return_stats();
            self.check(r);
        }
        let interval = self.shared.stats_interval_s();
        if interval == 0 {
            self.next_stats = None;
            return None;
        }
        let now = Instant::now();
        let period = Duration::from_secs(u64::from(interval));
        let due = match self.next_stats {
            Some((due, i)) if i == interval => due,
            // First tick, or the interval changed: a full period from now.
            _ => now + period,
        };
        let due = if now >= due {
            let r = self.return_stats();
            self.check(r);
            now + period
        } else {
            due
        };
        self.next_stats = Some((due, interval));
        (!self.broken).then(|| due.saturating_duration_since(now))
    }
}
