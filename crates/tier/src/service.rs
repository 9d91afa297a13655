//! The tier's service thread: serves userfaultfd faults on the areas, moves the coldest
//! pages out while the tier is over its budget (the clock hand) and arms pages ahead of
//! need. One thread does all three under the state lock, one short step at a time, so a
//! page is never served and evicted at once.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use densevm_uffd::{Msg, Resolved, EVENT_PAGEFAULT, FLAG_MINOR};

use crate::poll::{self, FaultPoll};
use crate::store::{Compressed, Swap};
use crate::table::Location;
use crate::{punch, reader, Counters, Shared, State, PAGE};

/// Pages moved out per step (the lock is held for one step; faults wait that long).
const EVICT_BATCH: usize = 128;
/// Pages the hand looks at per step.
const SCAN_LIMIT: usize = 2048;
/// Pages armed per tick ahead of need (above 7/8 of the budget).
const ARM_AHEAD: usize = 512;
/// The hand arms pages until this many are armed at once (or 1/64 of the budget, if more),
/// ahead of need and while evicting: enough known-cold pages for the next evictions.
/// Arming beyond it only re-arms hot pages turn after turn, each a minor fault (the nested
/// lab's Redis guest at 0.95 of its working set took 22,500 in 50 s for 124 evictions).
const ARM_POOL: usize = 4 * EVICT_BATCH;
/// Most pages the hand keeps armed while the excess of a budget cut leaves (128 MiB: the
/// last of them leave hundreds of steps after they were armed; the armed queue then holds
/// at most some 256 KiB).
const DRAIN_POOL: usize = 32768;
/// Idle wake-up period.
const TICK: Duration = Duration::from_millis(100);
/// Longest the thread sleeps while nothing happens: its wake-up period doubles from
/// [`TICK`] with each quiet turn (no fault, nothing to evict or arm) up to this, so an
/// idle VM's tier wakes about once in 3 s instead of ten times a second.
const IDLE_TICK_MAX: Duration = Duration::from_millis(3200);
/// Longest the service thread stands aside for a caller waiting for the state.
const HANDOFF: Duration = Duration::from_millis(10);
/// Fault messages read from the userfaultfd at once.
const MSG_BATCH: usize = 16;
/// Largest sequential prefetch, in pages.
const MAX_WINDOW: usize = 16;
/// Most compressed pages demoted to the swap file per step: more than an eviction step
/// adds, so the store comes back under its share.
const DEMOTE_BATCH: usize = 2 * EVICT_BATCH;

