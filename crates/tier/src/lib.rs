//! Memory tiering under a DRAM budget.
//!
//! A [`Tier`] watches the *areas* of one shmem file (a VM's RAM memfd) that are mapped
//! `MAP_SHARED` at some host addresses, and keeps the DRAM they use — the file's resident
//! pages plus the compressed store — under a budget. When it is over, the coldest resident
//! pages leave the file (a punched hole) for a slower tier: nothing for a zero page, LZ4 in
//! memory for what compresses, an unlinked file for what does not or, once the compressed
//! store is full, for its oldest pages. An access to a page that left faults (userfaultfd
//! *missing* fault, raised for host threads and for KVM's vCPU accesses alike) and the
//! tier's service thread copies the page back in, with its neighbours when the accesses
//! are sequential.
//!
//! Cold pages are found without DAMON or idle-page tracking: a clock hand walks the
//! file's resident pages and *arms* a pool of them (`MADV_DONTNEED` on the mapping: the
//! page stays in the file, its page-table entries and KVM's translations go), and the
//! next access to an armed page is a userfaultfd *minor* fault, answered at once
//! (`UFFDIO_CONTINUE`) after clearing the arm. The pages armed longest ago and still
//! untouched are the victims. A page that faults back in soon after leaving (a near
//! refault) is protected from the hand for a while, the longer the more often it did: the
//! hand's recency test alone cannot tell lukewarm pages from cold ones. The hand only
//! moves when pages must go (and slowly ahead of need, above 7/8 of the budget), so an
//! idle or fitting VM costs nothing.
//!
//! The tier is a cache of guest RAM, never of data that must outlive the process: the
//! swap file is unlinked from birth and the compressed store is anonymous memory of the
//! process (a slab of size classes, `slab.rs`).
//!
//! A tier can start over a *base* file (a restored VM's snapshot memory): the RAM file
//! starts empty and each page that holds data in the base is read from it on its first
//! access, like a page coming back from the swap file. A page chosen to leave that still
//! holds the base's bytes leaves for nothing (it is read from the base again), like a
//! clean page of the page cache. A restored VM then takes only the DRAM its guest touches,
//! under the same budget, and nothing writes the base.
//!
//! This crate knows no KVM and no VMM types: it sees a file, host addresses and a budget.

mod poll;
mod reader;
mod service;
mod slab;
mod store;
mod table;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use densevm_uffd::Uffd;

use store::{Compressed, Swap};
use table::{Location, Table};

/// Page size the tier works in.
pub const PAGE: u64 = 4096;

/// One mapping of the file: `len` bytes from file offset `offset`, mapped `MAP_SHARED` at
/// `host_addr` (page aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Area {
    /// Offset in the file.
    pub offset: u64,
    /// Host address of the mapping.
    pub host_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// How a tier is set up.
#[derive(Clone, Debug)]
pub struct TierConfig {
    /// DRAM the areas may use: resident file pages plus compressed bytes.
    pub budget: u64,
    /// Most bytes the compressed store may hold (counted within the budget); `None`: a
    /// quarter of the budget.
    pub compressed_max: Option<u64>,
    /// Directory of the swap file (created unlinked, on first use).
    pub swap_dir: PathBuf,
    /// A read-only file the areas start with (at the same offsets): the RAM file must be
    /// empty (all holes) inside the areas, and every page with data in the base is read
    /// from it on first access. `None`: the RAM file holds the areas' data.
    pub base: Option<Arc<File>>,
    /// Threads that read pages back from the swap file beside the service thread, so that
    /// faults of several threads wait for the disk side by side (`reader.rs`); 0: the
    /// service thread reads them itself. Worth it only where several threads fault at
    /// once: a reader costs a thread switch per read.
    pub swap_readers: usize,
    /// Whether the service thread, after serving faults, polls for the next one a little
    /// while (up to 200 µs, adapting to how soon faults come) before it sleeps, so that a
    /// fault that comes meanwhile need not wake it (`poll.rs`; the faulting thread's own
    /// wake-up remains). It never polls where its thread may use only one CPU or the clock
    /// is read by a system call.
    pub poll_faults: bool,
}

