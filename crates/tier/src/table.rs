//! Where each page of the RAM file is: in the file (resident, or a hole that reads as
//! zeros), in the compressed store, in the swap file or still only in the base file (a
//! restored VM's snapshot, read on first access); and which resident pages are
//! *armed* (their mappings zapped so the next access is a minor fault we see) or
//! *referenced* (an access was seen since the clock hand last passed: it is spared one turn
//! before being armed again, so a hot page costs a minor fault every other turn, not every
//! turn).
//!
//! Four bytes per page for the location and one bit for the arm: 0.1 % of the RAM, only
//! touched where pages are tiered (the vectors start as untouched zero pages).

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
    referenced: Vec<u64>,
    /// Pages with data in the base file (empty without a base).
    in_base: Vec<u64>,
}

impl Table {
    /// A table for `pages` pages, all in the file, none armed.
    pub fn new(pages: usize) -> Table {
        Table {
            loc: vec![0; pages],
            armed: vec![0; pages.div_ceil(64)],
            armed_count: 0,
            referenced: vec![0; pages.div_ceil(64)],
            in_base: Vec::new(),
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
        self.armed[pg / 64] & (1 << (pg % 64)) != 0
    }

    /// Arms or disarms page `pg`.
    pub fn set_armed(&mut self, pg: usize, on: bool) {
        if self.armed(pg) != on {
            set_bit(&mut self.armed, pg, on);
            if on {
                self.armed_count += 1;
            } else {
                self.armed_count -= 1;
            }
        }
    }

    /// How many pages are armed.
    pub fn armed_count(&self) -> usize {
        self.armed_count
    }

    /// Whether an access to page `pg` was seen since the hand last passed it.
    pub fn referenced(&self, pg: usize) -> bool {
        self.referenced[pg / 64] & (1 << (pg % 64)) != 0
    }

    /// Sets or clears page `pg`'s referenced bit.
    pub fn set_referenced(&mut self, pg: usize, on: bool) {
        set_bit(&mut self.referenced, pg, on);
    }
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
}