pub(crate) fn run(sh: Arc<Shared>, mut poll: FaultPoll) {
    let now = coarse_now();
    let mut svc = Service {
        page: vec![0u8; PAGE as usize],
        buf: vec![0u8; EVICT_BATCH * PAGE as usize],
        now,
        last_arm: now,
        last_check: now,
        swap_error: false,
        store_error: false,
    };
    let mut busy = false;
    let mut served = false;
    let mut tick = TICK;
    while !sh.stop.load(Ordering::Relaxed) {
        // Still over the budget after a step: the next step at once. Otherwise, after a
        // turn that served faults, poll a while for the next one (poll.rs), then sleep
        // until a fault, a wake-up or the tick; a fault queued during the turn ends the
        // poll or the sleep at once (a turn that served faults used to look once more
        // without sleeping: two system calls more per fault, for nothing the sleep would
        // not find).
        let slept = !busy;
        if busy {
            poll::sleep(&sh, Duration::ZERO);
        } else if served && poll.poll(|| sh.fault_waiting()) {
            // A fault came while the thread polled (poll.rs): read without a wake-up.
            Counters::add(&sh.counters.faults_polled, 1);
        } else {
            let fault = poll::sleep(&sh, tick);
            poll.slept(fault);
        }
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        svc.now = coarse_now();
        served = svc.serve_all(&sh, &mut st);
        // The table's count of the file's pages, which the budget is kept by, against the
        // kernel's, once a tick (pages written behind the tier's back count from then on).
        if svc.now.saturating_sub(svc.last_check) >= TICK {
            svc.last_check = svc.now;
            sh.check_in_file(&mut st);
        }
        let over = svc.evict_step(&sh, &mut st, EVICT_BATCH, true);
        let armed = if over { 0 } else { svc.arm_ahead(&sh, &mut st) };
        // A turn after a sleep that found nothing to do.
        let quiet = slept && !served && !over && armed == 0;
        if let Some(sw) = st.swap.as_mut() {
            // Gone quiet: the pages written since the last write-back leave host memory
            // now rather than when the next 4 MiB are written.
            if quiet {
                sw.flush_now();
            } else {
                sw.flush();
            }
            if sh.readers > 0 {
                sw.prefer_direct();
            }
        }
        tick = if quiet {
            (tick * 2).min(IDLE_TICK_MAX)
        } else {
            TICK
        };
        drop(st);
        // A caller waiting for the state (see `Tier::lock`) takes it before this thread
        // takes it back; bounded, in case that caller is slow to get a CPU.
        if sh.caller_waiting() {
            let until = Instant::now() + HANDOFF;
            while sh.caller_waiting() && Instant::now() < until {
                std::thread::yield_now();
            }
        }
        busy = over;
    }
    // Callers read the running thread's CPU clock (`Tier::stats`); this is what they read
    // once it has ended.
    Counters::add(&sh.counters.service_cpu_ns, thread_cpu_ns());
}

pub(crate) fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// The monotonic clock to a tick's precision (`CLOCK_MONOTONIC_COARSE`), enough for the
/// service thread's 100 ms bookkeeping. Unlike `Instant::now()` it is always read from
/// the vDSO: where the clock source cannot be read from user space (the nested lab's L1
/// runs on the HPET), every fine reading is a system call, ~20 µs each under its TCG, and
/// the thread took two a fault.
fn coarse_now() -> Duration {
    Duration::from_nanos(clock_ns(libc::CLOCK_MONOTONIC_COARSE).unwrap_or(0))
}

/// Clock `clock`'s reading in nanoseconds; `None` if it cannot be read (a thread's CPU
/// clock once the thread has ended: EINVAL).
pub(crate) fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    // SAFETY: a timespec is plain integers, for which all zeros is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime fills a timespec we own.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// A fault the tier cannot serve leaves a guest thread blocked on memory whose data is
/// gone: nothing can continue correctly, so the process ends with the reason.
pub(crate) fn fatal(what: &str, e: io::Error) -> ! {
    tracing::error!("memory tier: {what}: {e}; the VM's memory cannot be served, aborting");
    eprintln!("densevm: memory tier: {what}: {e}; the VM's memory cannot be served, aborting");
    std::process::abort();
}

struct Service {
    page: Vec<u8>,
    buf: Vec<u8>,
    /// The coarse clock at the start of this turn (see [`coarse_now`]).
    now: Duration,
    last_arm: Duration,
    /// When the table's page count was last checked against the file's.
    last_check: Duration,
    swap_error: bool,
    /// The compressed store failed an insert (warned once).
    store_error: bool,
}

impl Service {
    /// Serves every queued fault, or stops after a read's worth for a caller waiting for
    /// the state (threads that keep faulting keep the queue from running dry); whether
    /// there was any. The queue is read [`MSG_BATCH`] messages at a time: a read that
    /// returns fewer found the queue empty, so a lone fault costs one `read`, not two.
    fn serve_all(&mut self, sh: &Shared, st: &mut State) -> bool {
        let mut any = false;
        let mut msgs = [Msg::default(); MSG_BATCH];
        loop {
            if any && sh.caller_waiting() {
                return true;
            }
            let n = match sh.uffd.read_msgs(&mut msgs) {
                Ok(n) => n,
                Err(e) => fatal("reading userfaultfd", e),
            };
            // Every message read is served: the kernel has handed it over.
            for msg in &msgs[..n] {
                self.serve(sh, st, *msg);
            }
            any |= n > 0;
            if n < MSG_BATCH {
                return any;
            }
        }
    }