/// Whether a tier started from the calling thread would poll for faults
/// ([`TierConfig::poll_faults`]): the thread may run on more than one CPU and the clock is
/// read without a system call.
pub fn polling_possible() -> bool {
    poll::worth_polling()
}

/// What went wrong starting a tier.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// No userfaultfd with shmem minor faults.
    #[error(
        "memory tiering needs userfaultfd with shmem minor faults (Linux >= 5.13) that also \
         sees KVM's faults: open /dev/userfaultfd read-write or run with CAP_SYS_PTRACE: {0}"
    )]
    Uffd(io::Error),
    /// An area is not page aligned or not inside the file.
    #[error("tier area {0:x?} is not page aligned or lies outside the file")]
    BadArea(Area),
    /// Registering an area failed.
    #[error("cannot register {len:#x} bytes at {addr:#x} for tiering (must be a MAP_SHARED mapping of a memfd or tmpfs file): {source}")]
    Register {
        /// Host address.
        addr: u64,
        /// Length.
        len: u64,
        /// The kernel's error.
        source: io::Error,
    },
    /// Other I/O.
    #[error("memory tier: {0}")]
    Io(#[from] io::Error),
}

/// Counters and sizes of a tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// The budget in bytes.
    pub budget: u64,
    /// Resident bytes of the file.
    pub resident: u64,
    /// Pages in the compressed store and the bytes they take.
    pub compressed_pages: u64,
    /// The memory the compressed store holds: its slab's arenas (objects, free places,
    /// tails) and its tables (what the budget counts; a little more than the compressed
    /// bytes).
    pub compressed_bytes: u64,
    /// The compressed bytes of those pages (the sum of their compressed lengths).
    pub compressed_data_bytes: u64,
    /// Pages in the swap file.
    pub swap_pages: u64,
    /// Pages whose data is only in the base file: never accessed since the tier started
    /// over it, or dropped because they still held the base's bytes.
    pub base_pages: u64,
    /// Pages that left RAM for nothing because they still held the base file's bytes (a
    /// restored VM's clean pages).
    pub evicted_clean: u64,
    /// Pages that left the file: zero (kept as nothing), compressed, to the swap file.
    pub evicted_zero: u64,
    /// Pages compressed on eviction.
    pub evicted_compressed: u64,
    /// Pages written to the swap file on eviction.
    pub evicted_swap: u64,
    /// Compressed pages moved on to the swap file (the store was full).
    pub demoted: u64,
    /// Missing faults served (a page that was not in the file).
    pub missing_faults: u64,
    /// Of those, the ones served from the compressed store, the swap file and the base
    /// file (the rest were zero pages: holes).
    pub faults_compressed: u64,
    /// See [`TierStats::faults_compressed`].
    pub faults_swap: u64,
    /// See [`TierStats::faults_compressed`].
    pub faults_base: u64,
    /// Of [`TierStats::faults_swap`], the pages sent to a reader thread (a read a discard or
    /// snapshot cancelled meanwhile counts too).
    pub swap_reads_behind: u64,
    /// Minor faults served (an armed page touched).
    pub minor_faults: u64,
    /// Pages brought back ahead of an access (sequential prefetch).
    pub prefetched: u64,
    /// Pages armed by the clock hand.
    pub armed: u64,
    /// Faults the service thread found while it polled for them, without a wake-up (the
    /// first of each such turn), see [`TierConfig::poll_faults`].
    pub faults_polled: u64,
    /// CPU time of the service thread and its swap-file readers, in nanoseconds (polling
    /// included).
    pub service_cpu_ns: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    evicted_zero: AtomicU64,
    evicted_clean: AtomicU64,
    evicted_compressed: AtomicU64,
    evicted_swap: AtomicU64,
    demoted: AtomicU64,
    missing_faults: AtomicU64,
    faults_compressed: AtomicU64,
    faults_swap: AtomicU64,
    faults_base: AtomicU64,
    swap_reads_behind: AtomicU64,
    minor_faults: AtomicU64,
    prefetched: AtomicU64,
    armed: AtomicU64,
    faults_polled: AtomicU64,
    service_cpu_ns: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What the service thread and the callers share.
