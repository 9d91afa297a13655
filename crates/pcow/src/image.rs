//! One pcow file: header slots, the entry table scanned from the meta clusters, slot
//! allocation and crash-ordered entry updates. Chains of files are in `chain.rs`.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::error::{PcowError, Result};
use crate::format::{
    copy_seq, copy_state, parse_checked, seq_newer, Entry, EntryKind, Geometry, Header, RawSlot,
    SnapshotRecord, HEADER_SLOT_SIZE, MAX_SLOTS, SNAPSHOT_RECORD_SIZE,
};
use crate::storage::Storage;

/// Flag in the `logical` field of a `Snapshot` entry: the snapshot was deleted but its
/// epoch is still needed by descendants.
pub const SNAPSHOT_HIDDEN: u64 = 1;

/// In-memory state of one physical slot's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotMeta {
    /// Logical cluster (or flags for snapshot entries).
    pub logical: u64,
    /// Owning epoch.
    pub epoch: u32,
    /// Kind; `Free` for empty slots.
    pub kind: EntryKind,
    /// Sequence number of the active slot.
    pub seq: u32,
    /// Which of the two slots holds the active copy (the next write goes to the other).
    pub active: u8,
}

/// A problem found while scanning metadata (reported by `check`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// True for corruption (data may be wrong), false for a leak (space only).
    pub corruption: bool,
    /// Physical slot concerned, if any.
    pub slot: Option<u64>,
    /// Human-readable description.
    pub what: String,
}

/// A snapshot as recorded in the file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotInfo {
    /// Physical slot holding the record.
    pub slot: u64,
    /// True if the snapshot was deleted but its data is still used by descendants.
    pub hidden: bool,
    /// The record.
    pub record: SnapshotRecord,
}

/// One open pcow file.
pub struct Image {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) geo: Geometry,
    pub(crate) header: Header,
    header_slot: usize,
    pub(crate) writable: bool,
    pub(crate) slots: Vec<SlotMeta>,
    pub(crate) bitmaps: Vec<u64>,
    /// Empty slots below `tail` (their data may be stale).
    pub(crate) free: BTreeSet<u64>,
    /// First slot whose data cluster lies at or beyond the end of the file (known zero).
    pub(crate) tail: u64,
    /// Committed snapshots by epoch.
    pub(crate) snapshots: HashMap<u32, SnapshotInfo>,
    /// Problems found by the scan.
    pub(crate) problems: Vec<Problem>,
    /// Slots whose entry is unusable (both copies corrupt); never reused before repair.
    pub(crate) bad_slots: BTreeSet<u64>,
}

const EMPTY_SLOT: SlotMeta = SlotMeta {
    logical: 0,
    epoch: 0,
    kind: EntryKind::Free,
    seq: 0,
    active: 1,
};

impl Image {
    /// Writes a fresh image with the given header to empty `storage` and opens it.
    pub fn create(storage: Arc<dyn Storage>, header: Header) -> Result<Image> {
        let geo = Geometry::new(header.cluster_bits)?;
        let bytes = header.encode();
        storage.write_at(&bytes, 0)?;
        storage.write_at(&bytes, HEADER_SLOT_SIZE as u64)?;
        storage.set_len(geo.cluster_size())?;
        storage.flush()?;
        Image::open(storage, true)
    }

