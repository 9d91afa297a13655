//! A tiered region for process-level tests: a memfd mapped MAP_SHARED, tiered from the
//! start. Needs userfaultfd that sees shmem minor faults (root or /dev/userfaultfd).

#![allow(dead_code)]

use std::fs::File;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use densevm_tier::{Area, Tier, TierConfig, PAGE};

pub const MIB: u64 = 1 << 20;

pub struct Region {
    pub file: Arc<File>,
    pub addr: u64,
    pub size: u64,
    pub tier: Option<Tier>,
}

impl Region {
    pub fn new(size: u64, budget: u64) -> Region {
        Region::start(size, budget, None, std::env::temp_dir())
    }

    /// A region whose data starts in `base` (read on first access).
    pub fn with_base(size: u64, budget: u64, base: Arc<File>) -> Region {
        Region::start(size, budget, Some(base), std::env::temp_dir())
    }

    /// A region whose swap file is in `swap_dir`.
    pub fn with_swap_dir(size: u64, budget: u64, swap_dir: PathBuf) -> Region {
        Region::start(size, budget, None, swap_dir)
    }

    /// A region whose swap-file reads go to `readers` threads; its swap file is in
    /// /var/tmp, on disk (readers only take direct reads, which tmpfs before Linux 6.6
    /// refuses).
    pub fn with_readers(size: u64, budget: u64, readers: usize) -> Region {
        Region::try_start(size, budget, None, "/var/tmp".into(), readers, true)
            .unwrap_or_else(|e| panic!("cannot start a tier (this test needs it): {e}"))
    }

    fn start(size: u64, budget: u64, base: Option<Arc<File>>, swap_dir: PathBuf) -> Region {
        Region::try_start(size, budget, base, swap_dir, 0, true)
            .unwrap_or_else(|e| panic!("cannot start a tier (this test needs it): {e}"))
    }

    /// A region whose tier's service thread polls for faults or not
    /// (`TierConfig::poll_faults`).
    pub fn with_poll(size: u64, budget: u64, poll_faults: bool) -> Region {
        Region::try_start(size, budget, None, std::env::temp_dir(), 0, poll_faults)
            .unwrap_or_else(|e| panic!("cannot start a tier (this test needs it): {e}"))
    }

    /// A region, its data in `base` if given; the tier's error if it does not start.
    fn try_start(
        size: u64,
        budget: u64,
        base: Option<Arc<File>>,
        swap_dir: PathBuf,
        swap_readers: usize,
        poll_faults: bool,
    ) -> Result<Region, densevm_tier::TierError> {
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
        let fd = unsafe { libc::memfd_create(c"tier-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor.
        let file = Arc::new(unsafe { File::from_raw_fd(fd) });
        file.set_len(size).unwrap();
        // SAFETY: a new shared mapping of the whole file, unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let addr = p as u64;
        let tier = Tier::start(
            file.clone(),
            vec![Area {
                offset: 0,
                host_addr: addr,
                len: size,
            }],
            TierConfig {
                budget,
                compressed_max: None,
                swap_dir,
                base,
                swap_readers,
                poll_faults,
            },
        );
        let tier = match tier {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: the mapping made above, not used by anyone.
                unsafe { libc::munmap(p, size as usize) };
                return Err(e);
            }
        };
        Ok(Region {
            file,
            addr,
            size,
            tier: Some(tier),
        })
    }

    pub fn tier(&self) -> &Tier {
        self.tier.as_ref().unwrap()
    }

    pub fn pages(&self) -> u64 {
        self.size / PAGE
    }

    /// Page `pg` as a slice of words.
    #[allow(clippy::mut_from_ref)]
    pub fn page(&self, pg: u64) -> &mut [u64] {
        assert!(pg < self.pages());
        // SAFETY: inside the live mapping; tests give each page to one thread at a time.
        unsafe { std::slice::from_raw_parts_mut((self.addr + pg * PAGE) as *mut u64, 512) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        drop(self.tier.take());
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.size as usize) };
    }
}

/// Fills `page` for (page, round): half the pages compress (a repeated word), half are
/// pseudo-random (they do not).
pub fn fill(page: &mut [u64], pg: u64, round: u64) {
    let mut x = (pg << 20) ^ (round << 8) ^ 0x9e37_79b9_7f4a_7c15;
    for (i, w) in page.iter_mut().enumerate() {
        *w = if pg % 2 == 0 {
            pg * 1000 + round
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x ^ i as u64
        };
    }
}

/// Whether `page` holds what `fill` wrote for (page, round).
pub fn check(page: &[u64], pg: u64, round: u64) -> bool {
    let mut want = vec![0u64; 512];
    fill(&mut want, pg, round);
    page == &want[..]
}

/// How far over the budget resident RAM may go: the tier's hard slack (1/32 of the
/// budget, at least 1 MiB), beyond which a faulting thread waits for pages to leave.
pub fn slack(budget: u64) -> u64 {
    (budget / 32).max(MIB)
}

/// Samples the region's resident bytes until `done`; returns the largest.
pub fn sampler(region: Arc<Region>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut max = 0;
        while !done.load(Ordering::Relaxed) {
            max = max.max(region.tier().stats().resident);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        max
    })
}

