//! The slower tiers a page can live in while it is not in the RAM file: a compressed
//! in-memory store (LZ4) and a file (an unlinked temporary file whose page cache is
//! dropped once written back). Zero pages are kept in neither: they are holes.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::PAGE;

/// A page compressed to more than this is not worth the compressed store (it goes to the
/// file): 3/4 of a page.
pub const COMPRESS_LIMIT: usize = 3072;

/// What the store's bookkeeping takes per page besides the allocation: its `slots` entry
/// (16 bytes), `owner` (4), its `order` entry (8, and the queue runs up to twice the live
/// count before it is compacted) and a `free` entry once removed (4).
const SLOT_OVERHEAD: u64 = 40;
/// glibc malloc's header in front of each chunk (the size word).
const MALLOC_HEADER: u64 = 8;

/// The heap a stored page costs: its malloc chunk (the usable size glibc gave it plus the
/// header, i.e. the chunk size) and its bookkeeping. The budget counts this, not the
/// compressed length: for the zipf benchmark's ~1.3 KiB pages, header, rounding to 16
/// bytes and bookkeeping add ~4 %, which the budget did not see. (Fragmentation of the
/// heap as pages come and go is still not counted.)
fn heap_cost(data: &[u8]) -> u64 {
    // SAFETY: `data` is a live allocation of the global allocator (Rust's System
    // allocator, glibc malloc); malloc_usable_size only reads its chunk header. A
    // zero-length box has no allocation: it costs only its bookkeeping.
    let usable = if data.is_empty() {
        0
    } else {
        unsafe { libc::malloc_usable_size(data.as_ptr() as *mut libc::c_void) as u64 }
    };
    usable + MALLOC_HEADER + SLOT_OVERHEAD
}

/// Compressed pages in memory, with their eviction order so the oldest can be demoted
/// to the file when the store is full.
#[derive(Default)]
pub(crate) struct Compressed {
    slots: Vec<Option<Box<[u8]>>>,
    free: Vec<u32>,
    /// The heap the stored pages take ([`heap_cost`]), which the budget counts.
    bytes: u64,
    /// The compressed bytes held (the sum of the pages' compressed lengths).
    data: u64,
    /// (slot, page) in the order they were stored; entries whose slot was freed or
    /// reused are skipped when popped.
    order: VecDeque<(u32, u32)>,
    /// The page each live slot holds (to check `order` entries).
    owner: Vec<u32>,
}

