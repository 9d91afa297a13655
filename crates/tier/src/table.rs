//! Where each page of the RAM file is: in the file (resident, or a hole that reads as
//! zeros), in the compressed store, in the swap file or still only in the base file (a
//! restored VM's snapshot, read on first access); and which resident pages are
//! *armed* (their mappings zapped so the next access is a minor fault we see) or
//! *referenced* (an access was seen since the clock hand last passed: it is spared one turn
//! before being armed again, so a hot page costs a minor fault every other turn, not every
//! turn).
//!
//! It also keeps each page's history, the frequency signal the clock hand lacks: when it
//! left (an eviction number) and, once it is back, until when it is *protected* (the hand
//! neither arms nor takes it), and a small count of how often it came back soon after
//! leaving (a *near refault*, as the kernel's workingset detection calls one).
//!
//! Nine bytes and four bits per page (0.2 % of the RAM), and a queue of the armed pages
//! (four bytes each, a few thousand); the vectors start as untouched zero pages and only
//! cost memory where pages are tiered.

use std::collections::VecDeque;

/// Where a page's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Location {
    /// In the RAM file (resident), or a hole there (zeros).
    File,
    /// In the compressed store, at this slot.
    Compressed(u32),
    /// In the swap file, at this slot.
    Swap(u32),
    /// Never loaded: the base file holds it, at the same offset.
    Base,
}

const SWAP_BIT: u32 = 1 << 31;
/// The encoding of [`Location::Base`] (one swap slot short of the top).
const BASE: u32 = u32::MAX;

/// Per-page locations and arm bits of one RAM file.
pub(crate) struct Table {
    loc: Vec<u32>,
    armed: Vec<u64>,
    /// How many pages are armed.
    armed_count: usize,
    /// Pages in the order they were armed, oldest first: the next victims. An entry whose
    /// page is no longer armed (touched, evicted, discarded) is skipped when reached.
    arm_queue: VecDeque<u32>,
    referenced: Vec<u64>,
    /// Pages with data in the base file (empty without a base).
    in_base: Vec<u64>,
    /// Pages the file holds (resident, or swapped by the host), as far as the tier knows:
    /// set where a page enters the file through it (a fault it serves, a page written
    /// back), cleared where it punches one out. The clock hand walks these, with no
    /// system call; [`Table::in_file_count`] is checked against the file's block count.
    in_file: Vec<u64>,
    in_file_count: usize,
    /// Out of the file: the eviction number it left at; back in: the eviction number
    /// its protection lasts until. 0: none.
    stamp: Vec<u32>,
    /// Two counts of at most [`MAX_REFAULTS`] each: near refaults (the low 4 bits) and
    /// touches while armed (the high 4 bits); a far refault halves both.
    refaults: Vec<u8>,
}

/// The most near refaults (or touches while armed) a page's count holds.
pub(crate) const MAX_REFAULTS: u8 = 15;

impl Table {
    /// A table for `pages` pages, all in the file, none armed.
    pub fn new(pages: usize) -> Table {
        Table {
            loc: vec![0; pages],
            armed: vec![0; pages.div_ceil(64)],
            armed_count: 0,
            arm_queue: VecDeque::new(),
            referenced: vec![0; pages.div_ceil(64)],
            in_base: Vec::new(),
            stamp: vec![0; pages],
            refaults: vec![0; pages],
            in_file: vec![0; pages.div_ceil(64)],
            in_file_count: 0,
        }
    }

    /// Whether the base file has data at page `pg`.
    pub fn in_base(&self, pg: usize) -> bool {
        self.in_base
            .get(pg / 64)
            .is_some_and(|w| w & (1 << (pg % 64)) != 0)
    }