    /// Opens a file: reads the newest valid header and scans every meta cluster.
    pub fn open(storage: Arc<dyn Storage>, writable: bool) -> Result<Image> {
        let mut buf = vec![0u8; 2 * HEADER_SLOT_SIZE];
        storage.read_at(&mut buf, 0)?;
        let h0 = Header::decode(&buf[..HEADER_SLOT_SIZE], 0);
        let h1 = Header::decode(&buf[HEADER_SLOT_SIZE..], 1);
        let mut stale_header = None;
        let (header, header_slot) = match (h0, h1) {
            (Ok(a), Ok(b)) => {
                if b.generation > a.generation {
                    (b, 1)
                } else {
                    (a, 0)
                }
            }
            (Ok(a), Err(e)) => {
                stale_header = Some(e);
                (a, 0)
            }
            (Err(e), Ok(b)) => {
                stale_header = Some(e);
                (b, 1)
            }
            (Err(e), Err(_)) => return Err(e),
        };
        let geo = Geometry::new(header.cluster_bits)?;
        let mut img = Image {
            storage,
            geo,
            header,
            header_slot,
            writable,
            slots: Vec::new(),
            bitmaps: Vec::new(),
            free: BTreeSet::new(),
            tail: 0,
            snapshots: HashMap::new(),
            problems: Vec::new(),
            bad_slots: BTreeSet::new(),
        };
        if let Some(e) = stale_header {
            img.problems.push(Problem {
                corruption: false,
                slot: None,
                what: format!("{e} (interrupted header update; the other slot is used)"),
            });
        }
        img.scan()?;
        Ok(img)
    }

