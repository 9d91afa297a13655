//! `PmemRegion`: reserve a host range, map a pcow chain into it, start the fault service.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pcow::{EntryKind, SharedChain, UNIT_SIZE};

use crate::error::{sys, PmemError, Result};
use crate::fault::{push_run, Counters, Inner, Run, State, WriteFault, PAGE};
use crate::staging::Staging;
use crate::uffd::{Uffd, REGISTER_MISSING, REGISTER_WP};
use crate::{segv, service};

/// Options for [`PmemRegion::map`].
#[derive(Clone, Debug)]
pub struct MapOptions {
    /// Bytes to map (rounded up to 4 KiB); `None` = the chain's virtual size.
    pub size: Option<u64>,
    /// Clusters with at most this many 4 KiB units are copied whole on the first write to a
    /// lower-layer page (cheaper than several 4 KiB copies); larger ones 4 KiB at a time.
    pub whole_cluster_units: u32,
    /// Clusters the background thread keeps pre-allocated at the end of the top file.
    pub pool_clusters: u64,
    /// Keep the next few pool clusters mapped and pre-faulted outside the region (up to
    /// 4 MiB / 64 clusters), so an expansion moves one into place with `mremap` instead of
    /// mapping it and pre-faulting the written page. Off by default: measured here, the
    /// `mremap` of a populated cluster costs as much as the `mmap` + page pre-fault it saves
    /// (docs/benchmarks.md `## pmem`); it pays where the first write to a file page is slow.
    pub staging: bool,
    /// Both ends of a fault round trip poll instead of sleeping for up to this long: the
    /// service thread after serving a fault keeps reading for the next one (a burst skips
    /// its sleep/wake), and a host thread's SIGSEGV handler polls for its completion before
    /// sleeping on a futex. Both yield the CPU between polls (a woken faulting thread usually
    /// runs on the same CPU). Costs at most this much CPU time per burst; zero disables it.
    pub spin: Duration,
    /// Serve a host thread's write fault on a read-only lower-layer page (SIGSEGV) on the
    /// faulting thread, inside the signal handler, instead of handing it to the service
    /// thread: no hand-over, and no TLB shoot-down IPI for the `mmap` over the read-only
    /// page while the faulting thread polls on another CPU (docs/benchmarks.md `## pmem`).
    /// Falls back to the service thread where it cannot (see the `segv` module).
    pub cow_on_faulting_thread: bool,
    /// Pre-fault the written page writable (`MADV_POPULATE_WRITE`) after an expansion or a
    /// copy-up, before the faulting thread resumes, so its retried store does not fault
    /// again. Off by default: measured here the madvise costs 0.5–1.4 µs more than the
    /// fault it saves, and it sits on the faulting thread's path either way.
    pub prefault: bool,
    /// Map at this host address (aligned to the cluster size and 2 MiB, the range free)
    /// instead of a new one: a VM's region moved onto another chain keeps the address its
    /// memory slots and devices know (a clone template's parent going on in an overlay).
    pub at: Option<u64>,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            size: None,
            whole_cluster_units: 1,
            pool_clusters: 256,
            staging: false,
            spin: Duration::from_micros(50),
            cow_on_faulting_thread: true,
            prefault: false,
            at: None,
        }
    }
}

/// Fault-service statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PmemStats {
    /// Clusters allocated by thin expansion (first write to an unallocated cluster).
    pub expansions: u64,
    /// Copy-on-write faults served.
    pub cow_faults: u64,
    /// 4 KiB units copied up by copy-on-write.
    pub cow_units: u64,
    /// Reads of unallocated pages served with a zero page.
    pub read_faults: u64,
    /// Write faults that arrived through userfaultfd (placeholders).
    pub uffd_write_faults: u64,
    /// Write faults of host threads on read-only pages (SIGSEGV path).
    pub segv_faults: u64,
    /// Of those, the faults served inside the signal handler on the faulting thread
    /// ([`MapOptions::cow_on_faulting_thread`]); the rest went to the service thread.
    pub segv_in_handler: u64,
    /// Write faults reported by the VMM for vCPUs ([`WriteFaultHandle`]).
    pub guest_hook_faults: u64,
    /// Of those, the writes whose pages were all writable already (the VMM's read-only
    /// slots were out of date, or another vCPU served the page first).
    pub guest_writes_already_writable: u64,
    /// Faults found already served by a racing fault.
    pub raced: u64,
    /// Expansions served by moving a staged (pre-mapped, pre-faulted) pool cluster.
    pub staged_hits: u64,
    /// Faults picked up while the service thread was polling after a previous one.
    pub spin_hits: u64,
    /// Pool clusters staged (mapped and pre-faulted outside the region) right now.
    pub staged_clusters: u64,
}

