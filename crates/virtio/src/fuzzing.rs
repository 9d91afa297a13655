//! What the device fuzz targets share (`fuzz/fuzz_targets/virtio_*.rs`, replayed by
//! `cargo test`): an input reader, a hostile driver that lays descriptors and chains out of
//! the fuzzer's bytes, and an [`Audit`] that checks what a device did to a queue.
//!
//! The audit's invariants, beyond "no panic, no hang": a device returns no more chains than
//! were offered, returns only heads it was offered, reports a used length no larger than the
//! chain's device-writable bytes, and writes guest memory only inside the writable buffers
//! of the chains offered and the queue's own used ring. When a writable buffer overlaps the
//! driver's own structures (descriptor table, available ring, an indirect table, the used
//! ring), the device's writes legitimately change the chains it walks next, and the audit
//! checks nothing for that round (the fuzzer found such layouts within seconds).

use crate::testing::MockQueue;
use crate::Mem;
use std::collections::HashMap;
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// The fuzzer's bytes, read front to back; missing bytes read as zero.
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The next `N` bytes.
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = self.0.len().min(N);
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    /// The next `n` bytes (fewer at the end).
    pub fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    /// A byte.
    pub fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

/// A hostile driver's queue: rings at `base`, buffers in `[data, data + data_len)`.
pub struct Driver {
    /// The rings.
    pub mq: MockQueue,
    /// Entries.
    pub size: u16,
    data: u64,
    data_len: u64,
    next_desc: u16,
    next_data: u64,
}

impl Driver {
    /// A queue of `2 << (size_code % 8)` entries (2..256).
    pub fn new(mem: &Mem, base: u64, size_code: u8, data: u64, data_len: u64) -> Self {
        let size = 2u16 << (size_code % 8);
        Driver {
            mq: MockQueue::new(mem.clone(), base, size),
            size,
            data,
            data_len,
            next_desc: 0,
            next_data: 0,
        }
    }

    /// Bit 63 of a raw address keeps it as is (usually outside guest memory); otherwise it
    /// lands in the buffer area.
    pub fn addr(&self, raw: u64) -> u64 {
        if raw & (1 << 63) != 0 {
            raw & !(1 << 63)
        } else {
            self.data + raw % self.data_len
        }
    }

    /// Bit 31 of a raw length keeps it as is; otherwise it is at most the buffer area.
    pub fn len(&self, raw: u32) -> u32 {
        if raw & (1 << 31) != 0 {
            raw & !(1 << 31)
        } else {
            raw % (self.data_len as u32 + 1)
        }
    }

    /// Hostile layout from the input: up to 15 raw descriptors (index, address, length,
    /// flags, next), up to 7 heads published, maybe a lying available index, and up to
    /// 255 bytes of buffer contents somewhere in the buffer area.
    pub fn hostile(&mut self, input: &mut Input) {
        for _ in 0..input.u8() % 16 {
            let index = u16::from(input.u8()) % self.size;
            let (addr, len) = (self.addr(input.u64()), self.len(input.u32()));
            let (flags, next) = (input.u16(), input.u16());
            self.mq.set_desc(index, addr, len, flags, next);
        }
        for _ in 0..input.u8() % 8 {
            self.mq.publish(input.u16());
        }
        let ctl = input.u8();
        if ctl & 0x80 != 0 {
            self.mq.set_avail_idx(input.u16());
        }
        if ctl & 0x40 != 0 {
            self.mq.set_used_event(input.u16());
        }
        let at = self.addr(u64::from(input.u32()));
        let n = usize::from(input.u8());
        let bytes = input.take(n).to_vec();
        let room = (self.data + self.data_len).saturating_sub(at) as usize;
        self.mq.write(at, &bytes[..bytes.len().min(room)]);
    }

