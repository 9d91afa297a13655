//! Consistency check and repair of a chain's top file (and read-only checks of its bases).

use std::collections::HashMap;
use std::path::Path;

use crate::chain::{Chain, OpenOptions};
use crate::error::Result;
use crate::format::EntryKind;
use crate::image::{Image, Problem};

/// Outcome of a check.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    /// Problems that can make data read wrong.
    pub corruptions: Vec<Problem>,
    /// Problems that only waste space (or are harmless crash residue).
    pub leaks: Vec<Problem>,
    /// Allocated data clusters in the top file.
    pub allocated_clusters: u64,
    /// Physical slots in the top file.
    pub total_slots: u64,
}

impl CheckReport {
    /// qemu-img-like exit code: 0 clean, 2 corruption, 3 leaks only.
    pub fn exit_code(&self) -> i32 {
        if !self.corruptions.is_empty() {
            2
        } else if !self.leaks.is_empty() {
            3
        } else {
            0
        }
    }
    fn push(&mut self, p: Problem) {
        if p.corruption {
            self.corruptions.push(p);
        } else {
            self.leaks.push(p);
        }
    }
}

/// What a repair did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairSummary {
    /// Damaged entries cleared.
    pub entries_cleared: u64,
    /// Leaked or unreachable slots freed.
    pub slots_freed: u64,
    /// Snapshots dropped because their record or ancestry was damaged.
    pub snapshots_dropped: u64,
    /// True if the header was rewritten.
    pub header_rewritten: bool,
}

/// Checks one file's metadata (entries, snapshot records, epochs, duplicates).
pub fn check_image(img: &Image) -> CheckReport {
    let mut r = CheckReport::default();
    for p in &img.problems {
        r.push(p.clone());
    }
    r.total_slots = img.slot_count();
    let h = img.header();
    // Epoch reachability.
    let mut live = std::collections::HashSet::new();
    match img.lineage() {
        Ok(l) => live.extend(l),
        Err(e) => r.push(Problem {
            corruption: true,
            slot: None,
            what: e.to_string(),
        }),
    }
    for s in img.snapshots.values() {
        match img.lineage_from(s.record.epoch, s.record.parent) {
            Ok(l) if !s.hidden => live.extend(l),
            Ok(_) => {}
            Err(e) => r.push(Problem {
                corruption: true,
                slot: Some(s.slot),
                what: format!("snapshot {:?}: {e}", s.record.name),
            }),
        }
    }
    let mut seen: HashMap<(u32, u64), u64> = HashMap::new();
    for slot in 0..img.slot_count() {
        let m = img.slot(slot);
        match m.kind {
            EntryKind::Data | EntryKind::Zero => {
                if m.kind == EntryKind::Data {
                    r.allocated_clusters += 1;
                }
                if !live.contains(&m.epoch) {
                    r.push(Problem {
                        corruption: false,
                        slot: Some(slot),
                        what: format!("cluster of unreachable epoch {} (leaked)", m.epoch),
                    });
                } else if let Some(first) = seen.insert((m.epoch, m.logical), slot) {
                    seen.insert((m.epoch, m.logical), first);
                    r.push(Problem {
                        corruption: false,
                        slot: Some(slot),
                        what: format!(
                            "duplicate of slot {first} for logical cluster {} (interrupted compaction)",
                            m.logical
                        ),
                    });
                }
            }
            EntryKind::Snapshot => {
                if m.epoch != h.current_epoch
                    && img.snapshots.get(&m.epoch).is_some_and(|s| s.slot == slot)
                    && !live.contains(&m.epoch)
                {
                    r.push(Problem {
                        corruption: false,
                        slot: Some(slot),
                        what: format!(
                            "deleted snapshot record of epoch {} no longer needed",
                            m.epoch
                        ),
                    });
                }
            }
            EntryKind::Free => {}
        }
    }
    r
}

impl Chain {
    /// Checks every file of the chain; problems of base files are prefixed with their path.
    pub fn check(&self) -> CheckReport {
        let mut report = check_image(&self.images[0]);
        for img in &self.images[1..] {
            let r = check_image(img);
            for mut p in r.corruptions.into_iter().chain(r.leaks) {
                p.what = format!("base {}: {}", img.path().display(), p.what);
                report.push(p);
            }
        }
        report
    }

    /// Repairs the top file: clears damaged entries, drops snapshots with damaged records or
    /// ancestry, frees leaked and duplicate slots, rewrites a stale header slot.
    pub fn repair(&mut self) -> Result<RepairSummary> {
        let mut sum = RepairSummary::default();
        let img = &mut self.images[0];
        let geo = img.geometry();
        // 1. Damaged entries and interrupted first writes: zero both copies.
        let report = check_image(img);
        let pair = vec![0u8; geo.pair_size() as usize];
        for p in report.corruptions.iter().chain(&report.leaks) {
            if let Some(slot) = p.slot {
                let m = img.slot(slot);
                let damaged = img.bad_slots.contains(&slot)
                    || (m.kind == EntryKind::Free && !img.free.contains(&slot));
                if damaged {
                    img.storage().write_at(&pair, geo.entry_offset(slot))?;
                    sum.entries_cleared += 1;
                }
            }
        }
        // 2. Snapshot records that failed to load: free their slots.
        for slot in 0..img.slot_count() {
            let m = img.slot(slot);
            if m.kind == EntryKind::Snapshot
                && m.epoch != img.header().current_epoch
                && img.snapshots.get(&m.epoch).is_none_or(|s| s.slot != slot)
            {
                img.free_slot(slot)?;
                sum.slots_freed += 1;
            }
        }
        img.storage().flush()?;
        // 3. Snapshots whose ancestry is broken are dropped; a broken writable lineage is cut.
        loop {
            let broken: Vec<u32> = img
                .snapshots
                .values()
                .filter(|s| img.lineage_from(s.record.epoch, s.record.parent).is_err())
                .map(|s| s.record.epoch)
                .collect();
            if broken.is_empty() {
                break;
            }
            for e in broken {
                if let Some(s) = img.snapshots.remove(&e) {
                    img.free_slot(s.slot)?;
                    sum.snapshots_dropped += 1;
                }
            }
        }
        let stale_header = img.problems.iter().any(|p| p.slot.is_none());
        if img.lineage().is_err() {
            let mut h = img.header().clone();
            h.current_parent = 0;
            img.write_header(h)?;
            sum.header_rewritten = true;
        } else if stale_header {
            let h = img.header().clone();
            img.write_header(h)?;
            sum.header_rewritten = true;
        }
        img.storage().flush()?;
        // 4. Reopen, then free unreachable epochs and duplicates.
        let storage = img.storage().clone();
        *img = Image::open(storage, true)?;
        img.problems.retain(|p| p.corruption);
        self.rebuild()?;
        sum.slots_freed += self.collect_garbage()?;
        let report = check_image(&self.images[0]);
        for p in report.leaks {
            if let (Some(slot), true) = (p.slot, p.what.starts_with("duplicate")) {
                self.images[0].free_slot(slot)?;
                sum.slots_freed += 1;
            }
        }
        self.flush()?;
        let storage = self.images[0].storage().clone();
        self.images[0] = Image::open(storage, true)?;
        self.rebuild()?;
        Ok(sum)
    }
}

/// Opens `path` for checking (tolerating corruption) and returns the report.
pub fn check_path(path: &Path) -> Result<CheckReport> {
    let chain = Chain::open(
        path,
        OpenOptions {
            writable: false,
            writable_bases: false,
            allow_corrupt: true,
        },
    )?;
    Ok(chain.check())
}