    /// Records that the base file has data at page `pg` (and that the page is there).
    pub fn set_base(&mut self, pg: usize) {
        if self.in_base.is_empty() {
            self.in_base = vec![0; self.loc.len().div_ceil(64)];
        }
        set_bit(&mut self.in_base, pg, true);
        self.set(pg, Location::Base);
    }

    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.loc.len()
    }

    /// Where page `pg` is.
    pub fn get(&self, pg: usize) -> Location {
        match self.loc[pg] {
            0 => Location::File,
            BASE => Location::Base,
            v if v & SWAP_BIT != 0 => Location::Swap(v & !SWAP_BIT),
            v => Location::Compressed(v - 1),
        }
    }

    /// Records where page `pg` is.
    pub fn set(&mut self, pg: usize, at: Location) {
        self.loc[pg] = match at {
            Location::File => 0,
            Location::Compressed(s) => {
                assert!(s < SWAP_BIT - 1, "compressed slot overflow");
                s + 1
            }
            Location::Swap(s) => {
                assert!(s < SWAP_BIT - 1, "swap slot overflow");
                s | SWAP_BIT
            }
            Location::Base => BASE,
        };
    }

    /// Whether page `pg` is armed.
    pub fn armed(&self, pg: usize) -> bool {
        bit(&self.armed, pg)
    }

    /// Arms or disarms page `pg`; a page armed joins the back of the queue.
    pub fn set_armed(&mut self, pg: usize, on: bool) {
        if set_counted(&mut self.armed, &mut self.armed_count, pg, on) && on {
            self.arm_queue.push_back(pg as u32);
            // Entries of pages disarmed since pile up while nothing is evicted (a VM just
            // under its budget): drop them once they outnumber the armed pages.
            if self.arm_queue.len() > 2 * self.armed_count + 1024 {
                self.arm_queue.retain(|&p| bit(&self.armed, p as usize));
            }
        }
    }

    /// Takes the page armed longest ago off the queue (it stays armed): the next victim.
    pub fn oldest_armed(&mut self) -> Option<usize> {
        while let Some(p) = self.arm_queue.pop_front() {
            if self.armed(p as usize) {
                return Some(p as usize);
            }
        }
        // Emptied after a budget cut's long queue: give its memory back.
        self.arm_queue.shrink_to(1024);
        None
    }

    /// Puts `pages` (taken by [`Table::oldest_armed`], in that order) back at the front
    /// of the armed queue, those still armed: the next victims again.
    pub fn requeue_armed(&mut self, pages: &[usize]) {
        for &p in pages.iter().rev() {
            if self.armed(p) {
                self.arm_queue.push_front(p as u32);
            }
        }
    }

    /// How many pages are armed.
    pub fn armed_count(&self) -> usize {
        self.armed_count
    }

    /// Whether an access to page `pg` was seen since the hand last passed it.
    pub fn referenced(&self, pg: usize) -> bool {
        bit(&self.referenced, pg)
    }

    /// Sets or clears page `pg`'s referenced bit.
    pub fn set_referenced(&mut self, pg: usize, on: bool) {
        set_bit(&mut self.referenced, pg, on);
    }
}

impl Table {
    /// Records whether the file holds page `pg`.
    pub fn set_in_file(&mut self, pg: usize, on: bool) {
        set_counted(&mut self.in_file, &mut self.in_file_count, pg, on);
    }

    /// How many pages the file holds.
    pub fn in_file_count(&self) -> usize {
        self.in_file_count
    }

    /// Forgets which pages the file holds (before they are counted again).
    pub fn clear_in_file(&mut self) {
        self.in_file.fill(0);
        self.in_file_count = 0;
    }

    /// The first page in `[from, end)` the file holds.
    pub fn next_in_file(&self, from: usize, end: usize) -> Option<usize> {
        let end = end.min(self.loc.len());
        let mut pg = from;
        while pg < end {
            let word = self.in_file[pg / 64] >> (pg % 64);
            if word != 0 {
                let found = pg + word.trailing_zeros() as usize;
                return (found < end).then_some(found);
            }
            pg = (pg / 64 + 1) * 64;
        }
        None
    }

    /// Records that page `pg` left the file as eviction number `seq` (not 0).
    pub fn set_evicted(&mut self, pg: usize, seq: u32) {
        self.stamp[pg] = seq;
    }

    /// Page `pg` came back at eviction number `now`: how many evictions ago it left, if
    /// it was evicted; its protection ends either way.
    pub fn take_distance(&mut self, pg: usize, now: u32) -> Option<u32> {
        let left = std::mem::take(&mut self.stamp[pg]);
        (left != 0).then(|| now.wrapping_sub(left))
    }