/// A pcow chain mapped at a contiguous host range, with its fault service running.
/// Dropping it stops the service and unmaps the range (call [`PmemRegion::flush`] first to
/// acknowledge the last writes).
pub struct PmemRegion {
    inner: Arc<Inner>,
    uffd: Arc<Uffd>,
    stop: Arc<OwnedFd>,
    segv_slot: usize,
    _pipe_write: OwnedFd,
    threads: Vec<JoinHandle<()>>,
    startup: Duration,
    initial_runs: usize,
}

/// What [`WriteFaultHandle::guest_write`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestWrite {
    /// At least one page was allocated or copied up.
    Served,
    /// Every page was writable already; only the bytes (if any) were stored.
    AlreadyWritable,
}

/// A cheap, cloneable handle for the VMM's vCPU exit path (see
/// [`WriteFaultHandle::guest_write`]).
#[derive(Clone)]
pub struct WriteFaultHandle {
    inner: Arc<Inner>,
}

impl WriteFaultHandle {
    /// The region's sync point ([`PmemRegion::flush`]), for a device that flushes on the
    /// guest's request (virtio-pmem) while the region stays mapped.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// A vCPU wrote to region offset `offset` but the host page is read-only (a lower-layer
    /// cluster): on PVM this arrives as `KVM_EXIT_MMIO` with `is_write`, on hardware KVM as
    /// `EFAULT`/`KVM_EXIT_MEMORY_FAULT`. Copies the page up and maps it writable. If `data`
    /// is given (the MMIO exit's bytes, which KVM considers written once the exit returns),
    /// they are stored into the region; otherwise the caller re-runs the vCPU so the guest
    /// retries the store. Returns [`GuestWrite::AlreadyWritable`] when every page the write
    /// touches was writable already: the VMM's read-only view of the page is out of date
    /// (see [`WriteFaultHandle::readonly_ranges`]).
    pub fn guest_write(&self, offset: u64, data: Option<&[u8]>) -> Result<GuestWrite> {
        self.inner
            .counters
            .guest_hook_faults
            .fetch_add(1, Ordering::Relaxed);
        let len = data.map_or(1, |d| d.len().max(1) as u64);
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.inner.size)
            .ok_or(PmemError::OutOfRegion {
                addr: self.inner.base.wrapping_add(offset),
                base: self.inner.base,
                size: self.inner.size,
            })?;
        let mut outcome = GuestWrite::AlreadyWritable;
        let mut page = offset & !(PAGE - 1);
        while page < end {
            if self.inner.write_fault(page)? == WriteFault::Served {
                outcome = GuestWrite::Served;
            }
            page += PAGE;
        }
        if let Some(d) = data {
            // SAFETY: [offset, offset+len) is inside the region and now mapped writable.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    d.as_ptr(),
                    (self.inner.base + offset) as *mut u8,
                    d.len(),
                );
            }
        }
        if outcome == GuestWrite::AlreadyWritable {
            self.inner
                .counters
                .guest_writes_already_writable
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    /// The `(offset, len)` ranges that are still read-only lower-layer pages: those of
    /// [`PmemRegion::lower_layer_ranges`] minus every page copied up since. A VMM that maps
    /// lower layers read-only for its vCPUs re-registers its slots from this, so writes to
    /// copied-up pages stop exiting. Sorted and disjoint.
    pub fn readonly_ranges(&self) -> Vec<(u64, u64)> {
        self.inner.readonly_ranges()
    }
    /// Size of the region in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }
}