    fn serve(&mut self, sh: &Shared, st: &mut State, msg: Msg) {
        if msg.event != EVENT_PAGEFAULT {
            return;
        }
        let addr = msg.address & !(PAGE - 1);
        let Some(pg) = sh.page_of(addr) else {
            tracing::warn!("memory tier: fault at {addr:#x} outside its areas");
            let _ = sh.uffd.wake(addr, PAGE);
            return;
        };
        if msg.flags & FLAG_MINOR != 0 {
            st.table.set_armed(pg, false);
            st.table.set_referenced(pg, true);
            note_touch(sh, st, pg);
            match sh.uffd.continue_minor(addr, PAGE, true) {
                Ok(Resolved::Filled(_)) => {
                    st.table.set_in_file(pg, true);
                    Counters::add(&sh.counters.minor_faults, 1);
                    return;
                }
                Ok(Resolved::Exists) => {
                    let _ = sh.uffd.wake(addr, PAGE);
                    return;
                }
                // The page left the file after the fault was queued: serve it as missing.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EFAULT | libc::ENOENT)) => {}
                Err(e) => fatal(&format!("resolving a minor fault at {addr:#x}"), e),
            }
        }
        self.serve_missing(sh, st, pg, addr);
    }

    /// Brings page `pg` (at `addr`) into the file: zeros for a hole, its data from the
    /// tier otherwise; on a sequential run, its following pages too.
    fn serve_missing(&mut self, sh: &Shared, st: &mut State, pg: usize, addr: u64) {
        // A reader is bringing it back: its copy wakes this fault's thread too.
        if st.inflight.contains_key(&pg) {
            return;
        }
        Counters::add(&sh.counters.missing_faults, 1);
        st.window = if pg == st.last_missing.wrapping_add(1) {
            (st.window * 2).min(MAX_WINDOW)
        } else {
            1
        };
        st.last_missing = pg;
        self.make_room(sh, st);
        // Just accessed: spared by the hand's next pass.
        st.table.set_referenced(pg, true);
        note_refault(sh, st, pg);
        let at = st.table.get(pg);
        // The following pages in the same place kind, contiguous in the same area.
        let same = |st: &State, p: usize| {
            p < st.table.pages()
                && sh.addr_of(p) == Some(addr + (p - pg) as u64 * PAGE)
                && (st.table.get(p) == Location::File) == (at == Location::File)
        };
        let mut n = 1;
        while n < st.window && same(st, pg + n) {
            n += 1;
        }
        if at == Location::File {
            match sh.uffd.zeropage(addr, n as u64 * PAGE, true) {
                Ok(Resolved::Filled(b)) => {
                    Counters::add(&sh.counters.prefetched, (b / PAGE).saturating_sub(1));
                    st.last_missing = pg + (b / PAGE).max(1) as usize - 1;
                    for p in pg..=st.last_missing {
                        st.table.set_in_file(p, true);
                    }
                }
                Ok(Resolved::Exists) => {
                    st.table.set_in_file(pg, true);
                    let _ = sh.uffd.wake(addr, PAGE);
                }
                Err(e) => fatal(&format!("zero-filling {addr:#x}"), e),
            }
            return;
        }
        let source = match at {
            Location::Compressed(_) => &sh.counters.faults_compressed,
            Location::Swap(_) => &sh.counters.faults_swap,
            _ => &sh.counters.faults_base,
        };
        Counters::add(source, 1);
        if let (Location::Swap(slot), 1, 1..) = (at, n, sh.readers) {
            if let Some(file) = st.swap.as_ref().and_then(|sw| sw.reader_file(slot)) {
                reader::send(sh, st, pg, addr, slot, file);
                return;
            }
        }
        for i in 0..n {
            let p = pg + i;
            let at = st.table.get(p);
            if let Err(e) = sh.load(st, p, at, &mut self.page) {
                fatal(&format!("reading page {p} back ({at:?})"), e);
            }
            let dst = addr + i as u64 * PAGE;
            // SAFETY: `self.page` is a live buffer of one page.
            let r = unsafe { sh.uffd.copy(self.page.as_ptr(), dst, PAGE, false, true) };
            if r.is_ok() {
                st.table.set_in_file(p, true);
            }
            match r {
                Ok(Resolved::Filled(_)) => {}
                // The file got the page some other way (it wins): wake the waiters.
                Ok(Resolved::Exists) => {
                    let _ = sh.uffd.wake(dst, PAGE);
                }
                Err(e) if i > 0 => {
                    tracing::debug!("memory tier: prefetch at {dst:#x} stopped: {e}");
                    break;
                }
                Err(e) => fatal(&format!("copying a page back to {dst:#x}"), e),
            }
            sh.forget(st, p);
            if i > 0 {
                // Not accessed (yet): no refault to count.
                st.table.take_distance(p, st.evictions);
                Counters::add(&sh.counters.prefetched, 1);
            }
            st.last_missing = p;
        }
    }

