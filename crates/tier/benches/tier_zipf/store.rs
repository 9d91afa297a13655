//! The key-value store in shared memory, its values and checksums, and the workers that
//! send it requests.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use densevm_tier::PAGE;

use super::zipf::{Rng, Zipf};
use super::{die, SLOT, STRIPES, VALUE};

pub(crate) struct Store {
    pub(crate) file: Arc<File>,
    pub(crate) base: *mut u8,
    size: u64,
    /// Seqlocks, one per stripe of keys: odd while an update writes.
    seq: Vec<AtomicU32>,
}

// SAFETY: the mapping is shared memory every thread may touch; slot contents are guarded
// by the seqlocks (readers validate, writers exclude each other).
unsafe impl Send for Store {}
// SAFETY: as above.
unsafe impl Sync for Store {}

impl Store {
    /// A memfd mapped `MAP_SHARED`, or (`anon`) private anonymous memory with the memfd
    /// only as a placeholder.
    pub(crate) fn new(size: u64, anon: bool) -> Store {
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
        let fd = unsafe { libc::memfd_create(c"tier-zipf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            die(&format!(
                "memfd_create: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let file = Arc::new(unsafe { File::from_raw_fd(fd) });
        if !anon {
            file.set_len(size)
                .unwrap_or_else(|e| die(&format!("sizing the memfd: {e}")));
        }
        let (flags, fd) = if anon {
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
        } else {
            (libc::MAP_SHARED, fd)
        };
        // SAFETY: a new mapping (of the whole file, or anonymous), unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            die(&format!("mmap: {}", std::io::Error::last_os_error()));
        }
        Store {
            file,
            base: p.cast(),
            size,
            seq: (0..STRIPES).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    pub(crate) fn slot(&self, k: usize) -> *mut u64 {
        debug_assert!(((k + 1) * SLOT) as u64 <= self.size);
        // SAFETY: k is a key of the store, so its slot lies inside the mapping.
        unsafe { self.base.add(k * SLOT).cast() }
    }

    pub(crate) fn lock(&self, k: usize) -> &AtomicU32 {
        &self.seq[k % STRIPES]
    }

    /// Writes key `k` at `version` (an update: under its stripe's seqlock). `buf` is
    /// scratch of [`VALUE`] bytes.
    pub(crate) fn write(&self, k: usize, version: u32, buf: &mut [u8]) {
        value(k as u64, version, buf);
        let sum = checksum(k as u64, version, buf);
        let l = self.lock(k);
        let mut s = l.load(Ordering::Relaxed);
        loop {
            if s & 1 == 0 {
                match l.compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(now) => s = now,
                }
            } else {
                std::hint::spin_loop();
                s = l.load(Ordering::Relaxed);
            }
        }
        fence(Ordering::Release);
        let p = self.slot(k);
        // SAFETY: the slot lies inside the mapping (see `slot`) and we hold its stripe:
        // no other writer; readers retry what they saw meanwhile.
        unsafe {
            p.write_volatile(k as u64);
            p.add(1)
                .write_volatile(u64::from(version) | u64::from(sum) << 32);
            for (i, w) in buf.chunks_exact(8).enumerate() {
                p.add(2 + i)
                    .write_volatile(u64::from_ne_bytes(w.try_into().unwrap()));
            }
        }
        l.store(s + 2, Ordering::Release);
    }

    /// Reads key `k` into `out` (header words then value words), consistently; returns
    /// whether its key and checksum match.
    pub(crate) fn read(&self, k: usize, out: &mut [u64; SLOT / 8]) -> bool {
        let l = self.lock(k);
        let p = self.slot(k);
        loop {
            let s = l.load(Ordering::Acquire);
            if s & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            for (i, w) in out.iter_mut().enumerate() {
                // SAFETY: inside the mapping; a torn read is detected by the sequence
                // number below and retried.
                *w = unsafe { p.add(i).read_volatile() };
            }
            fence(Ordering::Acquire);
            if l.load(Ordering::Relaxed) == s {
                break;
            }
        }
        let version = out[1] as u32;
        let sum = (out[1] >> 32) as u32;
        // SAFETY: viewing 126 initialized u64 words as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(out[2..].as_ptr().cast::<u8>(), VALUE) };
        out[0] == k as u64 && checksum(k as u64, version, bytes) == sum
    }

    /// The version key `k` holds (after the workers stopped).
    pub(crate) fn version(&self, k: usize) -> u32 {
        // SAFETY: inside the mapping; nothing writes any more.
        unsafe { self.slot(k).add(1).read_volatile() as u32 }
    }

    /// Whether slot `k` holds exactly `want` at `version`.
    pub(crate) fn equals(&self, k: usize, version: u32, want: &[u8]) -> bool {
        let mut out = [0u64; SLOT / 8];
        let ok = self.read(k, &mut out);
        // SAFETY: viewing initialized u64 words as bytes.
        let got = unsafe { std::slice::from_raw_parts(out[2..].as_ptr().cast::<u8>(), VALUE) };
        ok && out[1] as u32 == version && got == want
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (the tier was dropped first).
        unsafe { libc::munmap(self.base.cast(), self.size as usize) };
    }
}

/// The bytes of key `k` at `version`: 3/4 words of a small vocabulary, 1/4 random.
pub(crate) fn value(k: u64, version: u32, out: &mut [u8]) {
    const WORDS: [&str; 64] = [
        "the",
        "user",
        "session",
        "token",
        "price",
        "amount",
        "status",
        "active",
        "pending",
        "order",
        "item",
        "quantity",
        "country",
        "city",
        "name",
        "email",
        "created",
        "updated",
        "true",
        "false",
        "null",
        "value",
        "count",
        "total",
        "region",
        "device",
        "mobile",
        "desktop",
        "browser",
        "version",
        "score",
        "level",
        "group",
        "admin",
        "guest",
        "cart",
        "product",
        "category",
        "review",
        "rating",
        "comment",
        "shipping",
        "address",
        "street",
        "payment",
        "method",
        "card",
        "invoice",
        "balance",
        "currency",
        "euro",
        "dollar",
        "event",
        "click",
        "view",
        "search",
        "query",
        "result",
        "page",
        "index",
        "cache",
        "hit",
        "miss",
        "timestamp",
    ];
    let mut x = Rng::new(k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(version) << 40);
    let text = out.len() * 3 / 4;
    let mut i = 0;
    while i < text {
        let w = WORDS[(x.next() % 64) as usize].as_bytes();
        for &b in w.iter().chain(b" ") {
            if i < text {
                out[i] = b;
                i += 1;
            }
        }
    }
    for c in out[text..].chunks_mut(8) {
        let r = x.next().to_ne_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
}

/// A 32-bit checksum of a slot's key, version and value (word-wise multiply-xor).
pub(crate) fn checksum(k: u64, version: u32, v: &[u8]) -> u32 {
    let mut h = k ^ u64::from(version).rotate_left(32) ^ 0x51_7cc1_b727_220a;
    for w in v.chunks_exact(8) {
        let w = u64::from_ne_bytes(w.try_into().unwrap());
        h = (h ^ w).wrapping_mul(0x2127_599b_f432_5c37).rotate_left(29);
    }
    (h ^ h >> 32) as u32
}

/// The LZ4 ratio of a sample of the store's pages (what the tier's compressed store sees).
pub(crate) fn lz4_ratio(store: &Store, keys: usize) -> f64 {
    let pages = keys * SLOT / PAGE as usize;
    let (mut raw, mut packed) = (0usize, 0usize);
    let mut page = vec![0u8; PAGE as usize];
    for pg in (0..pages).step_by((pages / 256).max(1)) {
        // SAFETY: a page inside the mapping, read while no worker runs.
        let src = unsafe {
            std::slice::from_raw_parts(store.base.add(pg * PAGE as usize), PAGE as usize)
        };
        page.copy_from_slice(src);
        raw += page.len();
        packed += lz4_flex::block::compress(&page).len();
    }
    raw as f64 / packed.max(1) as f64
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn worker(
    t: usize,
    store: &Store,
    zipf: &Zipf,
    perm: &[u32],
    work: Duration,
    stop: &AtomicBool,
    ops: &AtomicU64,
    bad: &AtomicU64,
) {
    let mut rng = Rng::new(0x1234_5678 + t as u64 * 0x9e37_79b9);
    let mut slot = [0u64; SLOT / 8];
    let mut buf = vec![0u8; VALUE];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..256 {
            let k = perm[zipf.next(&mut rng) as usize] as usize;
            if rng.next() % 100 < 5 {
                // An update: the next version (read under the lock's protection is not
                // needed: two updates of one key may pick the same version, both valid).
                let ver = store.version(k).wrapping_add(1);
                store.write(k, ver, &mut buf);
            } else if !store.read(k, &mut slot) {
                bad.fetch_add(1, Ordering::Relaxed);
            }
            if !work.is_zero() {
                let t0 = Instant::now();
                while t0.elapsed() < work {
                    std::hint::spin_loop();
                }
            }
        }
        n += 256;
        ops.store(n, Ordering::Relaxed);
    }
}