fn reserve(len: u64, align: u64, at: Option<u64>) -> Result<u64> {
    if let Some(addr) = at {
        if addr == 0 || addr % align != 0 {
            return Err(PmemError::Invalid(format!(
                "cannot map at {addr:#x}: not aligned to {align:#x}"
            )));
        }
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the kernel fails
        // (or, before 4.17, returns another address, checked below) if the range is taken.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys(
                "mmap (reserve the region at its old address)",
                addr,
                len,
            ));
        }
        if p as u64 != addr {
            // SAFETY: unmapping the reservation the kernel placed elsewhere, ours alone.
            unsafe { libc::munmap(p, len as usize) };
            return Err(PmemError::Invalid(format!(
                "cannot map at {addr:#x}: the kernel placed the region elsewhere"
            )));
        }
        return Ok(addr);
    }
    let total = len + align;
    // SAFETY: a fresh anonymous private reservation; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(sys("mmap (reserve the region)", 0, total));
    }
    let start = p as u64;
    let base = start.next_multiple_of(align);
    // SAFETY: trimming the unaligned head and the tail of our own reservation.
    unsafe {
        if base > start {
            libc::munmap(start as *mut libc::c_void, (base - start) as usize);
        }
        let end = base + len;
        if start + total > end {
            libc::munmap(end as *mut libc::c_void, (start + total - end) as usize);
        }
    }
    Ok(base)
}

/// The initial layout: runs of file pages for every cluster some layer holds.
fn initial_runs(chain: &SharedChain, size: u64) -> Vec<Run> {
    let c = chain.read();
    let cs = c.cluster_size();
    let units = (cs / UNIT_SIZE) as u32;
    let clusters = size.div_ceil(cs);
    let mut logicals: Vec<u64> = Vec::new();
    for layer in 0..c.layer_count() {
        logicals.extend(
            c.layer_clusters(layer)
                .into_iter()
                .map(|(l, _)| l)
                .filter(|&l| l < clusters),
        );
    }
    logicals.sort_unstable();
    logicals.dedup();
    let mut runs = Vec::new();
    for l in logicals {
        let Some(loc) = c.lookup(l) else { continue };
        if loc.kind != EntryKind::Data {
            continue; // tombstone: reads as zeros, served like a placeholder
        }
        if loc.is_full(units) {
            push_run(
                &mut runs,
                Run {
                    offset: l * cs,
                    len: cs,
                    image: loc.image,
                    file_offset: loc.file_offset,
                    writable: loc.writable,
                },
            );
            continue;
        }
        for u in 0..units {
            let offset = l * cs + u as u64 * UNIT_SIZE;
            if loc.writable && loc.unit_valid(u) {
                push_run(
                    &mut runs,
                    Run {
                        offset,
                        len: UNIT_SIZE,
                        image: 0,
                        file_offset: loc.file_offset + u as u64 * UNIT_SIZE,
                        writable: true,
                    },
                );
            } else if let pcow::UnitSource::File { image, file_offset } = c.resolve_unit(l, u) {
                push_run(
                    &mut runs,
                    Run {
                        offset,
                        len: UNIT_SIZE,
                        image,
                        file_offset,
                        writable: false,
                    },
                );
            }
        }
    }
    runs
}