    /// A well-formed chain of `bufs` (contents for a driver-readable buffer, a length for a
    /// device-writable one) at the next descriptors and buffer space, published. Buffers
    /// that do not fit the buffer area wrap to its start.
    pub fn chain(&mut self, bufs: &[Buf]) -> u16 {
        let head = self.next_desc;
        let n = bufs.len().min(usize::from(self.size)).max(1);
        for (i, b) in bufs.iter().take(n).enumerate() {
            let len = match b {
                Buf::Read(d) => d.len() as u64,
                Buf::Write(l) => u64::from(*l),
            }
            .min(self.data_len);
            if self.next_data + len > self.data_len {
                self.next_data = 0;
            }
            let addr = self.data + self.next_data;
            self.next_data = (self.next_data + len).next_multiple_of(8);
            let mut flags = 0u16;
            if let Buf::Read(d) = b {
                self.mq.write(addr, &d[..len as usize]);
            } else {
                flags |= VRING_DESC_F_WRITE as u16;
            }
            let index = (head + i as u16) % self.size;
            if i + 1 < n {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.mq
                .set_desc(index, addr, len as u32, flags, (index + 1) % self.size);
        }
        self.next_desc = (head + n as u16) % self.size;
        self.mq.publish(head);
        head
    }

    /// The device side, set up as a driver would (`event_idx`: `VIRTIO_RING_F_EVENT_IDX`).
    pub fn queue(&self, event_idx: bool) -> Queue {
        let mut q = self.mq.queue();
        q.set_event_idx(event_idx);
        q
    }
}

/// One buffer of a well-formed chain.
pub enum Buf {
    /// Driver-readable, with these contents.
    Read(Vec<u8>),
    /// Device-writable, this long.
    Write(u32),
}

/// What the device may do to one queue while serving it once: taken before, checked after.
pub struct Audit {
    mem_before: Vec<u8>,
    /// Writable bytes of each head offered (the largest, when a head is offered twice).
    offered: HashMap<u16, u64>,
    chains: usize,
    /// Where the device may write: sorted, disjoint `[start, end)` ranges.
    allowed: Vec<(u64, u64)>,
    next_used: u16,
    used: u64,
    size: u16,
    /// A writable buffer overlaps the driver's own structures (descriptor table, available
    /// ring, an indirect table, the used ring): what the device writes there changes the
    /// chains it walks next, so only "no panic, no hang" is checked.
    self_modifying: bool,
}

impl Audit {
    /// Records guest memory and the chains `queue` offers now.
    pub fn before(mem: &Mem, queue: &Queue) -> Audit {
        let mut mem_before = vec![0u8; mem.last_addr().0 as usize + 1];
        mem.read_slice(&mut mem_before, GuestAddress(0))
            .expect("fuzz guest memory starts at 0");
        let size = queue.size();
        let used = queue.used_ring();
        // The used ring (flags, idx, entries, avail_event) is the device's to write.
        let mut allowed = vec![(used, 6 + 8 * u64::from(size))];
        let mut offered = HashMap::new();
        let mut chains = 0;
        let copy = Queue::try_from(queue.state());
        if let Some(mut it) = copy.ok().as_mut().and_then(|q| q.iter(mem).ok()) {
            for chain in it.by_ref() {
                chains += 1;
                let head = chain.head_index();
                let mut cap = 0u64;
                for d in chain {
                    if d.is_write_only() {
                        allowed.push((d.addr().0, u64::from(d.len())));
                        cap += u64::from(d.len());
                    }
                }
                let e = offered.entry(head).or_insert(0);
                *e = (*e).max(cap);
            }
        }
        let n = u64::from(size);
        let mut driver = vec![
            (queue.desc_table(), 16 * n),
            (queue.avail_ring(), 6 + 2 * n),
            (used, 6 + 8 * n),
        ];
        for i in 0..n {
            let at = GuestAddress(queue.desc_table() + 16 * i);
            let flags = mem.read_obj::<u16>(GuestAddress(at.0 + 12)).unwrap_or(0);
            if u32::from(flags) & VRING_DESC_F_INDIRECT != 0 {
                let addr = mem.read_obj::<u64>(at).unwrap_or(0);
                let len = mem.read_obj::<u32>(GuestAddress(at.0 + 8)).unwrap_or(0);
                driver.push((addr, u64::from(len)));
            }
        }
        let self_modifying = allowed[1..].iter().any(|&(s, l)| {
            driver
                .iter()
                .any(|&(ds, dl)| s < ds.saturating_add(dl) && s.saturating_add(l) > ds)
        });
        // Sorted, merged, as [start, end): a changed byte is looked up by binary search.
        let mut ranges: Vec<(u64, u64)> = allowed
            .iter()
            .filter(|&&(_, l)| l > 0)
            .map(|&(s, l)| (s, s.saturating_add(l)))
            .collect();
        ranges.sort_unstable();
        let mut allowed: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match allowed.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => allowed.push((s, e)),
            }
        }
        Audit {
            mem_before,
            offered,
            chains,
            allowed,
            next_used: queue.next_used(),
            used,
            size,
            self_modifying,
        }
    }

    /// Checks what the device did since [`Audit::before`]; returns the used entries added.
    pub fn after(&self, mem: &Mem, queue: &Queue, what: &str) -> Vec<(u16, u32)> {
        if self.self_modifying {
            return Vec::new();
        }
        let added = queue.next_used().wrapping_sub(self.next_used);
        assert!(
            usize::from(added) <= self.chains,
            "{what}: {added} chains returned, {} offered",
            self.chains
        );
        let mut entries = Vec::new();
        for i in 0..added {
            let slot = u64::from(self.next_used.wrapping_add(i) % self.size);
            let at = GuestAddress(self.used + 4 + 8 * slot);
            let id = mem.read_obj::<u32>(at).expect("used ring in memory");
            let len = mem
                .read_obj::<u32>(GuestAddress(at.0 + 4))
                .expect("used ring in memory");
            let cap = u16::try_from(id)
                .ok()
                .and_then(|h| self.offered.get(&h))
                .unwrap_or_else(|| panic!("{what}: returned head {id}, which was not offered"));
            assert!(
                u64::from(len) <= *cap,
                "{what}: used length {len} for head {id}, whose writable buffers hold {cap}"
            );
            entries.push((id as u16, len));
        }
        let mut now = vec![0u8; self.mem_before.len()];
        mem.read_slice(&mut now, GuestAddress(0))
            .expect("fuzz guest memory starts at 0");
        const CHUNK: usize = 64;
        for (c, (a, b)) in self
            .mem_before
            .chunks(CHUNK)
            .zip(now.chunks(CHUNK))
            .enumerate()
        {
            if a == b {
                continue;
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let addr = (c * CHUNK + i) as u64;
                if x != y {
                    let i = self.allowed.partition_point(|&(s, _)| s <= addr);
                    assert!(
                        i > 0 && addr < self.allowed[i - 1].1,
                        "{what}: guest memory at {addr:#x} written outside every writable buffer offered"
                    );
                }
            }
        }
        entries
    }
}