    /// Before a missing fault adds pages, moves pages out until the tier is below its
    /// budget plus [`hard_slack`] (the faulting thread waits meanwhile, as it would in the
    /// kernel's direct reclaim): however the CPU is shared between the service thread and
    /// the threads that fault, RAM cannot run away from the budget. Already above that
    /// (the budget was just cut and the excess is leaving a step at a time between
    /// faults), the fault waits only for as many pages as it may add to leave: RAM does not
    /// grow, and the guest runs on while the rest leaves, which is what lets the hand see
    /// which of the excess it touches (see [`Service::evict_step`]).
    fn make_room(&mut self, sh: &Shared, st: &mut State) {
        let limit = sh
            .budget
            .load(Ordering::Relaxed)
            .saturating_add(hard_slack(sh));
        let window = MAX_WINDOW as u64 * PAGE;
        let used = st.resident() + st.compressed.bytes();
        let (target, most) = if used > limit {
            (used - window, MAX_WINDOW)
        } else {
            (limit.saturating_sub(window), EVICT_BATCH)
        };
        // Bounded: a step that finds no victim refills the pool (with protected pages too
        // when it runs short), so the next has some; give up after four turns' worth of
        // steps (nothing can leave, e.g. no swap file).
        let steps = 4 * st.table.pages().div_ceil(SCAN_LIMIT) + 8;
        for _ in 0..steps {
            if st.resident() + st.compressed.bytes() <= target {
                return;
            }
            if !self.evict_step(sh, st, most, false) {
                return;
            }
        }
    }

    /// While the tier is over its budget, moves up to `most` cold pages out (the
    /// oldest armed pages go, the hand refills the pool). Returns whether it was over.
    /// With `yielding`, it stops early when a fault is waiting (the run loop serves it and
    /// comes back): a fault that arrives during a step waits for one page's work, not a
    /// batch's.
    fn evict_step(&mut self, sh: &Shared, st: &mut State, most: usize, yielding: bool) -> bool {
        let budget = sh.budget.load(Ordering::Relaxed);
        let used = st.resident() + st.compressed.bytes();
        if used <= budget {
            return false;
        }
        let slack = (budget / 64).max(16 * PAGE);
        let want = ((used - budget + slack) / PAGE).min(most as u64) as usize;
        // The victims: the pages armed longest ago and not touched since.
        let mut victims = Vec::with_capacity(want);
        while victims.len() < want {
            match st.table.oldest_armed() {
                Some(pg) => victims.push(pg),
                None => break,
            }
        }
        victims.sort_unstable();
        // Refill the pool (the victims are leaving it). If nothing is left to take or to
        // arm but protected pages, the budget comes first: the hand arms those too. Far
        // over the budget (it was just cut), the pool grows to the whole excess: the hand
        // arms up to a scan's worth of pages a step while a step evicts a batch, so the
        // last of the excess leaves long after it was armed, and what the guest touches
        // meanwhile (its hottest pages) comes back with a minor fault and stays, instead
        // of leaving in the hand's order and coming back with a missing one.
        // (Not while a fault waits for this step: the walk would be its wait.)
        let excess = ((used - budget) / PAGE) as usize;
        let pool = if yielding {
            arm_pool(budget).max(excess.min(DRAIN_POOL))
        } else {
            arm_pool(budget)
        };
        let room = (pool + victims.len()).saturating_sub(st.table.armed_count());
        let armed = self.arm_more(sh, st, room, false);
        // Protected pages all around the hand: rather than walk the file for the few
        // others, it arms protected ones too while the pool is short of a step's victims.
        if armed < room && st.table.armed_count() < EVICT_BATCH {
            self.arm_more(sh, st, room - armed, true);
        }
        self.evict(sh, st, &victims, yielding);
        // Not yielding: a store left over its share would grow with every step while
        // faults keep coming (the nested lab's Redis at 1/3: 36 % instead of 60 %).
        self.demote(sh, st);
        true
    }