impl Compressed {
    /// Compresses `data` (one page); `None` if it does not shrink below
    /// [`COMPRESS_LIMIT`].
    pub fn compress(data: &[u8]) -> Option<Box<[u8]>> {
        // Into a scratch buffer, then one allocation of the exact size: compressing into a
        // fresh page-sized vector and shrinking it left the heap ~1.5x the bytes held
        // (measured with the zipf benchmark).
        thread_local! {
            static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        SCRATCH.with_borrow_mut(|out| {
            out.resize(lz4_flex::block::get_maximum_output_size(data.len()), 0);
            let n = lz4_flex::block::compress_into(data, out).ok()?;
            (n <= COMPRESS_LIMIT).then(|| Box::from(&out[..n]))
        })
    }

    /// Stores compressed bytes for `page`; returns the slot.
    pub fn insert(&mut self, page: u32, data: Box<[u8]>) -> u32 {
        self.bytes += heap_cost(&data);
        self.data += data.len() as u64;
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(data);
                self.owner[s as usize] = page;
                s
            }
            None => {
                self.slots.push(Some(data));
                self.owner.push(page);
                (self.slots.len() - 1) as u32
            }
        };
        self.order.push_back((slot, page));
        slot
    }

    /// Decompresses `slot` into `out` (one page).
    pub fn read(&self, slot: u32, out: &mut [u8]) -> io::Result<()> {
        let data = self
            .slots
            .get(slot as usize)
            .and_then(|s| s.as_deref())
            .ok_or_else(|| io::Error::other(format!("compressed slot {slot} is empty")))?;
        match lz4_flex::block::decompress_into(data, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(io::Error::other(format!(
                "compressed slot {slot} holds {n} bytes, not a page"
            ))),
            Err(e) => Err(io::Error::other(format!("compressed slot {slot}: {e}"))),
        }
    }

    /// Frees `slot`.
    pub fn remove(&mut self, slot: u32) {
        if let Some(data) = self.slots.get_mut(slot as usize).and_then(Option::take) {
            self.bytes -= heap_cost(&data);
            self.data -= data.len() as u64;
            self.free.push(slot);
        }
        // Compact the order queue when most of it is stale.
        if self.order.len() > 64 && self.order.len() > 2 * self.len() {
            let (slots, owner) = (&self.slots, &self.owner);
            self.order
                .retain(|&(s, p)| slots[s as usize].is_some() && owner[s as usize] == p);
        }
    }

    /// The oldest live entry `(slot, page)`, removed from the order (not from the store).
    pub fn pop_oldest(&mut self) -> Option<(u32, u32)> {
        while let Some((s, p)) = self.order.pop_front() {
            if self.slots[s as usize].is_some() && self.owner[s as usize] == p {
                return Some((s, p));
            }
        }
        None
    }

    /// The heap the compressed pages take, bookkeeping included (not only their
    /// compressed bytes): what the budget counts.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The compressed bytes held: what [`Compressed::bytes`] costs them.
    pub fn data_bytes(&self) -> u64 {
        self.data
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// Pages in a file: one 4 KiB slot each, reused once freed.
pub(crate) struct Swap {
    file: File,
    free: Vec<u32>,
    next: u32,
    /// Bytes written since the page cache was last dropped.
    unflushed: u64,
}

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
        Ok(Swap {
            file,
            free: Vec::new(),
            next: 0,
            unflushed: 0,
        })
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
        if let Err(e) = self.file.write_all_at(data, u64::from(slot) * PAGE) {
            self.free.push(slot);
            return Err(e);
        }
        self.unflushed += PAGE;
        Ok(slot)
    }

    /// Every [`FLUSH_EVERY`] bytes written, writes them back and drops the file's page
    /// cache, so that the tier does not live on in host memory. In between nothing is
    /// done: one large write-back costs a few device requests, where starting write-back
    /// after every step cost one (a VM exit on a virtio disk) per handful of pages.
    pub fn flush(&mut self) {
        if self.unflushed < FLUSH_EVERY {
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
    }

    /// Reads `slot` into `out` (one page).
    pub fn read(&self, slot: u32, out: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(out, u64::from(slot) * PAGE)
    }

    /// Frees `slot`; the file shrinks when its tail is free.
    pub fn remove(&mut self, slot: u32) {
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
        let a = c.insert(1, Compressed::compress(&page).unwrap());
        let b = c.insert(2, Compressed::compress(&vec![3u8; PAGE as usize]).unwrap());
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

    /// The store charges the heap it really takes: pages of mixed compressibility grow
    /// glibc's in-use heap (`mallinfo2`) by about what `bytes()` says, not by more.
    #[test]
    fn the_store_charges_the_heap_its_pages_take() {
        let n = 4000u32;
        // Pages compressing to 200..2600 bytes: a run of one byte, then pseudo-random.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let pages: Vec<Box<[u8]>> = (0..n)
            .map(|i| {
                let random = 150 + (i as usize * 37) % 2300;
                let mut page = vec![0x5au8; PAGE as usize];
                for b in &mut page[..random] {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *b = x as u8;
                }
                Compressed::compress(&page).unwrap()
            })
            .collect();
        let raw: u64 = pages.iter().map(|p| p.len() as u64).sum();
        let mut c = Compressed::default();
        // Room for the bookkeeping first, so the measurement sees the pages' chunks (and
        // the vectors' growth is counted by SLOT_OVERHEAD, not measured twice).
        c.slots.reserve(n as usize);
        c.owner.reserve(n as usize);
        c.order.reserve(2 * n as usize);
        // SAFETY: mallinfo2 only reads malloc's statistics.
        let before = unsafe { libc::mallinfo2() }.uordblks as u64;
        // Copies made now, after `before`: the chunks the store holds.
        for (i, p) in pages.iter().enumerate() {
            c.insert(i as u32, Box::from(&p[..]));
        }
        // SAFETY: as above.
        let heap = unsafe { libc::mallinfo2() }.uordblks as u64 - before;
        let bookkeeping = n as u64 * SLOT_OVERHEAD;
        assert!(
            heap >= raw + n as u64 * MALLOC_HEADER,
            "each chunk has a header: heap {heap} for {raw} compressed bytes"
        );
        assert!(
            c.bytes() >= heap + bookkeeping / 2 && c.bytes() <= heap + bookkeeping + raw / 50,
            "charged {} for a heap of {heap} (+{bookkeeping} bookkeeping; {raw} compressed bytes)",
            c.bytes()
        );
        for slot in 0..n {
            c.remove(slot);
        }
        assert_eq!(c.bytes(), 0);
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

    #[test]
    fn a_missing_directory_is_a_clear_error() {
        let e = Swap::new(Path::new("/nonexistent/tier")).err().unwrap();
        assert!(e.to_string().contains("/nonexistent/tier"), "{e}");
    }
}