impl PmemRegion {
    /// Maps `chain` (opened writable for writes to be served) and starts its fault service.
    pub fn map(chain: Arc<SharedChain>, opts: MapOptions) -> Result<PmemRegion> {
        let started = Instant::now();
        let (cs, vsize) = {
            let c = chain.read();
            (c.cluster_size(), c.virtual_size())
        };
        let size = opts.size.unwrap_or(vsize).next_multiple_of(PAGE);
        if size == 0 || size > vsize.next_multiple_of(PAGE) {
            return Err(PmemError::Invalid(format!(
                "mapping size {size} must be between 4 KiB and the image's virtual size {vsize}"
            )));
        }
        let files = chain.layer_files();
        let mut fds = Vec::new();
        for f in &files {
            fds.push(f.fd.ok_or_else(|| {
                PmemError::Invalid(format!("{} is not a real file", f.path.display()))
            })?);
        }
        let writable = files.first().is_some_and(|f| f.writable);
        let fds0 = fds[0];
        let reserved = size.next_multiple_of(cs);
        let base = reserve(reserved, cs.max(2 << 20), opts.at)?;
        let uffd =
            Uffd::new(crate::uffd::FEATURE_PAGEFAULT_FLAG_WP | crate::uffd::FEATURE_THREAD_ID)
                .map_err(PmemError::Userfaultfd)?;
        let runs = initial_runs(&chain, size);
        let inner = Arc::new(Inner {
            base,
            size,
            reserved,
            cluster: cs,
            units: (cs / UNIT_SIZE) as u32,
            chain: chain.clone(),
            fds,
            writable,
            whole_cluster_units: opts.whole_cluster_units,
            initial_readonly: runs
                .iter()
                .filter(|r| !r.writable)
                .map(|r| (r.offset, r.len.min(size - r.offset.min(size))))
                .filter(|&(_, len)| len > 0)
                .collect(),
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            refill: Mutex::new((0, false)),
            refill_cv: Condvar::new(),
            next_tail: std::sync::atomic::AtomicU64::new(0),
            staging: Staging::new(cs, fds0, opts.staging && writable),
            prefault: opts.prefault,
        });
        inner
            .next_tail
            .store(service::initial_tail(&inner), Ordering::Relaxed);
        let unmap = |e: PmemError| {
            // SAFETY: unmapping our own reservation on the error path.
            unsafe { libc::munmap(base as *mut libc::c_void, reserved as usize) };
            e
        };
        uffd.register(base, reserved, REGISTER_MISSING | REGISTER_WP)
            .map_err(|e| {
                unmap(PmemError::Sys {
                    op: "userfaultfd register (MISSING|WP)",
                    addr: base,
                    len: reserved,
                    source: e,
                })
            })?;
        for r in &runs {
            inner.map_run(r).map_err(unmap)?;
        }
        let mut pipe = [0i32; 2];
        // SAFETY: pipe2 fills two descriptors we then own.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(unmap(sys("pipe2", 0, 0)));
        }
        // SAFETY: fresh descriptors from pipe2.
        let (pipe_read, pipe_write) =
            unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        // SAFETY: eventfd returns a fresh descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(unmap(sys("eventfd", 0, 0)));
        }
        // SAFETY: fresh descriptor.
        let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
        // `inner` outlives the slot: `Drop` unregisters it first, while holding `inner`.
        let segv_slot = segv::register(
            base,
            size,
            pipe_write.as_raw_fd(),
            opts.spin,
            opts.cow_on_faulting_thread.then_some(&*inner),
        )
        .map_err(unmap)?;
        let uffd = Arc::new(uffd);
        let mut threads = Vec::new();
        let spin = opts.spin;
        {
            let (inner, uffd, stop) = (inner.clone(), uffd.clone(), stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("pmem-faults".into())
                    .spawn(move || {
                        densevm_seccomp::enter(densevm_seccomp::ThreadKind::PmemFaults);
                        service::serve(&inner, &uffd, pipe_read, &stop, spin)
                    })
                    .map_err(|e| {
                        segv::unregister(segv_slot);
                        unmap(PmemError::Sys {
                            op: "spawn fault thread",
                            addr: base,
                            len: 0,
                            source: e,
                        })
                    })?,
            );
        }
        if writable {
            let inner2 = inner.clone();
            let pool = opts.pool_clusters;
            if let Ok(t) = std::thread::Builder::new()
                .name("pmem-pool".into())
                .spawn(move || {
                    densevm_seccomp::enter(densevm_seccomp::ThreadKind::PmemPool);
                    service::refill(&inner2, pool)
                })
            {
                threads.push(t);
            }
        }
        Ok(PmemRegion {
            inner,
            uffd,
            stop,
            segv_slot,
            _pipe_write: pipe_write,
            threads,
            startup: started.elapsed(),
            initial_runs: runs.len(),
        })
    }

    /// Host address of the first byte.
    pub fn host_addr(&self) -> u64 {
        self.inner.base
    }
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }
    /// Cluster size of the chain.
    pub fn cluster_size(&self) -> u64 {
        self.inner.cluster
    }
    /// The mapped chain.
    pub fn chain(&self) -> &Arc<SharedChain> {
        &self.inner.chain
    }
    /// Time [`PmemRegion::map`] took.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }
    /// Number of file runs mapped at start-up (each one `mmap` call).
    pub fn initial_runs(&self) -> usize {
        self.initial_runs
    }
    /// The `(offset, len)` ranges mapped read-only from snapshots and base images at
    /// start-up: a VMM maps them read-only for its vCPUs too (`KVM_MEM_READONLY`), so a
    /// guest write there reaches [`WriteFaultHandle::guest_write`] on every KVM flavour.
    /// Pages copied up later stay inside these ranges until the VMM re-registers its slots
    /// from [`WriteFaultHandle::readonly_ranges`].
    pub fn lower_layer_ranges(&self) -> &[(u64, u64)] {
        &self.inner.initial_readonly
    }
    /// A handle for the VMM's vCPU write-fault exit path.
    pub fn write_fault_handle(&self) -> WriteFaultHandle {
        WriteFaultHandle {
            inner: self.inner.clone(),
        }
    }
    /// Serves a write to region offset `offset` now (as a fault would), e.g. before a device
    /// thread writes through the mapping.
    pub fn prepare_write(&self, offset: u64) -> Result<()> {
        self.inner.write_fault(offset).map(|_| ())
    }
    /// Acknowledges every write completed so far: copied data durable, then the bitmaps
    /// recorded, then durable (docs/pcow.md, sync point).
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    /// Fault statistics.
    pub fn stats(&self) -> PmemStats {
        let c = &self.inner.counters;
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        PmemStats {
            expansions: g(&c.expansions),
            cow_faults: g(&c.cow_faults),
            cow_units: g(&c.cow_units),
            read_faults: g(&c.read_faults),
            uffd_write_faults: g(&c.uffd_write_faults),
            segv_faults: g(&c.segv_faults),
            segv_in_handler: g(&c.segv_in_handler),
            guest_hook_faults: g(&c.guest_hook_faults),
            guest_writes_already_writable: g(&c.guest_writes_already_writable),
            raced: g(&c.raced),
            staged_hits: g(&c.staged_hits),
            spin_hits: g(&c.spin_hits),
            staged_clusters: self.inner.staging.len(),
        }
    }
    /// Number of VMAs (lines of /proc/self/maps) covering the region.
    pub fn vma_count(&self) -> Result<usize> {
        let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| PmemError::Sys {
            op: "read /proc/self/maps",
            addr: 0,
            len: 0,
            source: e,
        })?;
        let (lo, hi) = (self.inner.base, self.inner.base + self.inner.reserved);
        Ok(maps
            .lines()
            .filter_map(|l| {
                let range = l.split_whitespace().next()?;
                let (a, b) = range.split_once('-')?;
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            })
            .filter(|&(a, b)| a < hi && b > lo)
            .count())
    }
}

impl Drop for PmemRegion {
    fn drop(&mut self) {
        segv::unregister(self.segv_slot);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe {
            libc::write(
                self.stop.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        {
            let mut r = self.inner.refill.lock().unwrap_or_else(|p| p.into_inner());
            r.1 = true;
            self.inner.refill_cv.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = self.uffd.unregister(self.inner.base, self.inner.reserved);
        // SAFETY: the region is ours; callers must not use it after dropping (documented on
        // `host_addr` users such as the VMM, which stop the VM first).
        unsafe {
            libc::munmap(
                self.inner.base as *mut libc::c_void,
                self.inner.reserved as usize,
            )
        };
    }
}