    fn scan(&mut self) -> Result<()> {
        let len = self.storage.len()?;
        let geo = self.geo;
        let segments = geo.segments_in(len);
        let nslots = segments.saturating_mul(geo.entries_per_meta);
        if nslots > MAX_SLOTS {
            return Err(self.inconsistent(format!("file length {len} implies too many slots")));
        }
        let words = geo.bitmap_words();
        self.bitmaps = vec![0u64; nslots as usize * words];
        let vclusters = self.virtual_clusters();
        let full = geo.full_bitmap();
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4) as u64;
        let chunks = if segments >= 64 { threads } else { 1 };
        let per = segments.div_ceil(chunks.max(1)).max(1);
        let storage = self.storage.clone();
        self.slots = vec![EMPTY_SLOT; nslots as usize];
        let per_slots = (per * geo.entries_per_meta) as usize;
        let parts: Vec<Result<ScanPart>> = std::thread::scope(|sc| {
            let mut handles = Vec::new();
            let mut slot_rest: &mut [SlotMeta] = &mut self.slots;
            let mut bm_rest: &mut [u64] = &mut self.bitmaps;
            for c in 0..chunks {
                let segs = (c * per).min(segments)..((c + 1) * per).min(segments);
                let n = ((segs.end - segs.start) * geo.entries_per_meta) as usize;
                let (sl, sr) = std::mem::take(&mut slot_rest).split_at_mut(n.min(per_slots));
                let (bl, br) = std::mem::take(&mut bm_rest).split_at_mut(n * words);
                slot_rest = sr;
                bm_rest = br;
                let (st, full) = (&storage, &full);
                handles.push(
                    sc.spawn(move || scan_part(st.as_ref(), geo, segs, vclusters, full, sl, bl)),
                );
            }
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(PcowError::InvalidParameter("scan thread panicked".into()))
                    })
                })
                .collect()
        });
        for part in parts {
            let part = part?;
            self.problems.extend(part.problems);
            self.bad_slots.extend(part.bad_slots);
        }
        // Slots whose data starts at or beyond the end are known zero: the tail.
        let mut tail = nslots;
        while tail > 0
            && self.slots[tail as usize - 1].kind == EntryKind::Free
            && !self.bad_slots.contains(&(tail - 1))
            && geo.data_offset(tail - 1) >= len
        {
            tail -= 1;
        }
        self.tail = tail;
        for s in 0..tail {
            if self.slots[s as usize].kind == EntryKind::Free && !self.bad_slots.contains(&s) {
                self.free.insert(s);
            }
        }
        self.load_snapshots()
    }

    fn load_snapshots(&mut self) -> Result<()> {
        let mut buf = vec![0u8; SNAPSHOT_RECORD_SIZE];
        for slot in 0..self.slots.len() as u64 {
            let m = self.slots[slot as usize];
            if m.kind != EntryKind::Snapshot {
                continue;
            }
            if m.epoch == self.header.current_epoch {
                self.problems.push(Problem {
                    corruption: false,
                    slot: Some(slot),
                    what: "snapshot record of an interrupted snapshot creation".into(),
                });
                continue;
            }
            self.storage.read_at(&mut buf, self.geo.data_offset(slot))?;
            match SnapshotRecord::decode(&buf, slot) {
                Ok(r) if r.epoch == m.epoch && r.epoch < self.header.next_epoch => {
                    if let Some(prev) = self.snapshots.get(&r.epoch) {
                        self.problems.push(Problem {
                            corruption: true,
                            slot: Some(slot),
                            what: format!(
                                "two snapshot records for epoch {} (slot {})",
                                r.epoch, prev.slot
                            ),
                        });
                        continue;
                    }
                    self.snapshots.insert(
                        r.epoch,
                        SnapshotInfo {
                            slot,
                            hidden: m.logical & SNAPSHOT_HIDDEN != 0,
                            record: r,
                        },
                    );
                }
                Ok(_) => self.problems.push(Problem {
                    corruption: true,
                    slot: Some(slot),
                    what: "snapshot record does not match its entry".into(),
                }),
                Err(e) => self.problems.push(Problem {
                    corruption: true,
                    slot: Some(slot),
                    what: e.to_string(),
                }),
            }
        }
        Ok(())
    }

    pub(crate) fn inconsistent(&self, reason: String) -> PcowError {
        PcowError::Inconsistent {
            path: self.storage.path().to_path_buf(),
            reason,
        }
    }

    /// The header currently in force.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// Geometry of this file.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    /// Storage of this file.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }
    /// Number of logical clusters covered by the virtual size.
    pub fn virtual_clusters(&self) -> u64 {
        self.header.virtual_size.div_ceil(self.geo.cluster_size())
    }
    /// Bitmap words of `slot`.
    pub fn bitmap(&self, slot: u64) -> &[u64] {
        let w = self.geo.bitmap_words();
        &self.bitmaps[slot as usize * w..(slot as usize + 1) * w]
    }
    /// Entry state of `slot` (`Free` beyond the table).
    pub fn slot(&self, slot: u64) -> SlotMeta {
        self.slots.get(slot as usize).copied().unwrap_or(EMPTY_SLOT)
    }
    /// Number of slots in the entry table.
    pub fn slot_count(&self) -> u64 {
        self.slots.len() as u64
    }

    fn require_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(PcowError::ReadOnly(self.storage.path().to_path_buf()))
        }
    }

    /// Writes a new header (next generation) into the inactive slot and flushes.
    pub(crate) fn write_header(&mut self, mut h: Header) -> Result<()> {
        self.require_writable()?;
        h.generation = self.header.generation + 1;
        let target = 1 - self.header_slot;
        self.storage
            .write_at(&h.encode(), (target * HEADER_SLOT_SIZE) as u64)?;
        self.storage.flush()?;
        self.header = h;
        self.header_slot = target;
        Ok(())
    }

    /// Writes entry `slot` (into its inactive copy) without flushing.
    pub(crate) fn write_entry(
        &mut self,
        slot: u64,
        kind: EntryKind,
        epoch: u32,
        logical: u64,
        bitmap: &[u64],
    ) -> Result<()> {
        self.require_writable()?;
        while self.slots.len() as u64 <= slot {
            self.slots.push(EMPTY_SLOT);
            self.bitmaps
                .extend(std::iter::repeat_n(0, self.geo.bitmap_words()));
        }
        let old = self.slots[slot as usize];
        let entry = Entry {
            logical,
            epoch,
            kind,
            seq: old.seq.wrapping_add(1),
            bitmap: bitmap.to_vec(),
        };
        let target = 1 - old.active;
        let offset = self.geo.entry_offset(slot) + target as u64 * self.geo.slot_size as u64;
        self.storage.write_at(&entry.encode(&self.geo), offset)?;
        self.slots[slot as usize] = SlotMeta {
            logical,
            epoch,
            kind,
            seq: entry.seq,
            active: target,
        };
        let w = self.geo.bitmap_words();
        self.bitmaps[slot as usize * w..(slot as usize + 1) * w].copy_from_slice(bitmap);
        Ok(())
    }

    /// Takes a slot for a new cluster. With `need_zero`, the data cluster is guaranteed to read
    /// as zeros (fresh tail slot, or a reused slot whose data is punched and flushed first).
    pub(crate) fn take_slot(&mut self, need_zero: bool) -> Result<u64> {
        self.require_writable()?;
        if !need_zero {
            if let Some(s) = self.free.pop_first() {
                return Ok(s);
            }
        }
        if self.tail >= MAX_SLOTS {
            if let Some(s) = self.free.pop_first() {
                self.storage
                    .punch_hole(self.geo.data_offset(s), self.geo.cluster_size())?;
                self.storage.flush()?;
                return Ok(s);
            }
            return Err(PcowError::Full(self.storage.path().to_path_buf()));
        }
        let s = self.tail;
        self.tail += 1;
        Ok(s)
    }

    /// Returns a taken slot that was not used (its entry was never written).
    pub(crate) fn untake_slot(&mut self, slot: u64) {
        if slot + 1 == self.tail {
            self.tail -= 1;
        } else {
            self.free.insert(slot);
        }
    }

    /// Extends the file so that the next `count` tail slots (and their meta clusters) are
    /// allocated on disk. Returns the slot range now preallocated.
    pub fn preallocate(&mut self, count: u64) -> Result<std::ops::Range<u64>> {
        self.require_writable()?;
        let end_slot = (self.tail + count).min(MAX_SLOTS);
        if end_slot > self.tail {
            let from = self.geo.entry_offset(self.tail) & !(self.geo.cluster_size() - 1);
            let to = self.geo.data_offset(end_slot - 1) + self.geo.cluster_size();
            self.storage.preallocate(from, to - from)?;
        }
        Ok(self.tail..end_slot)
    }

    /// Frees `slot`: writes a `Free` entry, flushes, then punches the data (a free slot's
    /// data is never trusted to be zero; see `take_slot`).
    pub(crate) fn free_slot(&mut self, slot: u64) -> Result<()> {
        let zero = vec![0u64; self.geo.bitmap_words()];
        self.write_entry(slot, EntryKind::Free, 0, 0, &zero)?;
        self.storage.flush()?;
        self.storage
            .punch_hole(self.geo.data_offset(slot), self.geo.cluster_size())?;
        self.free.insert(slot);
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset_in_cluster` of physical slot `slot`'s data cluster.
    pub fn read_data(&self, slot: u64, offset_in_cluster: u64, buf: &mut [u8]) -> Result<()> {
        self.storage
            .read_at(buf, self.geo.data_offset(slot) + offset_in_cluster)
    }

    /// Writes into physical slot `slot`'s data cluster (no flush).
    pub(crate) fn write_data(&self, slot: u64, offset_in_cluster: u64, buf: &[u8]) -> Result<()> {
        self.storage
            .write_at(buf, self.geo.data_offset(slot) + offset_in_cluster)
    }

    /// Snapshots recorded in this file (visible and hidden), sorted by epoch.
    pub fn snapshots(&self) -> Vec<SnapshotInfo> {
        let mut v: Vec<SnapshotInfo> = self.snapshots.values().cloned().collect();
        v.sort_by_key(|s| s.record.epoch);
        v
    }

    /// Epochs of the current lineage, newest first (current, its parent, ...).
    pub fn lineage(&self) -> Result<Vec<u32>> {
        self.lineage_from(self.header.current_epoch, self.header.current_parent)
    }

    /// Lineage starting at `epoch` whose parent is `parent`.
    pub(crate) fn lineage_from(&self, epoch: u32, mut parent: u32) -> Result<Vec<u32>> {
        let mut out = vec![epoch];
        while parent != 0 {
            if out.len() > self.snapshots.len() + 1 || out.contains(&parent) {
                return Err(self.inconsistent(format!("snapshot parent cycle at epoch {parent}")));
            }
            let Some(s) = self.snapshots.get(&parent) else {
                return Err(self.inconsistent(format!(
                    "epoch {} names parent epoch {parent}, which has no snapshot record",
                    out[out.len() - 1]
                )));
            };
            out.push(parent);
            parent = s.record.parent;
        }
        Ok(out)
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        self.storage.path()
    }

    /// Whether the image was opened writable.
    pub fn is_writable(&self) -> bool {
        self.writable
    }
}

/// Entries decoded from a range of segments (scanned in parallel at open).
#[derive(Default)]
struct ScanPart {
    problems: Vec<Problem>,
    bad_slots: BTreeSet<u64>,
}

fn scan_part(
    storage: &dyn Storage,
    geo: Geometry,
    segs: std::ops::Range<u64>,
    vclusters: u64,
    full: &[u64],
    slots: &mut [SlotMeta],
    bitmaps: &mut [u64],
) -> Result<ScanPart> {
    let words = geo.bitmap_words();
    let first_slot = segs.start * geo.entries_per_meta;
    let mut part = ScanPart::default();
    let slot_size = geo.slot_size as usize;
    let mut meta = vec![0u8; geo.cluster_size() as usize];
    for seg in segs.clone() {
        storage.read_at(&mut meta, geo.meta_offset(seg))?;
        for j in 0..geo.entries_per_meta as usize {
            let slot = seg * geo.entries_per_meta + j as u64;
            let pair = &meta[j * 2 * slot_size..(j + 1) * 2 * slot_size];
            let (c0, c1) = (&pair[..slot_size], &pair[slot_size..]);
            let (v0, v1) = (copy_state(c0), copy_state(c1));
            let pick = match (v0, v1) {
                (2, 2) => {
                    if seq_newer(copy_seq(c1), copy_seq(c0)) {
                        Some(1u8)
                    } else {
                        Some(0)
                    }
                }
                (2, _) => Some(0),
                (_, 2) => Some(1),
                (0, 0) => None,
                (1, 1) => {
                    part.problems.push(Problem {
                        corruption: true,
                        slot: Some(slot),
                        what: format!(
                            "entry at offset {} has no valid copy",
                            geo.entry_offset(slot)
                        ),
                    });
                    part.bad_slots.insert(slot);
                    None
                }
                (t0, _) => {
                    // One torn copy and one never-written copy: an interrupted first write.
                    part.problems.push(Problem {
                        corruption: false,
                        slot: Some(slot),
                        what: "interrupted first write of an entry".into(),
                    });
                    let mut m = EMPTY_SLOT;
                    m.active = if t0 == 1 { 1 } else { 0 };
                    slots[(slot - first_slot) as usize] = m;
                    continue;
                }
            };
            let Some(active) = pick else {
                slots[(slot - first_slot) as usize] = EMPTY_SLOT;
                continue;
            };
            let chosen = if active == 0 { c0 } else { c1 };
            // A checksum-valid copy with an unknown kind or bitmap bits beyond the
            // cluster is treated as damaged.
            let e = match parse_checked(chosen, full) {
                RawSlot::Valid(e) => e,
                _ => {
                    part.problems.push(Problem {
                        corruption: true,
                        slot: Some(slot),
                        what: format!(
                            "entry at offset {} has invalid fields",
                            geo.entry_offset(slot)
                        ),
                    });
                    part.bad_slots.insert(slot);
                    slots[(slot - first_slot) as usize] = EMPTY_SLOT;
                    continue;
                }
            };
            if matches!(e.kind, EntryKind::Data | EntryKind::Zero) && e.logical >= vclusters {
                part.problems.push(Problem {
                    corruption: true,
                    slot: Some(slot),
                    what: format!(
                        "entry maps logical cluster {} beyond the virtual size",
                        e.logical
                    ),
                });
                part.bad_slots.insert(slot);
                slots[(slot - first_slot) as usize] = EMPTY_SLOT;
                continue;
            }
            let at = (slot - first_slot) as usize * words;
            bitmaps[at..at + words].copy_from_slice(&e.bitmap[..words]);
            slots[(slot - first_slot) as usize] = SlotMeta {
                logical: e.logical,
                epoch: e.epoch,
                kind: e.kind,
                seq: e.seq,
                active,
            };
        }
    }
    Ok(part)
}