    /// Counts a near refault of page `pg` (`near`), or halves its counts of near refaults
    /// and of touches (a far one: it had gone cold); returns its count of near refaults.
    pub fn count_refault(&mut self, pg: usize, near: bool) -> u8 {
        let c = &mut self.refaults[pg];
        let (refaults, touches) = (*c & 0x0f, *c >> 4);
        let (refaults, touches) = if near {
            ((refaults + 1).min(MAX_REFAULTS), touches)
        } else {
            (refaults / 2, touches / 2)
        };
        *c = touches << 4 | refaults;
        refaults
    }

    /// Counts a touch of page `pg` while it was armed; returns how many it has had.
    pub fn count_touch(&mut self, pg: usize) -> u8 {
        let c = &mut self.refaults[pg];
        let touches = ((*c >> 4) + 1).min(MAX_REFAULTS);
        *c = touches << 4 | (*c & 0x0f);
        touches
    }

    /// Protects resident page `pg` until eviction number `until` (not 0).
    pub fn protect(&mut self, pg: usize, until: u32) {
        self.stamp[pg] = until;
    }

    /// Whether resident page `pg` is protected at eviction number `now`.
    pub fn protected(&self, pg: usize, now: u32) -> bool {
        let until = self.stamp[pg];
        // Protections last far less than 2^31 evictions: the wrapping difference is the
        // time left.
        until != 0 && (until.wrapping_sub(now) as i32) > 0
    }

    /// Forgets page `pg`'s history (its data is gone: a discard).
    pub fn clear_history(&mut self, pg: usize) {
        self.stamp[pg] = 0;
        self.refaults[pg] = 0;
    }
}

fn bit(bits: &[u64], pg: usize) -> bool {
    bits[pg / 64] & (1 << (pg % 64)) != 0
}

/// Sets or clears page `pg`'s bit, keeping `count` of the bits set; whether it changed.
fn set_counted(bits: &mut [u64], count: &mut usize, pg: usize, on: bool) -> bool {
    if bit(bits, pg) == on {
        return false;
    }
    set_bit(bits, pg, on);
    if on {
        *count += 1;
    } else {
        *count -= 1;
    }
    true
}