/// Waits up to 20 s for the region's resident bytes to come within `budget` plus the
/// slack (idle pages only leave once armed and seen again, so time must pass); panics
/// with `what` and the tier's counters if they do not.
pub fn wait_within(region: &Region, budget: u64, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while region.tier().stats().resident > budget + slack(budget) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            region.tier().stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// An unlinked scratch file in the temporary directory.
pub fn tempfile() -> File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(std::env::temp_dir())
        .unwrap()
}

/// Runs the threads `spawn` starts to their end while sampling the region's resident
/// bytes; returns the tier's counters then and the largest resident bytes seen.
pub fn sampled(
    region: &Arc<Region>,
    spawn: impl FnOnce() -> Vec<std::thread::JoinHandle<()>>,
) -> (densevm_tier::TierStats, u64) {
    let done = Arc::new(AtomicBool::new(false));
    let peak = sampler(region.clone(), done.clone());
    for t in spawn() {
        t.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let peak = peak.join().unwrap();
    let stats = region.tier().stats();
    eprintln!("stats: {stats:?}, peak resident {} KiB", peak >> 10);
    (stats, peak)
}

/// What [`eight_threads`] found: the tier's counters at the end, the largest resident
/// bytes sampled meanwhile, and how many pages read back wrong.
pub struct EightThreads {
    pub stats: densevm_tier::TierStats,
    pub peak: u64,
    pub bad: u64,
}

impl EightThreads {
    /// Asserts that no page read back wrong and resident RAM stayed within `budget` plus
    /// the slack.
    pub fn check_within(&self, budget: u64) {
        assert_eq!(self.bad, 0, "pages read back wrong: {:?}", self.stats);
        assert!(
            self.peak <= budget + slack(budget),
            "resident peaked at {} KiB over a {} KiB budget",
            self.peak >> 10,
            budget >> 10
        );
    }
}

/// Eight threads each take every eighth page of `region`, write it three times over (each
/// round checking the last) and check the last round: the pages leave and come back in
/// between. Checks a checksum over the whole region at the end.
pub fn eight_threads(region: &Arc<Region>) -> EightThreads {
    use std::sync::atomic::AtomicU64;
    let bad = Arc::new(AtomicU64::new(0));
    let (stats, peak) = sampled(region, || {
        (0..8u64)
            .map(|t| {
                let (region, bad) = (region.clone(), bad.clone());
                std::thread::spawn(move || {
                    let mine: Vec<u64> = (0..region.pages()).filter(|p| p % 8 == t).collect();
                    for round in 0..3 {
                        for &pg in &mine {
                            if round > 0 && !check(region.page(pg), pg, round - 1) {
                                bad.fetch_add(1, Ordering::Relaxed);
                            }
                            fill(region.page(pg), pg, round);
                        }
                    }
                    for &pg in &mine {
                        if !check(region.page(pg), pg, 2) {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect()
    });
    // A checksum over the whole region, read by one thread at the end.
    let sum: u64 = (0..region.pages())
        .map(|pg| region.page(pg).iter().fold(0u64, |a, &w| a.wrapping_add(w)))
        .fold(0, u64::wrapping_add);
    let mut want = 0u64;
    let mut page = vec![0u64; 512];
    for pg in 0..region.pages() {
        fill(&mut page, pg, 2);
        want = page.iter().fold(want, |a, &w| a.wrapping_add(w));
    }
    assert_eq!(sum, want, "the region's checksum");
    EightThreads {
        stats,
        peak,
        bad: bad.load(Ordering::Relaxed),
    }
}

/// What a snapshot does, into a scratch file: with the tier frozen, the file's data, then
/// the tiered pages over its holes. Returns the copy and the tiered bytes written.
pub fn snapshot_copy(region: &Region) -> (File, u64) {
    use std::os::unix::fs::FileExt;
    let out = tempfile();
    let frozen = region.tier().freeze();
    let mut buf = vec![0u8; PAGE as usize];
    for pg in 0..region.pages() {
        let n = region.file.read_at(&mut buf, pg * PAGE).unwrap();
        assert_eq!(n, PAGE as usize);
        if buf.iter().any(|&b| b != 0) {
            out.write_all_at(&buf, pg * PAGE).unwrap();
        }
    }
    let tiered = frozen.write_tiered(&out, 0, region.size).unwrap();
    drop(frozen);
    (out, tiered)
}

/// Asserts that every page of `file` (`pages` of them) holds what `fill` wrote for
/// `round`; `what` names the file in the message.
pub fn check_file(file: &File, pages: u64, round: u64, what: &str) {
    use std::os::unix::fs::FileExt;
    let mut words = vec![0u64; 512];
    let mut buf = vec![0u8; PAGE as usize];
    for pg in 0..pages {
        file.read_exact_at(&mut buf, pg * PAGE).unwrap();
        for (w, b) in words.iter_mut().zip(buf.chunks_exact(8)) {
            *w = u64::from_ne_bytes(b.try_into().unwrap());
        }
        assert!(check(&words, pg, round), "{what}: page {pg} wrong");
    }
}
