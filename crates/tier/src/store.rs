//! The slower tiers a page can live in while it is not in the RAM file: a compressed
//! in-memory store (LZ4) and a file (an unlinked temporary file whose page cache is
//! dropped once written back, and read back with direct I/O). Zero pages are kept in
//! neither: they are holes.

use std::cell::{Cell, RefCell};
use std::collections::{HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use crate::slab::Slab;
use crate::PAGE;

/// A page compressed to more than this is not worth the compressed store (it goes to the
/// file): 3/4 of a page.
pub const COMPRESS_LIMIT: usize = 3072;

/// Compressed pages in memory (in a [`Slab`] of size classes), with their eviction order
/// so the oldest can be demoted to the file when the store is full.
#[derive(Default)]
pub(crate) struct Compressed {
    slab: Slab,
    /// (slot, page) in the order they were stored; entries whose slot was freed or
    /// reused are skipped when popped.
    order: VecDeque<(u32, u32)>,
}

impl Compressed {
    /// Compresses `data` (one page); `None` if it does not shrink below
    /// [`COMPRESS_LIMIT`].
    pub fn compress(data: &[u8]) -> Option<Box<[u8]>> {
        // Into a scratch buffer, then one allocation of the exact size (short-lived: the
        // store copies it into its slab).
        thread_local! {
            static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        SCRATCH.with_borrow_mut(|out| {
            out.resize(lz4_flex::block::get_maximum_output_size(data.len()), 0);
            let n = lz4_flex::block::compress_into(data, out).ok()?;
            (n <= COMPRESS_LIMIT).then(|| Box::from(&out[..n]))
        })
    }

    /// Stores compressed bytes for `page`; returns the slot. Fails if `data` is longer than
    /// [`COMPRESS_LIMIT`] or no memory can be mapped for it.
    pub fn insert(&mut self, page: u32, data: &[u8]) -> io::Result<u32> {
        let slot = self.slab.insert(page, data)?;
        self.order.push_back((slot, page));
        Ok(slot)
    }

    /// Decompresses `slot` into `out` (one page).
    pub fn read(&self, slot: u32, out: &mut [u8]) -> io::Result<()> {
        let (_, data) = self
            .slab
            .get(slot)
            .ok_or_else(|| io::Error::other(format!("compressed slot {slot} is empty")))?;
        match lz4_flex::block::decompress_into(data, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(io::Error::other(format!(
                "compressed slot {slot} holds {n} bytes, not a page"
            ))),
            Err(e) => Err(io::Error::other(format!("compressed slot {slot}: {e}"))),
        }
    }

    /// Frees `slot` (the slab may compact: other slots' data moves, their ids stay).
    pub fn remove(&mut self, slot: u32) {
        self.slab.remove(slot);
        if self.slab.len() == 0 {
            self.order = VecDeque::new();
        } else if self.order.len() > 64 && self.order.len() > 2 * self.len() {
            // Compact the order queue when most of it is stale.
            let slab = &self.slab;
            self.order
                .retain(|&(s, p)| slab.get(s).is_some_and(|(tag, _)| tag == p));
            if self.order.capacity() > 4 * self.order.len() {
                self.order.shrink_to(2 * self.order.len());
            }
        }
    }

    /// The oldest live entry `(slot, page)`, removed from the order (not from the store).
    pub fn pop_oldest(&mut self) -> Option<(u32, u32)> {
        while let Some((s, p)) = self.order.pop_front() {
            if self.slab.get(s).is_some_and(|(tag, _)| tag == p) {
                return Some((s, p));
            }
        }
        None
    }

    /// The memory the store holds: its slab's arenas (objects, free places, tails) and
    /// its tables: what the budget counts.
    pub fn bytes(&self) -> u64 {
        self.slab.held() + self.slab.bookkeeping() + self.order_bytes()
    }

    /// The order queue's heap.
    fn order_bytes(&self) -> u64 {
        (self.order.capacity() * std::mem::size_of::<(u32, u32)>()) as u64
    }

    /// The compressed bytes held (their sum; [`Compressed::bytes`] is what they cost).
    pub fn data_bytes(&self) -> u64 {
        self.slab.data_bytes()
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.slab.len()
    }
}

/// Pages in a file: one 4 KiB slot each, reused once freed.
///
/// Writes go through the page cache, which [`Swap::flush`] writes back and drops every
/// [`FLUSH_EVERY`] bytes. Reads of pages written back since use direct I/O where the file
/// system has it: the page goes from the disk into the tier's own aligned buffer and never
/// into the host's page cache, which would otherwise keep a second copy of every page
/// faulted back (host memory the VM's budget does not see, and page-cache work on every
/// fault). Pages written since the last flush are still in the page cache and are read
/// from there.
pub(crate) struct Swap {
    /// Shared with reader threads (`reader.rs`), which read slots handed to them.
    file: Arc<File>,
    free: Vec<u32>,
    next: u32,
    /// Bytes written since the page cache was last dropped.
    unflushed: u64,
    /// Slots written since the page cache was last dropped.
    cached: HashSet<u32>,
    /// Whether reads may use O_DIRECT (the file system accepted it).
    direct: bool,
    /// The descriptor's status flags without O_DIRECT, read once.
    flags: libc::c_int,
    /// Whether O_DIRECT is on now: reads of written-back pages turn it on, writes and
    /// reads through the page cache off, each only when it is not already so (a run of
    /// faults served, then a step of evictions, costs two `fcntl` calls, not two a page).
    direct_on: Cell<bool>,
    /// The aligned buffer direct reads land in.
    bounce: RefCell<Box<AlignedPage>>,
}

/// One page, aligned for direct I/O on any block device.
#[repr(C, align(4096))]
pub(crate) struct AlignedPage(pub [u8; PAGE as usize]);

/// Drop the file's page cache once this much was written.
const FLUSH_EVERY: u64 = 4 << 20;

impl Swap {
    /// An unlinked file in `dir` (`O_TMPFILE`): it disappears with the process, whatever
    /// way it ends.
    pub fn new(dir: &Path) -> io::Result<Swap> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .mode(0o600)
            .open(dir)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot create the file tier in {} ({e}): pass a directory on a \
                         file system with O_TMPFILE support (ext4, xfs, tmpfs)",
                        dir.display()
                    ),
                )
            })?;
        // Pages are read back one at a time, in no order: readahead would only fetch pages
        // nobody asked for (and wait for them).
        // SAFETY: an advice call on a descriptor we own.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        // SAFETY: fcntl on a descriptor we own.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut swap = Swap {
            file: Arc::new(file),
            free: Vec::new(),
            next: 0,
            unflushed: 0,
            cached: HashSet::new(),
            direct: true,
            flags,
            direct_on: Cell::new(false),
            bounce: RefCell::new(Box::new(AlignedPage([0; PAGE as usize]))),
        };
        // Probe once: tmpfs (before Linux 6.6) and some FUSE file systems refuse O_DIRECT.
        swap.direct = swap.set_direct(true).is_ok() && swap.set_direct(false).is_ok();
        if !swap.direct {
            tracing::debug!(dir = %dir.display(), "memory tier: no direct I/O for the swap file");
        }
        Ok(swap)
    }

    /// Turns O_DIRECT on or off on the file's one descriptor (an `O_TMPFILE` file has no
    /// path to open a second one by, and the service thread may not open `/proc`), if it
    /// is not so already. Every use of the file is under the tier's state lock.
    fn set_direct(&self, on: bool) -> io::Result<()> {
        if self.direct_on.get() == on {
            return Ok(());
        }
        let flags = if on {
            self.flags | libc::O_DIRECT
        } else {
            self.flags
        };
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETFL, flags) } < 0 {
            return Err(io::Error::last_os_error());
        }
        self.direct_on.set(on);
        Ok(())
    }

    /// Writes one page; returns its slot.
    pub fn write(&mut self, data: &[u8]) -> io::Result<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.next = self
                    .next
                    .checked_add(1)
                    .ok_or_else(|| io::Error::other("file tier full"))?;
                self.next - 1
            }
        };
        let written = self
            .set_direct(false)
            .and_then(|()| self.file.write_all_at(data, u64::from(slot) * PAGE));
        if let Err(e) = written {
            self.free.push(slot);
            return Err(e);
        }
        self.unflushed += PAGE;
        self.cached.insert(slot);
        Ok(slot)
    }

    /// Every [`FLUSH_EVERY`] bytes written, writes them back and drops the file's page
    /// cache, so that the tier does not live on in host memory. In between nothing is
    /// done: one large write-back costs a few device requests, where starting write-back
    /// after every step cost one (a VM exit on a virtio disk) per handful of pages.
    pub fn flush(&mut self) {
        if self.unflushed >= FLUSH_EVERY {
            self.flush_now();
        }
    }

    /// Writes back whatever was written since the last flush and drops the file's page
    /// cache, however little: for a tier gone quiet, whose last pages would otherwise stay
    /// in host memory until the next 4 MiB were written.
    pub fn flush_now(&mut self) {
        if self.unflushed == 0 {
            return;
        }
        let fd = self.file.as_raw_fd();
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: plain syscalls on a descriptor we own; failures only leave page cache.
        unsafe {
            libc::sync_file_range(fd, 0, 0, flags);
            libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        self.unflushed = 0;
        self.cached.clear();
    }

    /// Reads `slot` into `out` (one page): directly from the disk when the page was
    /// written back, else through the page cache.
    pub fn read(&self, slot: u32, out: &mut [u8]) -> io::Result<()> {
        let at = u64::from(slot) * PAGE;
        if !self.direct || self.cached.contains(&slot) || out.len() != PAGE as usize {
            self.set_direct(false)?;
            return self.file.read_exact_at(out, at);
        }
        self.set_direct(true)?;
        let mut bounce = self.bounce.borrow_mut();
        self.file.read_exact_at(&mut bounce.0, at)?;
        out.copy_from_slice(&bounce.0);
        Ok(())
    }

    /// The file, for a reader thread to read `slot` from, if that read may bypass the page
    /// cache (the slot was written back and the file system has direct I/O); `None`: read
    /// it here, from the page cache.
    pub fn reader_file(&self, slot: u32) -> Option<Arc<File>> {
        (self.direct && !self.cached.contains(&slot)).then(|| self.file.clone())
    }

    /// Turns O_DIRECT back on after writes, so that readers' reads of written-back pages
    /// bypass the page cache (a read while writes have it off lands in the page cache,
    /// which the next flush drops).
    pub fn prefer_direct(&self) {
        if self.direct {
            let _ = self.set_direct(true);
        }
    }

    /// Whether reads of written-back pages bypass the page cache.
    #[cfg(test)]
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Frees `slot`; the file shrinks when its tail is free.
    pub fn remove(&mut self, slot: u32) {
        self.cached.remove(&slot);
        self.free.push(slot);
        if self.free.len() as u32 == self.next {
            self.free.clear();
            self.next = 0;
            let _ = self.file.set_len(0);
        }
    }

    /// Pages held.
    pub fn len(&self) -> u64 {
        u64::from(self.next) - self.free.len() as u64
    }

    /// Whether no page is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressed_round_trip_and_oldest_order() {
        let mut c = Compressed::default();
        let mut page = vec![7u8; PAGE as usize];
        page[100] = 1;
        let a = c.insert(1, &Compressed::compress(&page).unwrap()).unwrap();
        let b = c
            .insert(2, &Compressed::compress(&vec![3u8; PAGE as usize]).unwrap())
            .unwrap();
        let mut out = vec![0u8; PAGE as usize];
        c.read(a, &mut out).unwrap();
        assert_eq!(out, page);
        c.remove(a);
        assert!(c.read(a, &mut out).is_err());
        assert_eq!(c.pop_oldest(), Some((b, 2)));
        assert_eq!(c.pop_oldest(), None);
        assert_eq!(c.len(), 1);
        assert!(c.bytes() > 0);
        c.remove(b);
        assert_eq!((c.len(), c.bytes()), (0, 0));
    }

    /// The process's anonymous memory (`RssAnon`), in bytes.
    fn rss_anon() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let kib: u64 = s
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap();
        kib << 10
    }

    /// What the store counts is what the process holds for it: its anonymous memory grows
    /// by `bytes()` as ~60 MiB of pages come in, shrinks by what `bytes()` drops when most
    /// leave (the slab compacts and unmaps), and comes back to where it was when all leave.
    /// (Other tests run alongside: a few MiB of slack.)
    #[test]
    fn the_store_holds_what_it_counts() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rng = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Stand-ins for compressed pages, 200..3072 bytes (the store only copies them).
        let pages: Vec<Vec<u8>> = (0..45_000)
            .map(|_| {
                let n = 200 + (rng() % (COMPRESS_LIMIT as u64 - 199)) as usize;
                (0..n).map(|_| rng() as u8).collect()
            })
            .collect();
        let drop_order: Vec<bool> = (0..pages.len()).map(|_| rng() % 10 != 0).collect();
        let slack = |b: u64| (6 << 20) + b / 32;
        let near = |what: &str, got: u64, want: u64| {
            assert!(
                got.abs_diff(want) <= slack(want),
                "{what}: the process's anonymous memory changed by {} MiB, the store counts {} MiB",
                got >> 20,
                want >> 20
            );
        };
        let mut c = Compressed::default();
        let before = rss_anon();
        let slots: Vec<u32> = pages
            .iter()
            .enumerate()
            .map(|(i, p)| c.insert(i as u32, p).unwrap())
            .collect();
        let full = c.bytes();
        assert!(full >= c.data_bytes() && full < c.data_bytes() / 20 * 21 + (4 << 20));
        near("filled", rss_anon().saturating_sub(before), full);
        for (slot, _) in slots.iter().zip(&drop_order).filter(|s| *s.1) {
            c.remove(*slot);
        }
        let tenth = c.bytes();
        assert!(
            tenth <= c.data_bytes() * 3 / 2 + (3 << 20),
            "a tenth left: {tenth} held for {} bytes",
            c.data_bytes()
        );
        near("most removed", rss_anon().saturating_sub(before), tenth);
        for (slot, _) in slots.iter().zip(&drop_order).filter(|s| !*s.1) {
            c.remove(*slot);
        }
        assert_eq!((c.len(), c.bytes()), (0, 0));
        near("all removed", rss_anon().saturating_sub(before), 0);
    }

    #[test]
    fn random_data_does_not_compress() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let page: Vec<u8> = (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(Compressed::compress(&page).is_none());
    }

    #[test]
    fn swap_slots_are_reused_and_the_file_shrinks() {
        let mut s = Swap::new(&std::env::temp_dir()).unwrap();
        let a = s.write(&[1u8; PAGE as usize]).unwrap();
        let b = s.write(&[2u8; PAGE as usize]).unwrap();
        s.flush();
        let mut out = vec![0u8; PAGE as usize];
        s.read(b, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 2));
        s.remove(a);
        assert_eq!(s.write(&[3u8; PAGE as usize]).unwrap(), a);
        s.remove(a);
        s.remove(b);
        assert!(s.is_empty());
        assert_eq!(s.file.metadata().unwrap().len(), 0);
    }

    /// Pages of `file` in the page cache (mincore over a read-only mapping).
    fn cached_pages(file: &File) -> usize {
        let len = file.metadata().unwrap().len() as usize;
        // SAFETY: a new read-only shared mapping of a file we hold; unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let mut vec = vec![0u8; len.div_ceil(PAGE as usize)];
        // SAFETY: `vec` has one byte per page of the mapping, which is live.
        let r = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(map, len) };
        assert_eq!(r, 0);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// A swap file on a disk file system, where O_DIRECT is available (and dropping the
    /// page cache drops pages): the temporary directory, else the build directory.
    fn direct_swap() -> Swap {
        let exe = std::env::current_exe().unwrap();
        let dirs = [std::env::temp_dir(), exe.parent().unwrap().to_path_buf()];
        dirs.iter()
            .map(|d| Swap::new(d).unwrap())
            .find(Swap::is_direct)
            .unwrap_or_else(|| {
                panic!("{dirs:?} all refuse O_DIRECT: run the tests on a disk file system")
            })
    }

    /// Pages read back after write-back come from the disk without entering the page
    /// cache; pages written since the last flush are read from it; every read returns
    /// what was written.
    #[test]
    fn written_back_pages_are_read_around_the_page_cache() {
        let mut s = direct_swap();
        let page = |i: u32| -> Vec<u8> {
            (0..PAGE as u32)
                .map(|b| (i.wrapping_mul(31) ^ b) as u8)
                .collect()
        };
        let n = (FLUSH_EVERY / PAGE) as u32 + 24;
        let slots: Vec<u32> = (0..n).map(|i| s.write(&page(i)).unwrap()).collect();
        s.flush();
        assert!(
            cached_pages(&s.file) <= 8,
            "flush left {} pages cached",
            cached_pages(&s.file)
        );
        // Written after the flush: still in the page cache.
        let late = s.write(&page(n)).unwrap();
        let mut out = vec![0u8; PAGE as usize];
        for (i, slot) in slots.iter().enumerate() {
            s.read(*slot, &mut out).unwrap();
            assert!(out == page(i as u32), "slot {slot} read back wrong");
        }
        s.read(late, &mut out).unwrap();
        assert!(out == page(n));
        let cached = cached_pages(&s.file);
        assert!(
            cached <= 8,
            "{cached} of {n} pages read back are in the page cache"
        );
        // A page rewritten in place after a flush is read from the page cache, new bytes.
        s.remove(slots[0]);
        assert_eq!(s.write(&page(7777)).unwrap(), slots[0]);
        s.read(slots[0], &mut out).unwrap();
        assert!(out == page(7777));
    }

    /// Pages written short of a batch leave the page cache only with `flush_now`.
    #[test]
    fn flush_now_drops_a_partial_batch() {
        let mut s = direct_swap();
        for i in 0..512u32 {
            s.write(&[i as u8; PAGE as usize]).unwrap();
        }
        s.flush();
        assert_eq!(cached_pages(&s.file), 512, "flush acts only every 4 MiB");
        s.flush_now();
        let cached = cached_pages(&s.file);
        assert!(cached <= 8, "flush_now left {cached} pages cached");
        let mut out = vec![0u8; PAGE as usize];
        s.read(300, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 300u32 as u8));
    }

    #[test]
    fn a_missing_directory_is_a_clear_error() {
        let e = Swap::new(Path::new("/nonexistent/tier")).err().unwrap();
        assert!(e.to_string().contains("/nonexistent/tier"), "{e}");
    }
}
