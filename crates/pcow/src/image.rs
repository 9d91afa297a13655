//! One pcow file: header slots, the entry table scanned from the meta clusters, slot
//! allocation and crash-ordered entry updates. Chains of files are in `chain.rs`.

use std::collections::{BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Arc;

use crate::error::{PcowError, Result};
use crate::format::{
    copy_seq, copy_state, parse_checked_into, seq_newer, Entry, EntryKind, Geometry, Header,
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
    /// Number of `Data`/`Zero` entries per epoch (kept exact by `write_entry`; sizes the
    /// per-layer maps without a counting pass over the slots).
    pub(crate) live_counts: HashMap<u32, u64>,
    /// The file is known to be at least this long: checked or extended through this
    /// image, which nothing shrinks while it is open (compaction reopens the image). Spares
    /// a file-length syscall on every allocation.
    pub(crate) known_len: u64,
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
            live_counts: HashMap::new(),
            known_len: 0,
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
        // Zeroed by the allocator (calloc): bitmap pages of empty slots are never touched.
        self.bitmaps = vec![0u64; nslots as usize * words];
        let vclusters = self.virtual_clusters();
        let full = geo.full_bitmap();
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4) as u64;
        let chunks = if segments >= 64 { threads } else { 1 };
        let per = segments.div_ceil(chunks.max(1)).max(1);
        let storage = self.storage.clone();
        // Every element is written exactly once by the scan threads (no prior fill pass).
        let mut slots: Vec<SlotMeta> = Vec::with_capacity(nslots as usize);
        let parts: Vec<Result<ScanPart>> = std::thread::scope(|sc| {
            let mut handles = Vec::new();
            let mut slot_rest = &mut slots.spare_capacity_mut()[..nslots as usize];
            let mut bm_rest: &mut [u64] = &mut self.bitmaps;
            for c in 0..chunks {
                let segs = (c * per).min(segments)..((c + 1) * per).min(segments);
                let n = ((segs.end - segs.start) * geo.entries_per_meta) as usize;
                let (sl, sr) = std::mem::take(&mut slot_rest).split_at_mut(n);
                let (bl, br) = std::mem::take(&mut bm_rest).split_at_mut(n * words);
                slot_rest = sr;
                bm_rest = br;
                let (st, full) = (&storage, &full);
                handles.push(sc.spawn(move || {
                    let st = st.as_ref();
                    // The slot size is a compile-time constant in the hot loop.
                    match geo.slot_size {
                        32 => scan_part::<32>(st, geo, segs, vclusters, full, sl, bl),
                        64 => scan_part::<64>(st, geo, segs, vclusters, full, sl, bl),
                        128 => scan_part::<128>(st, geo, segs, vclusters, full, sl, bl),
                        other => Err(PcowError::InvalidParameter(format!(
                            "unsupported entry slot size {other}"
                        ))),
                    }
                }));
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
        let mut free = Vec::new();
        let mut snapshot_slots = Vec::new();
        let mut parts_ok = Vec::with_capacity(parts.len());
        for part in parts {
            parts_ok.push(part?);
        }
        // SAFETY: the chunks handed to the threads partition `0..nslots` (segment ranges
        // `c*per..(c+1)*per` clamped to `segments`, `entries_per_meta` slots each), and a
        // `scan_part` that returned Ok has written every element of its chunk (it counts its
        // writes and returns an error otherwise; errors return before we get here).
        unsafe { slots.set_len(nslots as usize) };
        self.slots = slots;
        for part in parts_ok {
            self.problems.extend(part.problems);
            self.bad_slots.extend(part.bad_slots);
            free.extend(part.free);
            snapshot_slots.extend(part.snapshots);
            for (epoch, n) in part.epoch_counts {
                *self.live_counts.entry(epoch).or_insert(0) += n;
            }
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
        // `free` is ascending (parts are in slot order): a sorted bulk build.
        self.free = free.into_iter().filter(|&s| s < tail).collect();
        self.load_snapshots(&snapshot_slots)
    }

    /// Loads the snapshot records of `snapshot_slots` (the slots holding `Snapshot`
    /// entries, ascending).
    fn load_snapshots(&mut self, snapshot_slots: &[u64]) -> Result<()> {
        let mut buf = vec![0u8; SNAPSHOT_RECORD_SIZE];
        for &slot in snapshot_slots {
            let m = self.slots[slot as usize];
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
                        // An interrupted relink (§5): same snapshot, only the parent differs;
                        // both are valid, the lower slot's is used, this one is a leak.
                        let relink = prev.record.name == r.name
                            && prev.record.created_ns == r.created_ns
                            && prev.record.virtual_size == r.virtual_size;
                        self.problems.push(Problem {
                            corruption: !relink,
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
        if is_live(old.kind) {
            if let Some(n) = self.live_counts.get_mut(&old.epoch) {
                *n -= 1;
                if *n == 0 {
                    self.live_counts.remove(&old.epoch);
                }
            }
        }
        if is_live(kind) {
            *self.live_counts.entry(epoch).or_insert(0) += 1;
        }
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
            self.known_len = self.known_len.max(to);
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

/// True for entry kinds that map a logical cluster (`Data`, `Zero`).
#[inline]
pub(crate) fn is_live(kind: EntryKind) -> bool {
    matches!(kind, EntryKind::Data | EntryKind::Zero)
}

/// Entries decoded from a range of segments (scanned in parallel at open).
#[derive(Default)]
struct ScanPart {
    problems: Vec<Problem>,
    bad_slots: BTreeSet<u64>,
    /// Slots left `Free` (and not bad), ascending.
    free: Vec<u64>,
    /// Slots holding `Snapshot` entries, ascending.
    snapshots: Vec<u64>,
    /// Runs of (epoch, number of `Data`/`Zero` entries).
    epoch_counts: Vec<(u32, u64)>,
}

impl ScanPart {
    fn corrupt(&mut self, slot: u64, what: String) -> SlotMeta {
        self.problems.push(Problem {
            corruption: true,
            slot: Some(slot),
            what,
        });
        self.bad_slots.insert(slot);
        EMPTY_SLOT
    }
}

/// Decodes the entries of segments `segs` into `slots` (one value written per slot, every
/// slot of the range) and their bitmaps into `bitmaps` (left zero for slots without one).
/// `S` is `geo.slot_size`.
fn scan_part<const S: usize>(
    storage: &dyn Storage,
    geo: Geometry,
    segs: std::ops::Range<u64>,
    vclusters: u64,
    full: &[u64],
    slots: &mut [MaybeUninit<SlotMeta>],
    bitmaps: &mut [u64],
) -> Result<ScanPart> {
    let words = geo.bitmap_words();
    let epm = geo.entries_per_meta as usize;
    let mut part = ScanPart::default();
    let mut written = 0usize;
    let pair_size = 2 * S;
    let mut meta = vec![0u8; geo.cluster_size() as usize];
    let mut run: Option<(u32, u64)> = None;
    let segments = slots
        .chunks_exact_mut(epm)
        .zip(bitmaps.chunks_exact_mut(epm * words));
    for (seg, (seg_slots, seg_bitmaps)) in segs.zip(segments) {
        storage.read_at(&mut meta, geo.meta_offset(seg))?;
        let entries = meta.chunks_exact(pair_size).zip(seg_slots.iter_mut());
        for (j, (pair, out)) in entries.enumerate() {
            let slot = seg * geo.entries_per_meta + j as u64;
            let (c0, c1) = pair.split_at(S);
            let m = match (copy_state(c0), copy_state(c1)) {
                (0, 0) => EMPTY_SLOT,
                (1, 1) => part.corrupt(
                    slot,
                    format!(
                        "entry at offset {} has no valid copy",
                        geo.entry_offset(slot)
                    ),
                ),
                (v0, v1) if v0 != 2 && v1 != 2 => {
                    // One torn copy and one never-written copy: an interrupted first write.
                    part.problems.push(Problem {
                        corruption: false,
                        slot: Some(slot),
                        what: "interrupted first write of an entry".into(),
                    });
                    let mut m = EMPTY_SLOT;
                    m.active = if v0 == 1 { 1 } else { 0 };
                    m
                }
                (v0, v1) => {
                    let active = if v0 == 2 && (v1 != 2 || !seq_newer(copy_seq(c1), copy_seq(c0))) {
                        0u8
                    } else {
                        1
                    };
                    let chosen = if active == 0 { c0 } else { c1 };
                    // A checksum-valid copy with an unknown kind or bitmap bits beyond the
                    // cluster is treated as damaged.
                    let at = j * words;
                    match parse_checked_into(chosen, full, &mut seg_bitmaps[at..at + words]) {
                        Some(e) if is_live(e.kind) && e.logical >= vclusters => {
                            seg_bitmaps[at..at + words].fill(0);
                            part.corrupt(
                                slot,
                                format!(
                                    "entry maps logical cluster {} beyond the virtual size",
                                    e.logical
                                ),
                            )
                        }
                        Some(e) => {
                            if is_live(e.kind) {
                                match &mut run {
                                    Some((ep, n)) if *ep == e.epoch => *n += 1,
                                    _ => {
                                        part.epoch_counts.extend(run.take());
                                        run = Some((e.epoch, 1));
                                    }
                                }
                            } else if e.kind == EntryKind::Snapshot {
                                part.snapshots.push(slot);
                            }
                            SlotMeta {
                                logical: e.logical,
                                epoch: e.epoch,
                                kind: e.kind,
                                seq: e.seq,
                                active,
                            }
                        }
                        None => {
                            seg_bitmaps[at..at + words].fill(0);
                            part.corrupt(
                                slot,
                                format!(
                                    "entry at offset {} has invalid fields",
                                    geo.entry_offset(slot)
                                ),
                            )
                        }
                    }
                }
            };
            if m.kind == EntryKind::Free && part.bad_slots.last() != Some(&slot) {
                part.free.push(slot);
            }
            out.write(m);
            written += 1;
        }
    }
    part.epoch_counts.extend(run);
    if written != slots.len() {
        // Unreachable by construction; the caller relies on every slot being written.
        return Err(PcowError::InvalidParameter(format!(
            "scan wrote {written} of {} slots",
            slots.len()
        )));
    }
    Ok(part)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::{is_live, Image};
    use crate::chain::Chain;
    use crate::ops::{new_header, CreateOptions};
    use crate::storage::{MemStorage, Storage};

    /// Per-epoch `Data`/`Zero` counts recomputed from the slot table.
    fn recount(img: &Image) -> HashMap<u32, u64> {
        let mut counts = HashMap::new();
        for m in img.slots.iter().filter(|m| is_live(m.kind)) {
            *counts.entry(m.epoch).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn live_counts_stay_exact_through_updates_and_match_a_rescan() {
        let st: Arc<dyn Storage> = Arc::new(MemStorage::new("counts"));
        let opts = CreateOptions {
            virtual_size: 64 << 16,
            cluster_size: 1 << 16,
            backing: None,
        };
        Image::create(st.clone(), new_header(&opts, [0; 16]).unwrap()).unwrap();
        let mut chain =
            Chain::from_images(vec![Image::open(st.clone(), true).unwrap()], false).unwrap();
        let check = |chain: &Chain| {
            let img = &chain.images()[0];
            assert_eq!(img.live_counts, recount(img));
            let reopened = Image::open(st.clone(), false).unwrap();
            assert_eq!(reopened.live_counts, recount(&reopened));
            assert_eq!(reopened.live_counts, img.live_counts);
        };
        chain.write(0, &vec![1u8; 5 << 16]).unwrap();
        check(&chain);
        chain.snapshot_create("a").unwrap();
        chain.write(2 << 16, &vec![2u8; 4 << 16]).unwrap();
        chain.discard(0, 1 << 16).unwrap();
        check(&chain);
        assert!(
            chain.images()[0].live_counts.len() >= 2,
            "two epochs hold clusters"
        );
        chain.snapshot_apply("a").unwrap();
        check(&chain);
        chain.snapshot_delete("a").unwrap();
        chain.discard(0, 64 << 16).unwrap();
        check(&chain);
    }

    #[test]
    fn reopen_reproduces_the_entry_table_for_every_cluster_size() {
        for bits in 12..=21u32 {
            let cs = 1u64 << bits;
            let st: Arc<dyn Storage> = Arc::new(MemStorage::new("sizes"));
            let opts = CreateOptions {
                virtual_size: 8 * cs,
                cluster_size: cs,
                backing: None,
            };
            Image::create(st.clone(), new_header(&opts, [0; 16]).unwrap()).unwrap();
            let img = Image::open(st.clone(), true).unwrap();
            let mut chain = Chain::from_images(vec![img], false).unwrap();
            chain.write(0, &vec![3u8; cs as usize + 4096]).unwrap();
            chain.snapshot_create("s").unwrap();
            chain.write(5 * cs, &[4u8; 4096]).unwrap();
            chain.write(0, &[5u8; 4096]).unwrap();
            // Frees the writable layer's cluster 5: its entry's second copy is written.
            chain.discard(5 * cs, cs).unwrap();
            chain.flush().unwrap();
            let before = &chain.images()[0];
            let after = Image::open(st.clone(), false).unwrap();
            // The in-memory table only grows to the last written slot; a reopen covers whole
            // meta clusters (the rest must be empty).
            let n = before.slots.len();
            assert!(before.slots.iter().any(|m| m.active == 1 && m.seq == 2));
            assert_eq!(after.slots[..n], before.slots[..], "cluster size {cs}");
            assert!(after.slots[n..].iter().all(|m| *m == super::EMPTY_SLOT));
            let w = before.geo.bitmap_words();
            assert_eq!(
                after.bitmaps[..n * w],
                before.bitmaps[..],
                "cluster size {cs}"
            );
            assert!(after.bitmaps[n * w..].iter().all(|&b| b == 0));
            assert_eq!(after.live_counts, before.live_counts, "cluster size {cs}");
            assert_eq!(after.free, before.free, "cluster size {cs}");
            assert_eq!(after.snapshots.len(), 1, "cluster size {cs}");
            assert!(
                after.problems.is_empty(),
                "cluster size {cs}: {:?}",
                after.problems
            );
        }
    }
}