    /// Above 7/8 of the budget, arms pages ahead of need every tick, so that the first
    /// pages to go under pressure are known cold. Returns how many it armed.
    fn arm_ahead(&mut self, sh: &Shared, st: &mut State) -> usize {
        let budget = sh.budget.load(Ordering::Relaxed);
        if self.now.saturating_sub(self.last_arm) < TICK || st.resident() <= budget / 8 * 7 {
            return 0;
        }
        // Areas that fit the budget whole never need a page to leave: arming them would
        // only cost minor faults (a VM whose budget is its RAM size).
        if sh.areas.iter().map(|a| a.len).sum::<u64>() <= budget {
            return 0;
        }
        let pool = arm_pool(budget);
        if st.table.armed_count() >= pool {
            return 0;
        }
        self.last_arm = self.now;
        let room = (pool - st.table.armed_count()).min(ARM_AHEAD);
        self.arm_more(sh, st, room, false)
    }

    /// Moves the hand on until it has armed `room` pages, arming each page it passes that
    /// was not touched since its last pass (a touched one is spared this once) and is not
    /// protected (unless `force`). It looks at no more than 8 pages per page wanted (at
    /// most [`SCAN_LIMIT`]): where protected pages are dense, a long walk for the few
    /// others would cost more than the faults it saves. Returns how many it armed.
    fn arm_more(&mut self, sh: &Shared, st: &mut State, room: usize, force: bool) -> usize {
        if room == 0 {
            return 0;
        }
        let (mut arm, mut spared) = (Vec::new(), Vec::new());
        let now = st.evictions;
        let limit = (8 * room + 64).min(SCAN_LIMIT);
        self.sweep(sh, st, limit, |st, pg| {
            if st.table.referenced(pg) {
                spared.push(pg);
            } else if !st.table.armed(pg) && (force || !st.table.protected(pg, now)) {
                arm.push(pg);
            }
            arm.len() < room
        });
        for pg in spared {
            st.table.set_referenced(pg, false);
        }
        arm_pages(sh, st, &arm)
    }

    /// Moves the hand over up to `limit` pages the file holds inside the areas, calling
    /// `visit` on each until it returns false. The table knows which pages the file holds
    /// (the table's `in_file` bits), so a turn costs no system call: asking the kernel
    /// (`SEEK_DATA`/`SEEK_HOLE` per run of pages, or `mincore` per page) cost the service
    /// thread more than the faults it served once the file was riddled with holes, in
    /// the nested lab's TCG above all.
    fn sweep(
        &mut self,
        sh: &Shared,
        st: &mut State,
        limit: usize,
        mut visit: impl FnMut(&State, usize) -> bool,
    ) {
        let (mut seen, mut wrapped) = (0, false);
        while seen < limit {
            let Some((area_first, area_end)) = area_from(sh, st.hand) else {
                if wrapped || st.hand == 0 {
                    return;
                }
                st.hand = 0;
                wrapped = true;
                continue;
            };
            let mut pg = st.hand.max(area_first);
            let mut more = true;
            while seen < limit && more {
                let Some(p) = st.table.next_in_file(pg, area_end) else {
                    pg = area_end;
                    break;
                };
                more = visit(st, p);
                seen += 1;
                pg = p + 1;
            }
            st.hand = pg;
            if !more {
                return;
            }
        }
    }

