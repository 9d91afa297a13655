//! The compressed store's memory: a slab of size classes, in the spirit of the kernel's
//! zsmalloc. An object (a compressed page, at most [`COMPRESS_LIMIT`] bytes) goes to the
//! class of its size rounded up to [`GRAIN`] bytes; each class carves fixed-size objects out
//! of its own arenas, anonymous private mappings of 8 to 16 pages sized so that the tail
//! past the last object is at most 1/64 of the arena. An arena that empties is unmapped at
//! once, and a class whose objects fill less than [`FILL`] (15/16) of its arenas (one arena
//! aside) is compacted: the objects of its sparsest arena move to free places in the
//! fullest ones and the emptied arena is unmapped. So the arenas a class holds stay within
//! `live objects / (15/16 × objects per arena) + 1`, and what the store holds is what it
//! counts ([`Slab::held`] plus [`Slab::bookkeeping`]).
//!
//! Objects are named by a slot id that stays the same while the object lives, wherever
//! compaction moves it (slot → class, arena, index), so the page table never needs to hear
//! of a move.

use std::io;
use std::ptr::NonNull;

use crate::store::COMPRESS_LIMIT;
use crate::PAGE;

/// Class sizes are multiples of this.
pub(crate) const GRAIN: usize = 64;
/// Number of size classes: `GRAIN`, `2 × GRAIN`, …, [`COMPRESS_LIMIT`].
pub(crate) const CLASSES: usize = COMPRESS_LIMIT / GRAIN;
/// Non-full arenas are kept in this many lists by fullness (objects × GROUPS / capacity),
/// full ones in one more: allocation takes from the fullest, compaction empties the
/// sparsest.
const GROUPS: usize = 8;
/// The end of an arena list.
const NIL: u32 = u32::MAX;
/// A class is compacted when its objects fill less than this share of its arenas, one
/// arena aside.
pub(crate) const FILL: (usize, usize) = (15, 16);
/// In `owners`: the place is free; the low bits are the next free place of the arena.
const FREE: u32 = 1 << 31;
/// Slot ids stay below this (the page table stores a slot + 1 in 31 bits).
pub(crate) const MAX_SLOTS: u32 = (1 << 31) - 1;
/// `Slot::class` of a free slot.
const NO_CLASS: u8 = u8::MAX;