pub(crate) struct Shared {
    uffd: Uffd,
    file: Arc<File>,
    areas: Vec<Area>,
    budget: AtomicU64,
    compressed_max: Option<u64>,
    swap_dir: PathBuf,
    base: Option<Arc<File>>,
    stop: AtomicBool,
    wake: OwnedFd,
    state: Mutex<State>,
    /// Callers waiting for `state` (stats, discard, freeze): the service thread, which
    /// takes it again the moment it lets go while pages leave, steps aside for them.
    waiters: AtomicUsize,
    counters: Counters,
    /// Reader threads, and the swap-file reads waiting for one.
    readers: usize,
    jobs: reader::Queue,
}

/// Mutable state, under the lock the service thread takes for each step.
pub(crate) struct State {
    table: Table,
    compressed: Compressed,
    swap: Option<Swap>,
    /// Pages at [`Location::Base`].
    base_pages: u64,
    /// The clock hand (a page of the file).
    hand: usize,
    /// The next eviction's number (never 0; wraps).
    evictions: u32,
    /// The file's pages outside what the table counts (pages outside the areas) when it
    /// last counted them from the file: a drift from it means the table missed a change.
    untracked: i64,
    /// The last missing fault's page and the prefetch window it earned.
    last_missing: usize,
    window: usize,
    /// Pages a reader is reading back, with their job's number, and the next number.
    inflight: HashMap<usize, u64>,
    next_job: u64,
}

impl State {
    /// Resident bytes of the file, as the table counts them: what the service thread
    /// steers by, at no system call (an `fstat` per step cost ~10 % of its CPU in the
    /// nested lab); [`Shared::check_in_file`] keeps it true.
    fn resident(&self) -> u64 {
        (self.table.in_file_count() as i64 + self.untracked).max(0) as u64 * PAGE
    }
}

impl Shared {
    /// The file page at host address `addr`, if it is in an area.
    fn page_of(&self, addr: u64) -> Option<usize> {
        self.areas
            .iter()
            .find(|a| addr >= a.host_addr && addr - a.host_addr < a.len)
            .map(|a| ((a.offset + (addr - a.host_addr)) / PAGE) as usize)
    }

    /// The host address of file page `pg`, if an area maps it.
    fn addr_of(&self, pg: usize) -> Option<u64> {
        let off = pg as u64 * PAGE;
        self.areas
            .iter()
            .find(|a| off >= a.offset && off - a.offset < a.len)
            .map(|a| a.host_addr + (off - a.offset))
    }