fn set_bit(bits: &mut [u64], pg: usize, on: bool) {
    let bit = 1u64 << (pg % 64);
    if on {
        bits[pg / 64] |= bit;
    } else {
        bits[pg / 64] &= !bit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_round_trip() {
        let mut t = Table::new(130);
        for (pg, at) in [
            (0, Location::Compressed(0)),
            (1, Location::Swap(0)),
            (129, Location::Swap(SWAP_BIT - 2)),
            (3, Location::Base),
            (64, Location::Compressed(12345)),
        ] {
            t.set(pg, at);
            assert_eq!(t.get(pg), at);
        }
        assert_eq!(t.get(2), Location::File);
        t.set(1, Location::File);
        assert_eq!(t.get(1), Location::File);
    }

    #[test]
    fn arm_bits_are_per_page() {
        let mut t = Table::new(130);
        t.set_armed(64, true);
        t.set_armed(129, true);
        assert!(t.armed(64) && t.armed(129) && !t.armed(63) && !t.armed(65));
        t.set_armed(129, true);
        assert_eq!(t.armed_count(), 2);
        t.set_armed(64, false);
        t.set_armed(64, false);
        assert!(!t.armed(64) && t.armed(129));
        assert_eq!(t.armed_count(), 1);
        t.set_referenced(64, true);
        assert!(t.referenced(64) && !t.referenced(129) && !t.armed(64));
        t.set_referenced(64, false);
        assert!(!t.referenced(64));
        assert!(!t.in_base(64));
        t.set_base(64);
        assert!(t.in_base(64) && !t.in_base(63) && t.get(64) == Location::Base);
        t.set(64, Location::File);
        assert!(
            t.in_base(64),
            "the base keeps its data whatever the page's location"
        );
    }

    #[test]
    fn pages_in_the_file_are_found_in_order() {
        let mut t = Table::new(300);
        assert_eq!(t.next_in_file(0, 300), None);
        for pg in [5, 63, 64, 200, 299] {
            t.set_in_file(pg, true);
        }
        t.set_in_file(64, true);
        assert_eq!(t.in_file_count(), 5);
        assert_eq!(t.next_in_file(0, 300), Some(5));
        assert_eq!(t.next_in_file(6, 300), Some(63));
        assert_eq!(t.next_in_file(64, 300), Some(64));
        assert_eq!(t.next_in_file(65, 300), Some(200));
        assert_eq!(t.next_in_file(65, 200), None, "the end is exclusive");
        assert_eq!(t.next_in_file(201, 1000), Some(299));
        t.set_in_file(200, false);
        t.set_in_file(200, false);
        assert_eq!(t.next_in_file(65, 300), Some(299));
        assert_eq!(t.in_file_count(), 4);
        t.clear_in_file();
        assert_eq!((t.in_file_count(), t.next_in_file(0, 300)), (0, None));
    }

    #[test]
    fn victims_not_evicted_go_back_first() {
        let mut t = Table::new(100);
        for pg in [5, 6, 7, 8] {
            t.set_armed(pg, true);
        }
        let taken: Vec<usize> = (0..3).filter_map(|_| t.oldest_armed()).collect();
        assert_eq!(taken, [5, 6, 7]);
        // 5 was evicted; 6 was touched meanwhile (disarmed); 7 waits for the next step.
        t.set_armed(5, false);
        t.set_armed(6, false);
        t.requeue_armed(&taken[1..]);
        assert_eq!(
            t.oldest_armed(),
            Some(7),
            "ahead of the pages armed after it"
        );
        assert_eq!(t.oldest_armed(), Some(8));
        assert_eq!(t.oldest_armed(), None);
    }

    #[test]
    fn victims_come_in_arming_order() {
        let mut t = Table::new(5000);
        for pg in [7, 3, 9, 4] {
            t.set_armed(pg, true);
        }
        t.set_armed(3, false);
        assert_eq!(t.oldest_armed(), Some(7));
        assert_eq!(t.oldest_armed(), Some(9), "a disarmed page is skipped");
        // Taken off the queue, still armed until evicted.
        assert!(t.armed(7) && t.armed(9));
        t.set_armed(7, false);
        t.set_armed(9, false);
        assert_eq!(t.oldest_armed(), Some(4));
        assert_eq!(t.oldest_armed(), None);
        // Arming and disarming without evictions does not grow the queue without bound.
        for round in 0..10 {
            for pg in 0..4000 {
                t.set_armed(pg, true);
                if pg % 4 != round % 4 {
                    t.set_armed(pg, false);
                }
            }
        }
        assert!(t.arm_queue.len() <= 2 * t.armed_count() + 1024);
        let armed = t.armed_count();
        assert_eq!(armed, 1000);
        let mut n = 0;
        while let Some(pg) = t.oldest_armed() {
            assert!(t.armed(pg));
            t.set_armed(pg, false);
            n += 1;
        }
        assert_eq!(n, armed, "every armed page is on the queue");
        assert_eq!(t.armed_count(), 0);
    }

    #[test]
    fn history_measures_refault_distance_and_protection() {
        let mut t = Table::new(4);
        assert_eq!(t.take_distance(0, 10), None, "never evicted");
        t.set_evicted(0, u32::MAX - 2);
        // Eviction numbers wrap (and skip 0).
        assert_eq!(t.take_distance(0, 5), Some(8));
        assert_eq!(t.take_distance(0, 6), None, "taken once");
        assert_eq!(t.count_refault(1, true), 1);
        assert_eq!(t.count_refault(1, true), 2);
        assert_eq!(t.count_refault(1, true), 3);
        assert_eq!(t.count_refault(1, false), 1);
        for _ in 0..40 {
            t.count_refault(2, true);
        }
        assert_eq!(t.count_refault(2, true), MAX_REFAULTS);
        // Touches while armed count apart, and a far refault halves them too.
        for _ in 0..20 {
            t.count_touch(1);
        }
        assert_eq!(t.count_touch(1), MAX_REFAULTS);
        assert_eq!(
            t.count_refault(1, true),
            2,
            "near refaults are their own count"
        );
        assert_eq!(t.count_refault(1, false), 1);
        assert_eq!(t.count_touch(1), MAX_REFAULTS / 2 + 1);
        assert!(!t.protected(3, 100));
        t.protect(3, 200);
        assert!(t.protected(3, 100) && t.protected(3, 199));
        assert!(!t.protected(3, 200) && !t.protected(3, 5000));
        t.protect(3, 3);
        assert!(t.protected(3, u32::MAX - 10), "across the wrap");
        t.clear_history(3);
        t.clear_history(2);
        assert!(!t.protected(3, 0) && t.count_refault(2, false) == 0);
    }
}