    /// Moves `victims` (armed, so unmapped: nothing writes them meanwhile) out of the file.
    /// With `yielding`, stops at a run boundary once a fault or a caller (see `Tier::lock`)
    /// waits, after at least one run; the victims not reached go back to the front of the
    /// armed queue.
    fn evict(&mut self, sh: &Shared, st: &mut State, victims: &[usize], yielding: bool) {
        let cmax = sh.compressed_max();
        let mut buf = std::mem::take(&mut self.buf);
        let mut done = 0;
        for run in runs(victims) {
            if yielding && done > 0 && (sh.fault_waiting() || sh.caller_waiting()) {
                st.table.requeue_armed(&victims[done..]);
                break;
            }
            done += run.len();
            let (first, n) = (run[0], run.len());
            let bytes = &mut buf[..n * PAGE as usize];
            if let Err(e) = sh.file.read_exact_at(bytes, first as u64 * PAGE) {
                tracing::warn!("memory tier: reading pages to evict: {e}");
                // They stay; off the queue, they must not count as armed (an access still
                // faults, harmlessly).
                for &pg in run {
                    st.table.set_armed(pg, false);
                }
                continue;
            }
            let mut gone = vec![false; n];
            for (i, data) in bytes.chunks_exact(PAGE as usize).enumerate() {
                let pg = first + i;
                st.table.set_armed(pg, false);
                st.table.set_referenced(pg, false);
                if data.iter().all(|&b| b == 0) {
                    Counters::add(&sh.counters.evicted_zero, 1);
                    gone[i] = true;
                    continue;
                }
                // Still the base's bytes: it can be read from there again.
                if st.table.in_base(pg) && sh.same_as_base(pg, data, &mut self.page) {
                    st.table.set(pg, Location::Base);
                    st.base_pages += 1;
                    Counters::add(&sh.counters.evicted_clean, 1);
                    gone[i] = true;
                    continue;
                }
                // The newest evictions are the likeliest to come back: they always go to
                // the compressed store, whose oldest pages make room (`demote`), as long
                // as there is somewhere to demote them to.
                if cmax > 0 {
                    if let Some(c) = Compressed::compress(data) {
                        let fits = st.compressed.bytes() + c.len() as u64 <= cmax;
                        if fits || !self.swap_error {
                            match st.compressed.insert(pg as u32, &c) {
                                Ok(slot) => {
                                    st.table.set(pg, Location::Compressed(slot));
                                    Counters::add(&sh.counters.evicted_compressed, 1);
                                    gone[i] = true;
                                    continue;
                                }
                                // No memory for the slab: the page goes to the file.
                                Err(e) if !self.store_error => {
                                    self.store_error = true;
                                    tracing::warn!("memory tier: compressed store: {e}");
                                }
                                Err(_) => {}
                            }
                        }
                    }
                }
                if let Some(slot) = self.write_swap(sh, st, data) {
                    st.table.set(pg, Location::Swap(slot));
                    Counters::add(&sh.counters.evicted_swap, 1);
                    gone[i] = true;
                }
            }
            // Punch each run of pages that left.
            let mut i = 0;
            while i < n {
                if !gone[i] {
                    i += 1;
                    continue;
                }
                let j = (i..n).find(|&k| !gone[k]).unwrap_or(n);
                for pg in first + i..first + j {
                    let seq = st.evictions;
                    st.table.set_evicted(pg, seq);
                    st.evictions = nonzero(seq.wrapping_add(1));
                    st.table.set_in_file(pg, false);
                }
                let off = (first + i) as u64 * PAGE;
                if let Err(e) = punch(&sh.file, off, (j - i) as u64 * PAGE) {
                    // The data is still in the file too: forget the tier's copy.
                    tracing::warn!("memory tier: punching {off:#x}: {e}");
                    for pg in first + i..first + j {
                        sh.forget(st, pg);
                        st.table.set_in_file(pg, true);
                    }
                }
                i = j;
            }
        }
        self.buf = buf;
    }