    /// Resident bytes of the file, as the kernel counts them (`fstat`).
    fn file_resident(&self) -> u64 {
        // SAFETY: fstat fills a plain struct we own from a descriptor the Arc keeps open.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(self.file.as_raw_fd(), &mut st) } != 0 {
            return 0;
        }
        st.st_blocks as u64 * 512
    }

    fn compressed_max(&self) -> u64 {
        self.compressed_max
            .unwrap_or(self.budget.load(Ordering::Relaxed) / 4)
    }

    /// Whether a caller waits for the state (see [`Tier::lock`]).
    fn caller_waiting(&self) -> bool {
        self.waiters.load(Ordering::SeqCst) > 0
    }

    /// Whether a fault message waits on the userfaultfd (a poll that does not sleep).
    fn fault_waiting(&self) -> bool {
        let mut fd = libc::pollfd {
            fd: self.uffd.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: a non-blocking poll of one pollfd we own.
        unsafe { libc::poll(&mut fd, 1, 0) > 0 }
    }

    fn wake_service(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to an eventfd we own.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Reads page `pg`'s tiered data (at `at`) into `buf`.
    fn load(&self, st: &State, pg: usize, at: Location, buf: &mut [u8]) -> io::Result<()> {
        match at {
            Location::File => Err(io::Error::other("page is in the file")),
            Location::Compressed(s) => st.compressed.read(s, buf),
            Location::Swap(s) => st
                .swap
                .as_ref()
                .ok_or_else(|| io::Error::other("no swap file"))?
                .read(s, buf),
            Location::Base => read_base(
                self.base
                    .as_ref()
                    .ok_or_else(|| io::Error::other("no base file"))?,
                buf,
                pg as u64 * PAGE,
            ),
        }
    }

    /// Whether `data` (page `pg`'s bytes) equals the base file's page there (`scratch`: a
    /// page-sized buffer). A base that cannot be read counts as different.
    fn same_as_base(&self, pg: usize, data: &[u8], scratch: &mut [u8]) -> bool {
        match &self.base {
            Some(base) => read_base(base, scratch, pg as u64 * PAGE).is_ok() && scratch == data,
            None => false,
        }
    }

    /// Counts the pages the file holds in the areas into the table (`SEEK_DATA`), and what
    /// it holds elsewhere.
    fn count_in_file(&self, st: &mut State) -> io::Result<()> {
        st.table.clear_in_file();
        for a in &self.areas {
            for (from, to) in data_ranges(&self.file, a.offset, a.offset + a.len)? {
                for pg in (from / PAGE) as usize..to.div_ceil(PAGE) as usize {
                    st.table.set_in_file(pg, true);
                }
            }
        }
        st.untracked = (self.file_resident() / PAGE) as i64 - st.table.in_file_count() as i64;
        Ok(())
    }

    /// Checks the table's count of the file's pages against the file's own (which moves
    /// only through the tier, unless something else writes or punches the file behind its
    /// back); counts again from the file if they drifted apart.
    fn check_in_file(&self, st: &mut State) {
        let resident = self.file_resident();
        let count = st.table.in_file_count();
        let drift = (resident / PAGE) as i64 - count as i64 - st.untracked;
        if drift.unsigned_abs() > (count as u64 / 64).max(256) {
            tracing::warn!(
                "memory tier: the file's page count is {drift} off the tier's; counting again"
            );
            if let Err(e) = self.count_in_file(st) {
                tracing::warn!("memory tier: counting the file's pages: {e}");
            }
        }
    }

    /// Forgets page `pg`'s tiered data (and cancels a reader's job for it).
    fn forget(&self, st: &mut State, pg: usize) {
        if !st.inflight.is_empty() {
            st.inflight.remove(&pg);
        }
        match st.table.get(pg) {
            Location::File => {}
            Location::Compressed(s) => st.compressed.remove(s),
            Location::Swap(s) => {
                if let Some(sw) = st.swap.as_mut() {
                    sw.remove(s)
                }
            }
            Location::Base => st.base_pages -= 1,
        }
        st.table.set(pg, Location::File);
    }
}

/// A running tier: its service thread serves faults and keeps the budget until dropped.
pub struct Tier {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    readers: Vec<JoinHandle<()>>,
}

impl Tier {
    /// Starts tiering `areas` of `file` under `config.budget`. Each area must be a live
    /// `MAP_SHARED` mapping of `file` that stays mapped while the tier runs; nothing else
    /// may write the file's pages except through those mappings (or [`Tier::discard`]).
    pub fn start(file: Arc<File>, areas: Vec<Area>, config: TierConfig) -> Result<Tier, TierError> {
        let size = file.metadata()?.len();
        for a in &areas {
            let aligned = a.offset % PAGE == 0 && a.host_addr % PAGE == 0 && a.len % PAGE == 0;
            if !aligned || a.len == 0 || a.offset.checked_add(a.len).is_none_or(|e| e > size) {
                return Err(TierError::BadArea(*a));
            }
        }
        let mut table = Table::new(size.div_ceil(PAGE) as usize);
        let base_pages = match &config.base {
            Some(base) => mark_base(&mut table, &file, base, &areas)?,
            None => 0,
        };
        let uffd = Uffd::new(densevm_uffd::FEATURE_MINOR_SHMEM | densevm_uffd::FEATURE_THREAD_ID)
            .map_err(TierError::Uffd)?;
        if uffd.features() & densevm_uffd::FEATURE_MISSING_SHMEM == 0 {
            return Err(TierError::Uffd(io::Error::other(
                "the kernel lacks missing faults on shmem",
            )));
        }
        for a in &areas {
            uffd.register(
                a.host_addr,
                a.len,
                densevm_uffd::REGISTER_MISSING | densevm_uffd::REGISTER_MINOR,
            )
            .map_err(|source| TierError::Register {
                addr: a.host_addr,
                len: a.len,
                source,
            })?;
        }
        // SAFETY: eventfd returns a new descriptor (or -1), owned from here on.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(efd) };
        let shared = Arc::new(Shared {
            uffd,
            file,
            areas,
            budget: AtomicU64::new(config.budget),
            compressed_max: config.compressed_max,
            swap_dir: config.swap_dir,
            base: config.base,
            stop: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            wake,
            state: Mutex::new(State {
                table,
                compressed: Compressed::default(),
                swap: None,
                base_pages,
                hand: 0,
                evictions: 1,
                untracked: 0,
                last_missing: usize::MAX,
                window: 1,
                inflight: HashMap::new(),
                next_job: 0,
            }),
            counters: Counters::default(),
            readers: config.swap_readers,
            jobs: reader::Queue::default(),
        });
        shared.count_in_file(&mut shared.state.lock().unwrap_or_else(|p| p.into_inner()))?;
        let s = shared.clone();
        // Decided here, before the thread's filter: it reads the CPUs the thread may use.
        let poll = poll::FaultPoll::new(config.poll_faults && poll::worth_polling());
        let thread = std::thread::Builder::new()
            .name("tier".into())
            .spawn(move || {
                densevm_seccomp::enter(densevm_seccomp::ThreadKind::Tier);
                service::run(s, poll)
            })?;
        let mut tier = Tier {
            shared,
            thread: Some(thread),
            readers: Vec::new(),
        };
        for i in 0..config.swap_readers {
            let s = tier.shared.clone();
            // Its page buffer comes from here: a reader that allocates nothing gets no heap
            // arena of its own (3 readers of a 4-vCPU VM: 60 KiB more anonymous memory
            // than none when each allocated its buffer, 32 KiB this way).
            let buf = Box::new(store::AlignedPage([0; PAGE as usize]));
            let reader = std::thread::Builder::new()
                .name(format!("tier-read{i}"))
                .spawn(move || {
                    densevm_seccomp::enter(densevm_seccomp::ThreadKind::Tier);
                    reader::run(s, buf)
                })?;
            tier.readers.push(reader);
        }
        Ok(tier)
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.shared.budget.load(Ordering::Relaxed)
    }

    /// Changes the budget; if the tier is now over it, pages start leaving at once, a step at
    /// a time between faults (see the service thread).
    pub fn set_budget(&self, bytes: u64) {
        self.shared.budget.store(bytes, Ordering::Relaxed);
        self.shared.wake_service();
    }

    /// Current counters and sizes.
    pub fn stats(&self) -> TierStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let st = self.lock();
        TierStats {
            budget: self.budget(),
            resident: self.shared.file_resident(),
            compressed_pages: st.compressed.len() as u64,
            compressed_bytes: st.compressed.bytes(),
            compressed_data_bytes: st.compressed.data_bytes(),
            swap_pages: st.swap.as_ref().map_or(0, |s| s.len()),
            base_pages: st.base_pages,
            evicted_zero: get(&c.evicted_zero),
            evicted_clean: get(&c.evicted_clean),
            evicted_compressed: get(&c.evicted_compressed),
            evicted_swap: get(&c.evicted_swap),
            demoted: get(&c.demoted),
            missing_faults: get(&c.missing_faults),
            faults_compressed: get(&c.faults_compressed),
            faults_swap: get(&c.faults_swap),
            faults_base: get(&c.faults_base),
            swap_reads_behind: get(&c.swap_reads_behind),
            minor_faults: get(&c.minor_faults),
            prefetched: get(&c.prefetched),
            armed: get(&c.armed),
            faults_polled: get(&c.faults_polled),
            service_cpu_ns: self
                .service_cpu_ns()
                .unwrap_or_else(|| get(&c.service_cpu_ns)),
        }
    }

    /// The CPU time of the service thread and its readers, read from their CPU clocks while
    /// they run (the threads do not read them: `CLOCK_THREAD_CPUTIME_ID` is a system call
    /// on every turn of a loop, which under the nested lab's TCG costs microseconds each).
    fn service_cpu_ns(&self) -> Option<u64> {
        let mut ns = thread_cpu_ns(self.thread.as_ref()?)?;
        for r in &self.readers {
            ns += thread_cpu_ns(r)?;
        }
        Some(ns)
    }

    /// The state, taken ahead of the service thread: announced in `waiters`, so a thread
    /// moving a budget cut's excess out steps aside at its next run of pages (the lock is
    /// not fair: it would otherwise take it back each time, and a scrape of the counters,
    /// a balloon's release or a snapshot would wait for the whole excess).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.waiters.fetch_add(1, Ordering::SeqCst);
        let st = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        self.shared.waiters.fetch_sub(1, Ordering::SeqCst);
        st
    }

    /// Gives `[offset, offset + len)` of the file back to the host (a balloon or a free
    /// page report): tiered data there is forgotten and the file gets a hole, so the
    /// range reads as zeros from now on.
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if offset % PAGE != 0 || len % PAGE != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot discard {offset:#x}+{len:#x}: not page aligned"),
            ));
        }
        let mut st = self.lock();
        let first = (offset / PAGE) as usize;
        let last = ((offset + len) / PAGE).min(st.table.pages() as u64) as usize;
        for pg in first..last {
            self.shared.forget(&mut st, pg);
            st.table.set_armed(pg, false);
            st.table.set_referenced(pg, false);
            st.table.clear_history(pg);
            st.table.set_in_file(pg, false);
        }
        punch(&self.shared.file, offset, len)
    }

    /// Holds the tier still (its service thread waits, so do faults on tiered pages) for
    /// a consistent copy of the RAM: see [`Frozen`].
    pub fn freeze(&self) -> Frozen<'_> {
        Frozen {
            shared: &self.shared,
            state: self.lock(),
        }
    }

    /// Moves every tiered page back into the file and stops the tier: from here on the
    /// file alone holds all of the areas' data (a VM about to become a clone template).
    pub fn dissolve(mut self) -> io::Result<u64> {
        // No page leaves from here on; faults are still served while pages come back.
        self.shared.budget.store(u64::MAX, Ordering::Relaxed);
        let n = self.freeze().materialize()?;
        self.stop();
        Ok(n)
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake_service();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The readers finish the jobs queued (each only installs a page or wakes its
        // waiters) and end.
        self.shared.jobs.wake_all();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        for a in &self.shared.areas {
            let _ = self.shared.uffd.unregister(a.host_addr, a.len);
        }
    }
}