/// An anonymous private mapping, unmapped on drop.
struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Map owns its mapping alone (no other pointer to it exists outside the borrows
// its methods hand out), so it may move to another thread like a Box.
unsafe impl Send for Map {}

impl Map {
    fn new(len: usize) -> io::Result<Map> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing: no
        // existing memory is affected; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave 0"))?;
        Ok(Map { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live readable mapping of `len` bytes that this Map owns until
        // drop (anonymous memory reads as zeros until written: initialized); the slice
        // borrows `self`, so no `bytes_mut` borrow can overlap it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and the mapping is writable; the slice borrows `self`
        // mutably, so it is the only reference into the mapping while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this Map created and owns; no borrow of it
        // outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Where a slot's object is, and the page it holds (the store's tag).
#[derive(Clone, Copy, Debug)]
struct Slot {
    tag: u32,
    arena: u32,
    index: u16,
    len: u16,
    /// [`NO_CLASS`] for a free slot.
    class: u8,
}

/// One arena of a class: its mapping (`None`: an unused arena id), its live objects, the
/// head of its free list and its place in the class's fullness lists.
struct Arena {
    map: Option<Map>,
    live: u16,
    free: u16,
    group: u8,
    prev: u32,
    next: u32,
}

/// Objects of one size.
struct Class {
    size: usize,
    /// Objects per arena.
    per: usize,
    arena_len: usize,
    arenas: Vec<Arena>,
    /// Per arena, per place: the slot there, or [`FREE`] | the next free place.
    owners: Vec<u32>,
    /// List heads: groups 0..GROUPS by fullness for non-full arenas, GROUPS for full ones.
    heads: [u32; GROUPS + 1],
    /// Mapped arenas and the objects in them.
    mapped: usize,
    live: usize,
    /// No unused arena id below this.
    first_unused: usize,
}

/// The arena length (8 to 16 pages) that wastes the smallest share past the last object.
fn arena_len(size: usize) -> usize {
    let page = PAGE as usize;
    (8..=16)
        .map(|p| p * page)
        .min_by_key(|&len| ((len % size) * 1_000_000 / len, len))
        .unwrap_or(16 * page)
}

impl Class {
    fn new(size: usize) -> Class {
        let arena_len = arena_len(size);
        Class {
            size,
            per: arena_len / size,
            arena_len,
            arenas: Vec::new(),
            owners: Vec::new(),
            heads: [NIL; GROUPS + 1],
            mapped: 0,
            live: 0,
            first_unused: 0,
        }
    }

    fn group_of(&self, live: u16) -> u8 {
        let live = usize::from(live);
        if live >= self.per {
            GROUPS as u8
        } else {
            (live * GROUPS / self.per) as u8
        }
    }

    fn unlink(&mut self, a: u32) {
        let (prev, next, group) = {
            let ar = &self.arenas[a as usize];
            (ar.prev, ar.next, ar.group)
        };
        match prev {
            NIL => self.heads[usize::from(group)] = next,
            p => self.arenas[p as usize].next = next,
        }
        if next != NIL {
            self.arenas[next as usize].prev = prev;
        }
    }

    fn link(&mut self, a: u32) {
        let group = self.group_of(self.arenas[a as usize].live);
        let head = self.heads[usize::from(group)];
        if head != NIL {
            self.arenas[head as usize].prev = a;
        }
        let ar = &mut self.arenas[a as usize];
        (ar.group, ar.prev, ar.next) = (group, NIL, head);
        self.heads[usize::from(group)] = a;
    }

    /// Moves arena `a` to the list its fullness now calls for.
    fn regroup(&mut self, a: u32) {
        if self.group_of(self.arenas[a as usize].live) != self.arenas[a as usize].group {
            self.unlink(a);
            self.link(a);
        }
    }

    /// The fullest arena with a free place (one of its group).
    fn fullest_open(&self) -> Option<u32> {
        self.heads[..GROUPS]
            .iter()
            .rev()
            .copied()
            .find(|&h| h != NIL)
    }

    /// The sparsest arena (one of its group), full ones aside.
    fn sparsest(&self) -> Option<u32> {
        self.heads[..GROUPS].iter().copied().find(|&h| h != NIL)
    }

    /// Maps a new arena; returns its id.
    fn new_arena(&mut self) -> io::Result<u32> {
        let map = Map::new(self.arena_len)?;
        let id = match self.arenas[self.first_unused..]
            .iter()
            .position(|a| a.map.is_none())
        {
            Some(i) => self.first_unused + i,
            None => {
                if self.arenas.len() >= NIL as usize - 1 {
                    return Err(io::Error::other("compressed store: too many arenas"));
                }
                self.arenas.push(Arena {
                    map: None,
                    live: 0,
                    free: 0,
                    group: 0,
                    prev: NIL,
                    next: NIL,
                });
                self.owners.resize(self.arenas.len() * self.per, FREE);
                self.arenas.len() - 1
            }
        };
        self.first_unused = id + 1;
        let base = id * self.per;
        for (i, o) in self.owners[base..base + self.per].iter_mut().enumerate() {
            *o = FREE | (i as u32 + 1);
        }
        let ar = &mut self.arenas[id];
        (ar.map, ar.live, ar.free) = (Some(map), 0, 0);
        self.mapped += 1;
        self.link(id as u32);
        Ok(id as u32)
    }

    /// Takes a free place in arena `a` for `slot`; returns its index.
    fn take(&mut self, a: u32, slot: u32) -> u16 {
        let ar = &mut self.arenas[a as usize];
        let index = ar.free;
        let o = &mut self.owners[a as usize * self.per + usize::from(index)];
        ar.free = (*o & !FREE) as u16;
        *o = slot;
        ar.live += 1;
        self.live += 1;
        self.regroup(a);
        index
    }

    /// Frees place `index` of arena `a`; unmaps the arena if it is now empty.
    fn give_back(&mut self, a: u32, index: u16) {
        let ar = &mut self.arenas[a as usize];
        self.owners[a as usize * self.per + usize::from(index)] = FREE | u32::from(ar.free);
        ar.free = index;
        ar.live -= 1;
        self.live -= 1;
        if ar.live == 0 {
            self.release(a);
        } else {
            self.regroup(a);
        }
    }

    /// Unmaps empty arena `a` and drops the unused ids at the end of the vectors.
    fn release(&mut self, a: u32) {
        self.unlink(a);
        self.arenas[a as usize].map = None;
        self.mapped -= 1;
        self.first_unused = self.first_unused.min(a as usize);
        while self.arenas.last().is_some_and(|l| l.map.is_none()) {
            self.arenas.pop();
        }
        self.owners.truncate(self.arenas.len() * self.per);
        self.first_unused = self.first_unused.min(self.arenas.len());
        // Give the bookkeeping back too once it is mostly unused.
        if self.arenas.is_empty() || self.arenas.capacity() > 2 * self.arenas.len() + 4 {
            self.arenas.shrink_to_fit();
            self.owners.shrink_to_fit();
        }
    }

    /// Whether the class's arenas exceed the bound: `live / (FILL × per) + 1`. (Each
    /// compaction moves at most an average arena's objects and is due again only after as
    /// many removals: about one object moved per removal at most, whatever `FILL`.)
    fn over(&self) -> bool {
        self.mapped > 1 && FILL.1 * self.live < FILL.0 * (self.mapped - 1) * self.per
    }

    /// Empties the sparsest arena into the fullest others and unmaps it (`slots` learn
    /// where their objects went). Returns false if it could not.
    fn compact_one(&mut self, slots: &mut [Slot], moved: &mut u64) -> bool {
        let Some(src) = self.sparsest() else {
            return false;
        };
        self.unlink(src);
        let base = src as usize * self.per;
        for index in 0..self.per {
            let slot = self.owners[base + index];
            if slot & FREE != 0 {
                continue;
            }
            let Some(dst) = self.fullest_open() else {
                // Nowhere to go (cannot happen while `over`): leave the rest in place.
                self.link(src);
                return false;
            };
            let Some(s) = slots.get_mut(slot as usize) else {
                self.link(src);
                return false;
            };
            let to = self.take(dst, slot);
            let (size, len) = (self.size, usize::from(s.len));
            let (from, into) = pair(&mut self.arenas, src as usize, dst as usize);
            if let (Some(from), Some(into)) = (from.map.as_ref(), into.map.as_mut()) {
                let at = usize::from(to) * size;
                into.bytes_mut()[at..at + len]
                    .copy_from_slice(&from.bytes()[index * size..index * size + len]);
            }
            (s.arena, s.index) = (dst, to);
            *moved += 1;
            // Free the old place; unmaps the arena with its last object.
            let ar = &mut self.arenas[src as usize];
            self.owners[base + index] = FREE | u32::from(ar.free);
            ar.free = index as u16;
            ar.live -= 1;
            self.live -= 1;
            if ar.live == 0 {
                // `release` unlinks: put it in a list first.
                self.link(src);
                self.release(src);
                return true;
            }
        }
        self.link(src);
        false
    }
}

/// Arena `a` shared and arena `b` mutable (`a != b`).
fn pair(arenas: &mut [Arena], a: usize, b: usize) -> (&Arena, &mut Arena) {
    if a < b {
        let (l, r) = arenas.split_at_mut(b);
        (&l[a], &mut r[0])
    } else {
        let (l, r) = arenas.split_at_mut(a);
        (&r[0], &mut l[b])
    }
}

/// Objects of up to [`COMPRESS_LIMIT`] bytes in size classes, named by stable slot ids.
pub(crate) struct Slab {
    classes: Vec<Class>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    live: usize,
    data: u64,
    /// Objects moved by compaction, ever.
    moved: u64,
}

impl Default for Slab {
    fn default() -> Slab {
        Slab {
            classes: (1..=CLASSES).map(|c| Class::new(c * GRAIN)).collect(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            live: 0,
            data: 0,
            moved: 0,
        }
    }
}

impl Slab {
    /// Stores `data` tagged `tag`; returns its slot.
    pub fn insert(&mut self, tag: u32, data: &[u8]) -> io::Result<u32> {
        if data.len() > COMPRESS_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes do not fit the compressed store (at most {COMPRESS_LIMIT})",
                    data.len()
                ),
            ));
        }
        let slot = match self.free_slots.last() {
            Some(&s) => s,
            None if self.slots.len() < MAX_SLOTS as usize => self.slots.len() as u32,
            None => return Err(io::Error::other("compressed store: out of slots")),
        };
        let c = data.len().saturating_sub(1) / GRAIN;
        let class = &mut self.classes[c];
        let arena = match class.fullest_open() {
            Some(a) => a,
            None => class.new_arena()?,
        };
        let index = class.take(arena, slot);
        let at = usize::from(index) * class.size;
        if let Some(map) = class.arenas[arena as usize].map.as_mut() {
            map.bytes_mut()[at..at + data.len()].copy_from_slice(data);
        }
        let entry = Slot {
            tag,
            arena,
            index,
            len: data.len() as u16,
            class: c as u8,
        };
        if self.free_slots.pop().is_none() {
            self.slots.push(entry);
        } else {
            self.slots[slot as usize] = entry;
        }
        self.live += 1;
        self.data += data.len() as u64;
        Ok(slot)
    }

    /// The tag and bytes of `slot`; `None` if it holds nothing.
    pub fn get(&self, slot: u32) -> Option<(u32, &[u8])> {
        let s = self
            .slots
            .get(slot as usize)
            .filter(|s| s.class != NO_CLASS)?;
        let class = self.classes.get(usize::from(s.class))?;
        let map = class.arenas.get(s.arena as usize)?.map.as_ref()?;
        let at = usize::from(s.index) * class.size;
        let bytes = map.bytes().get(at..at + usize::from(s.len))?;
        Some((s.tag, bytes))
    }

    /// Frees `slot` (nothing if it holds nothing); compacts its class if it is now over the
    /// bound. Returns whether it held something.
    pub fn remove(&mut self, slot: u32) -> bool {
        let Some(s) = self
            .slots
            .get_mut(slot as usize)
            .filter(|s| s.class != NO_CLASS)
        else {
            return false;
        };
        let entry = *s;
        s.class = NO_CLASS;
        self.free_slots.push(slot);
        self.live -= 1;
        self.data -= u64::from(entry.len);
        let class = &mut self.classes[usize::from(entry.class)];
        class.give_back(entry.arena, entry.index);
        // One removal can break the bound by at most one arena: a few steps restore it.
        for _ in 0..4 {
            if !class.over() || !class.compact_one(&mut self.slots, &mut self.moved) {
                break;
            }
        }
        if self.live == 0 {
            self.slots = Vec::new();
            self.free_slots = Vec::new();
        }
        true
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Their bytes.
    pub fn data_bytes(&self) -> u64 {
        self.data
    }

    /// Bytes of the arenas mapped: objects, free places and tails.
    pub fn held(&self) -> u64 {
        self.classes
            .iter()
            .map(|c| (c.mapped * c.arena_len) as u64)
            .sum()
    }

    /// The heap of the slab's growable tables (slot table, free slot ids, per-class arena
    /// and owner tables), by capacity. The fixed per-class headers (a few KiB) are not
    /// counted.
    pub fn bookkeeping(&self) -> u64 {
        let classes: usize = self
            .classes
            .iter()
            .map(|c| {
                c.arenas.capacity() * std::mem::size_of::<Arena>()
                    + c.owners.capacity() * std::mem::size_of::<u32>()
            })
            .sum();
        (self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.free_slots.capacity() * std::mem::size_of::<u32>()
            + classes) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        /// An object length: uniform over 0..=COMPRESS_LIMIT half the time, else near
        /// 1.3 KiB (the zipf benchmark's pages).
        fn len(&mut self) -> usize {
            if self.next() & 1 == 0 {
                self.below(COMPRESS_LIMIT + 1)
            } else {
                1100 + self.below(500)
            }
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// Checks `slab` against the live objects `model` (slot, tag, bytes): every object
    /// reads back exactly; what the slab counts is the arenas the live objects sit in
    /// (found from the objects, not from the slab's counters) plus its tables by capacity;
    /// no empty arena is held; each class keeps its bound.
    fn check(slab: &Slab, model: &[(u32, u32, Vec<u8>)]) {
        assert_eq!(slab.len(), model.len());
        let mut arenas = HashSet::new();
        for (slot, tag, bytes) in model {
            let (t, b) = slab.get(*slot).expect("a live slot reads");
            assert_eq!((t, b), (*tag, &bytes[..]), "slot {slot}");
            let s = slab.slots[*slot as usize];
            let c = &slab.classes[usize::from(s.class)];
            assert_eq!(
                c.owners[s.arena as usize * c.per + usize::from(s.index)],
                *slot
            );
            arenas.insert((s.class, s.arena));
        }
        let mut held = 0;
        for &(class, arena) in &arenas {
            let c = &slab.classes[usize::from(class)];
            let map = c.arenas[arena as usize].map.as_ref().unwrap();
            let mut v = vec![0u8; map.len / PAGE as usize];
            // SAFETY: mincore only reports on the range, into a vector of one byte per
            // page; it fails (ENOMEM) if any of the range is unmapped.
            let r = unsafe { libc::mincore(map.ptr.as_ptr().cast(), map.len, v.as_mut_ptr()) };
            assert_eq!(r, 0, "arena {class}/{arena} is mapped");
            held += arena_len((usize::from(class) + 1) * GRAIN);
        }
        let mapped: usize = slab
            .classes
            .iter()
            .map(|c| c.arenas.iter().filter(|a| a.map.is_some()).count())
            .sum();
        assert_eq!(mapped, arenas.len(), "every arena held has a live object");
        assert_eq!(slab.held(), held as u64);
        let mut tables = slab.slots.capacity() * 16 + slab.free_slots.capacity() * 4;
        for c in &slab.classes {
            tables += c.arenas.capacity() * std::mem::size_of::<Arena>() + c.owners.capacity() * 4;
        }
        assert_eq!(slab.bookkeeping(), tables as u64);
        assert_eq!(
            slab.data_bytes(),
            model.iter().map(|m| m.2.len() as u64).sum::<u64>()
        );
        // The bound, per class: arenas <= live / (FILL of an arena's objects) + 1.
        for (i, c) in slab.classes.iter().enumerate() {
            let live = model
                .iter()
                .filter(|m| m.2.len().saturating_sub(1) / GRAIN == i)
                .count();
            let arenas = arenas.iter().filter(|a| usize::from(a.0) == i).count();
            assert!(
                arenas <= 1 || FILL.1 * live >= FILL.0 * (arenas - 1) * c.per,
                "class {}: {arenas} arenas of {} for {live} objects",
                c.size,
                c.per
            );
        }
    }
    /// Thousands of random inserts and removals of varying sizes, growing, shrinking and
    /// mixed: everything reads back, the accounting and the bound hold throughout, and
    /// removing everything gives all the memory back.
    #[test]
    fn churn_reads_back_counts_what_it_holds_and_stays_compact() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut slab = Slab::default();
        let mut model: Vec<(u32, u32, Vec<u8>)> = Vec::new();
        let (mut tag, mut removes) = (0u32, 0u64);
        // (ops, percent of them that insert)
        for (round, &(ops, inserts)) in [(6000, 80), (5000, 15), (6000, 50), (4000, 70), (6000, 10)]
            .iter()
            .enumerate()
        {
            for op in 0..ops {
                if model.is_empty() || rng.below(100) < inserts {
                    let len = rng.len();
                    let bytes = rng.bytes(len);
                    let slot = slab.insert(tag, &bytes).unwrap();
                    assert!(
                        model.iter().all(|m| m.0 != slot),
                        "slot {slot} reused while live"
                    );
                    model.push((slot, tag, bytes));
                    tag += 1;
                } else {
                    let (slot, _, _) = model.swap_remove(rng.below(model.len()));
                    assert!(slab.remove(slot));
                    assert!(slab.get(slot).is_none());
                    removes += 1;
                }
                if op % 500 == 0 {
                    check(&slab, &model);
                }
            }
            check(&slab, &model);
            if round == 4 {
                // Most objects are gone: the arenas stay within the bound, stated in bytes:
                // held <= the live objects' class-size places / FILL, plus the arenas'
                // tails (at most 1/64), plus one arena per class in use.
                assert!(model.len() < 2000, "{} left", model.len());
                let places: usize = model
                    .iter()
                    .map(|m| (m.2.len().saturating_sub(1) / GRAIN + 1) * GRAIN)
                    .sum();
                let classes: HashSet<usize> = model
                    .iter()
                    .map(|m| m.2.len().saturating_sub(1) / GRAIN)
                    .collect();
                let bound = places as f64 * FILL.1 as f64 / FILL.0 as f64 * 64.0 / 63.0
                    + classes
                        .iter()
                        .map(|&c| arena_len((c + 1) * GRAIN))
                        .sum::<usize>() as f64;
                assert!(
                    slab.held() as f64 <= bound,
                    "held {} for {places} bytes of places (bound {bound:.0})",
                    slab.held()
                );
            }
        }
        // Compaction happened, at about one object moved per removal at most.
        assert!(
            slab.moved > 0 && slab.moved <= 2 * removes,
            "{} moved for {removes} removals",
            slab.moved
        );
        for (slot, _, _) in model.drain(..) {
            assert!(slab.remove(slot));
        }
        check(&slab, &model);
        assert_eq!(
            (slab.held(), slab.bookkeeping(), slab.data_bytes()),
            (0, 0, 0)
        );
    }

    /// Removing two thirds of every arena's objects leaves arenas a third full: compaction
    /// moves the survivors together (their slot ids unchanged) and unmaps the rest.
    #[test]
    fn compaction_frees_sparse_arenas_and_keeps_slot_ids() {
        let mut rng = Rng(42);
        let mut slab = Slab::default();
        let per = slab.classes[1300 / GRAIN].per;
        let mut model: Vec<(u32, u32, Vec<u8>)> = (0..12 * per as u32)
            .map(|t| {
                let bytes = rng.bytes(1300);
                (slab.insert(t, &bytes).unwrap(), t, bytes)
            })
            .collect();
        assert_eq!(
            slab.held(),
            12 * arena_len(slab.classes[1300 / GRAIN].size) as u64
        );
        let mut kept = Vec::new();
        for (i, m) in model.drain(..).enumerate() {
            if i % 3 == 0 {
                kept.push(m);
            } else {
                assert!(slab.remove(m.0));
            }
        }
        check(&slab, &kept);
        // 4 arenas' worth of objects: at most 4 / FILL + 1 arenas (5 for 15/16).
        let c = &slab.classes[1300 / GRAIN];
        assert!(
            c.mapped <= 4 * FILL.1 / FILL.0 + 1,
            "{} arenas for {} objects of {per} an arena",
            c.mapped,
            c.live
        );
        assert!(c.mapped >= 4);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut slab = Slab::default();
        let e = slab.insert(1, &[0u8; COMPRESS_LIMIT + 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!((slab.len(), slab.held()), (0, 0));
        assert!(slab.get(0).is_none() && slab.get(u32::MAX).is_none());
        assert!(!slab.remove(7) && !slab.remove(u32::MAX));
        let a = slab.insert(5, &[]).unwrap();
        let b = slab.insert(6, &[1u8; COMPRESS_LIMIT]).unwrap();
        assert_eq!(slab.get(a), Some((5, &[][..])));
        assert!(slab.remove(a));
        assert!(!slab.remove(a), "a second removal is a no-op");
        assert_eq!(slab.get(b).unwrap().1.len(), COMPRESS_LIMIT);
        assert!(slab.remove(b));
        assert_eq!((slab.held(), slab.bookkeeping()), (0, 0));
    }

    #[test]
    fn arenas_waste_at_most_a_64th_past_their_last_object() {
        for c in 1..=CLASSES {
            let size = c * GRAIN;
            let len = arena_len(size);
            assert!((8..=16).contains(&(len / PAGE as usize)) && len % PAGE as usize == 0);
            assert!(len % size <= len / 64, "class {size}: arena {len}");
            assert!(len / size <= usize::from(u16::MAX));
        }
    }
}