/// Seeded pseudo-random bytes (xorshift), for the replay tests' random and mutated inputs.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// `seed` with a few bytes flipped, inserted or removed, or cut short.
    pub fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..1 + self.next_u64() % 8 {
            let pos = if v.is_empty() {
                0
            } else {
                (self.next_u64() as usize) % v.len()
            };
            match self.next_u64() % 4 {
                0 if !v.is_empty() => v[pos] ^= 1 << (self.next_u64() % 8),
                1 if !v.is_empty() => v[pos] = self.next_u64() as u8,
                2 => v.insert(pos, self.next_u64() as u8),
                _ if !v.is_empty() => v.truncate(pos),
                _ => v.push(self.next_u64() as u8),
            }
        }
        v
    }
}

/// The committed corpus of a fuzz target (`fuzz/corpus/<target>` at the repository root).
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut out = Vec::new();
    for entry in
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("the fuzz corpus {}: {e}", dir.display()))
    {
        let path = entry.expect("corpus entry").path();
        let name = path.display().to_string();
        out.push((name, std::fs::read(&path).expect("corpus file")));
    }
    out.sort();
    out
}

/// What every device's replay test does: each committed corpus file, each built-in seed,
/// then `n` random inputs and `n` mutations of the seeds (seeded, so every run is the
/// same), all through `target`. With `DENSEVM_FUZZ_SEEDS=DIR` set, the built-in seeds are
/// also written there (how `fuzz/corpus/<target>` was first made).
pub fn replay(target: &str, seeds: &[(&str, Vec<u8>)], n: usize, run: fn(&[u8])) {
    if let Some(dir) = std::env::var_os("DENSEVM_FUZZ_SEEDS") {
        let dir = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir).expect("seed dir");
        for (name, s) in seeds {
            std::fs::write(dir.join(name), s).expect("write seed");
        }
    }
    for (name, data) in corpus(target) {
        eprintln!("replay {name}");
        run(&data);
    }
    for (_, s) in seeds {
        run(s);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
    for i in 0..n {
        let len = (rng.next_u64() % 600) as usize;
        run(&rng.bytes(len));
        let seed = &seeds[i % seeds.len()].1;
        run(&rng.mutate(seed));
    }
}