impl Drop for Tier {
    /// Stops the service thread and unregisters the areas: only drop a tier whose areas
    /// are no longer used (the VM ended) or after [`Tier::dissolve`].
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running thread's CPU time; `None` once it has ended (it has no clock then: the
/// threads add their own last reading to the counters as they end).
fn thread_cpu_ns(thread: &JoinHandle<()>) -> Option<u64> {
    use std::os::unix::thread::JoinHandleExt;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the handle is not joined yet (`stop` takes them all), so its pthread_t is
    // valid; the call writes one clockid_t we own.
    if unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &mut clock) } != 0 {
        return None;
    }
    service::clock_ns(clock)
}

/// A tier held still: no page moves until this is dropped.
pub struct Frozen<'a> {
    shared: &'a Shared,
    state: MutexGuard<'a, State>,
}

impl Frozen<'_> {
    /// Writes every tiered page of file range `[from, to)` into `out` at its file offset
    /// (the file itself has holes there). Returns the bytes written.
    pub fn write_tiered(&self, out: &File, from: u64, to: u64) -> io::Result<u64> {
        let mut buf = vec![0u8; PAGE as usize];
        let mut written = 0;
        let last = (to.div_ceil(PAGE) as usize).min(self.state.table.pages());
        for pg in (from / PAGE) as usize..last {
            let at = self.state.table.get(pg);
            if at != Location::File {
                self.shared.load(&self.state, pg, at, &mut buf)?;
                out.write_all_at(&buf, pg as u64 * PAGE)?;
                written += PAGE;
            }
        }
        Ok(written)
    }

    /// Writes every tiered page back into the file and forgets it. Returns the bytes
    /// moved.
    pub fn materialize(&mut self) -> io::Result<u64> {
        let mut buf = vec![0u8; PAGE as usize];
        let mut moved = 0;
        for pg in 0..self.state.table.pages() {
            let at = self.state.table.get(pg);
            if at != Location::File {
                self.shared.load(&self.state, pg, at, &mut buf)?;
                self.shared.file.write_all_at(&buf, pg as u64 * PAGE)?;
                self.shared.forget(&mut self.state, pg);
                self.state.table.set_in_file(pg, true);
                moved += PAGE;
            }
        }
        Ok(moved)
    }
}

