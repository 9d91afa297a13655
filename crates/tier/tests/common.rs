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

    fn start(size: u64, budget: u64, base: Option<Arc<File>>, swap_dir: PathBuf) -> Region {
        Region::try_start(size, budget, base, swap_dir)
            .unwrap_or_else(|e| panic!("cannot start a tier (this test needs it): {e}"))
    }

    /// A region, its data in `base` if given; the tier's error if it does not start.
    fn try_start(
        size: u64,
        budget: u64,
        base: Option<Arc<File>>,
        swap_dir: PathBuf,
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