    /// Writes a page to the swap file (created on first use); `None` if there is none.
    fn write_swap(&mut self, sh: &Shared, st: &mut State, data: &[u8]) -> Option<u32> {
        if st.swap.is_none() && !self.swap_error {
            match Swap::new(&sh.swap_dir) {
                Ok(s) => st.swap = Some(s),
                Err(e) => {
                    self.swap_error = true;
                    tracing::error!("memory tier: no swap file, incompressible pages stay: {e}");
                }
            }
        }
        match st.swap.as_mut()?.write(data) {
            Ok(slot) => Some(slot),
            Err(e) => {
                tracing::warn!("memory tier: writing to the swap file: {e}");
                None
            }
        }
    }

    /// Moves the compressed store's oldest pages to the swap file while it is over its
    /// share (by at most what one eviction batch can add, so it keeps up).
    fn demote(&mut self, sh: &Shared, st: &mut State) {
        let cmax = sh.compressed_max();
        for _ in 0..DEMOTE_BATCH {
            if st.compressed.bytes() <= cmax {
                return;
            }
            let Some((slot, pg)) = st.compressed.pop_oldest() else {
                return;
            };
            if st.compressed.read(slot, &mut self.page).is_err() {
                return;
            }
            let data = std::mem::take(&mut self.page);
            let to = self.write_swap(sh, st, &data);
            self.page = data;
            let Some(to) = to else { return };
            st.compressed.remove(slot);
            st.table.set(pg as usize, Location::Swap(to));
            Counters::add(&sh.counters.demoted, 1);
        }
    }
}

/// How far over the budget faults may take the tier before the faulting thread waits for
/// pages to leave: 1/32 of the budget, at least 1 MiB.
pub(crate) fn hard_slack(sh: &Shared) -> u64 {
    (sh.budget.load(Ordering::Relaxed) / 32).max(1 << 20)
}

/// The budget in pages: the yardstick of refault distances and protections.
fn budget_pages(sh: &Shared) -> u32 {
    (sh.budget.load(Ordering::Relaxed) / PAGE).clamp(1, MAX_PROTECTION as u64) as u32
}

/// Longest protection, in evictions (the table compares eviction numbers modulo 2^32).
const MAX_PROTECTION: u32 = 1 << 30;

/// Eviction numbers skip 0, which means "none" in the table.
fn nonzero(seq: u32) -> u32 {
    seq.max(1)
}

/// Page `pg` faulted back in: if it left less than a budget's worth of evictions ago (a
/// *near refault*), keeping it would have been a hit for a budget not much larger, so it
/// is protected from the hand — the longer, the more often that happened to it. A far
/// refault halves the count. This is what turns the clock hand's recency (armed, then
/// untouched for a while) into something closer to frequency: under a zipfian load the
/// pages that keep coming back are the ones worth keeping.
fn note_refault(sh: &Shared, st: &mut State, pg: usize) {
    let Some(dist) = st.table.take_distance(pg, st.evictions) else {
        return;
    };
    let cap = budget_pages(sh);
    let n = st.table.count_refault(pg, dist < cap);
    if dist < cap {
        protect_for(st, pg, u64::from(n) * u64::from(cap) / 2);
    }
}