/// Marks the pages of `areas` that hold data in `base` as [`Location::Base`]; the RAM
/// `file` must have no data there. Returns how many.
fn mark_base(table: &mut Table, file: &File, base: &File, areas: &[Area]) -> io::Result<u64> {
    let base_len = base.metadata()?.len();
    let mut marked = 0;
    for a in areas {
        if !data_ranges(file, a.offset, a.offset + a.len)?.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the RAM file already holds data in {:#x}+{:#x}: a tier over a base file starts from an empty one",
                    a.offset, a.len
                ),
            ));
        }
        let end = (a.offset + a.len).min(base_len);
        for (from, to) in data_ranges(base, a.offset, end)? {
            for pg in (from / PAGE) as usize..to.div_ceil(PAGE) as usize {
                table.set_base(pg);
                marked += 1;
            }
        }
    }
    Ok(marked)
}

/// Reads one page of the base file at `offset`; past its end it reads zeros.
fn read_base(base: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match base.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

/// The data ranges `(start, end)` of `file` within `[from, to)` (SEEK_DATA / SEEK_HOLE).
pub fn data_ranges(file: &File, from: u64, to: u64) -> io::Result<Vec<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let mut ranges = Vec::new();
    let mut pos = from;
    while pos < to {
        // SAFETY: lseek on a descriptor the File owns; it only moves the file offset.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(err);
        }
        let data = data as u64;
        if data >= to {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let end = (hole as u64).min(to);
        ranges.push((data, end));
        pos = end;
    }
    Ok(ranges)
}

/// Punches `[offset, offset + len)` out of `file`.
pub(crate) fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor we hold; punching only frees the file's pages
    // (its mappings then read them back through faults).
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