/// Protects resident page `pg` for the next `evictions` evictions (at most
/// [`MAX_PROTECTION`]).
fn protect_for(st: &mut State, pg: usize, evictions: u64) {
    let len = evictions.min(u64::from(MAX_PROTECTION)) as u32;
    st.table
        .protect(pg, nonzero(st.evictions.wrapping_add(len)));
}

/// Most doublings of the protection of a page touched while armed (see [`note_touch`]).
const TOUCH_DOUBLINGS: u8 = 5;

/// Armed page `pg` was touched: the hand took it for cold and it was not. It is protected
/// for a budget's worth of evictions the first time, twice that the second, and so on up
/// to 2^[`TOUCH_DOUBLINGS`] budgets' worth (a far refault halves its count of touches:
/// it had gone cold). A page the guest uses all the time then costs a minor fault less
/// and less often, where a fixed protection had the hand arm it again after every
/// budget's worth of evictions for as long as the VM ran (in the nested lab's Redis at
/// 1/3 every 2-6 minutes; the minor faults were a fifth of its faults). A page touched
/// once, lukewarm, gets one budget's worth as before: protecting every touched page four
/// times as long cost more missing faults than it saved minor ones (docs/benchmarks.md,
/// "ab8"). The count is the page's own, apart from its near refaults, so that a touch
/// does not lengthen the protection a near refault gives (the first form of this shared
/// one count, "ab9").
fn note_touch(sh: &Shared, st: &mut State, pg: usize) {
    let n = st.table.count_touch(pg);
    let doublings = n.min(TOUCH_DOUBLINGS + 1) - 1;
    protect_for(st, pg, u64::from(budget_pages(sh)) << doublings);
}

/// How many pages the hand keeps armed at most: [`ARM_POOL`], or 1/64 of the budget.
fn arm_pool(budget: u64) -> usize {
    ARM_POOL.max((budget / PAGE / 64) as usize)
}

/// Arms `pages` (in the hand's order): unmaps them, so that their next access is a minor
/// fault. Returns how many were armed.
fn arm_pages(sh: &Shared, st: &mut State, pages: &[usize]) -> usize {
    let mut armed = 0;
    for run in runs(pages) {
        let (Some(start), Some(last)) = (sh.addr_of(run[0]), sh.addr_of(run[run.len() - 1])) else {
            continue;
        };
        if last - start != (run.len() as u64 - 1) * PAGE {
            // The run crosses areas: arm page by page.
            for &pg in run {
                armed += arm_pages(sh, st, &[pg]);
            }
            continue;
        }
        let len = run.len() as u64 * PAGE;
        // SAFETY: [start, start + len) lies inside an area, a live MAP_SHARED mapping of
        // the file: MADV_DONTNEED only drops its page-table entries; the data stays in the
        // file and the next access faults it back (a minor fault we serve).
        if unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                len as usize,
                libc::MADV_DONTNEED,
            )
        } != 0
        {
            continue;
        }
        for &pg in run {
            st.table.set_armed(pg, true);
        }
        armed += run.len();
        Counters::add(&sh.counters.armed, run.len() as u64);
    }
    armed
}

/// Splits sorted pages into runs of consecutive pages.
fn runs(pages: &[usize]) -> impl Iterator<Item = &[usize]> {
    pages.chunk_by(|a, b| b == &(a + 1))
}

/// The area holding file page `pg`, or else the first one after it (in file order):
/// `(first page, end page)`.
fn area_from(sh: &Shared, pg: usize) -> Option<(usize, usize)> {
    sh.areas
        .iter()
        .map(|a| {
            let first = (a.offset / PAGE) as usize;
            (first, first + (a.len / PAGE) as usize)
        })
        .filter(|&(_, end)| end > pg)
        .min_by_key(|&(first, _)| first)
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_split_at_gaps() {
        let v = [1, 2, 3, 7, 9, 10];
        let r: Vec<&[usize]> = runs(&v).collect();
        assert_eq!(r, vec![&[1, 2, 3][..], &[7][..], &[9, 10][..]]);
    }
}
