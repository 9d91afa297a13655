//! Whole-image operations: create, snapshots (create/list/apply/delete), commit, rebase,
//! compact and garbage collection. Every step follows the write order of `docs/pcow.md`.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use crate::chain::{Chain, OpenOptions};
use crate::error::{PcowError, Result};
use crate::format::{
    EntryKind, Geometry, Header, SnapshotRecord, MAX_BACKING_NAME, MAX_SNAPSHOT_NAME,
    MAX_VIRTUAL_SIZE, SNAPSHOT_RECORD_SIZE,
};
use crate::image::{Image, SnapshotInfo, SNAPSHOT_HIDDEN};
use crate::storage::{FileStorage, Storage};

/// Parameters of a new image.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Virtual size in bytes.
    pub virtual_size: u64,
    /// Cluster size in bytes (power of two, 4 KiB..2 MiB).
    pub cluster_size: u64,
    /// Backing file name, relative to the new image's directory.
    pub backing: Option<String>,
}

fn random_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    // SAFETY: getrandom writes at most id.len() bytes into the valid buffer.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
    if n != id.len() as isize {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        id.copy_from_slice(&(t ^ ((std::process::id() as u128) << 64)).to_le_bytes());
    }
    id
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Builds the header of a new image; `backing_id` is the identity of the backing file.
pub fn new_header(opts: &CreateOptions, backing_id: [u8; 16]) -> Result<Header> {
    if !opts.cluster_size.is_power_of_two() {
        return Err(PcowError::InvalidParameter(format!(
            "cluster size {} is not a power of two",
            opts.cluster_size
        )));
    }
    let bits = opts.cluster_size.trailing_zeros();
    Geometry::new(bits)?;
    if opts.virtual_size == 0 || opts.virtual_size > MAX_VIRTUAL_SIZE {
        return Err(PcowError::InvalidParameter(format!(
            "virtual size {} must be between 1 byte and 1 PiB",
            opts.virtual_size
        )));
    }
    let name = opts.backing.clone().unwrap_or_default();
    if name.len() > MAX_BACKING_NAME {
        return Err(PcowError::InvalidParameter(
            "backing file name too long".into(),
        ));
    }
    Ok(Header {
        generation: 1,
        incompat_features: 0,
        compat_features: 0,
        cluster_bits: bits,
        virtual_size: opts.virtual_size,
        image_id: random_id(),
        current_epoch: 1,
        current_parent: 0,
        next_epoch: 2,
        backing_id,
        backing_name: name,
    })
}

/// Creates a new image file at `path` (the backing file, if any, must exist).
pub fn create_file(path: &Path, opts: &CreateOptions) -> Result<()> {
    let backing_id = match &opts.backing {
        Some(name) => {
            let dir = path.parent().unwrap_or(Path::new("."));
            let base = Chain::open(&dir.join(name), OpenOptions::default())?;
            base.images()[0].header().image_id
        }
        None => [0; 16],
    };
    let header = new_header(opts, backing_id)?;
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::create(path)?);
    Image::create(storage, header)?;
    Ok(())
}

impl Chain {
    /// Snapshots of the top file that are visible (not deleted), oldest first.
    pub fn snapshot_list(&self) -> Vec<SnapshotInfo> {
        self.images[0]
            .snapshots()
            .into_iter()
            .filter(|s| !s.hidden)
            .collect()
    }

    fn find_snapshot(&self, name: &str) -> Result<SnapshotInfo> {
        self.snapshot_list()
            .into_iter()
            .find(|s| s.record.name == name)
            .ok_or_else(|| PcowError::NoSuchSnapshot(name.to_string()))
    }

    /// Creates snapshot `name` of the current state: O(1) — record, entry, one flush, then
    /// the header switch to a new writable epoch, flushed.
    pub fn snapshot_create(&mut self, name: &str) -> Result<()> {
        if name.is_empty() || name.len() > MAX_SNAPSHOT_NAME {
            return Err(PcowError::InvalidParameter(format!(
                "snapshot name must be 1..={MAX_SNAPSHOT_NAME} bytes"
            )));
        }
        if self.snapshot_list().iter().any(|s| s.record.name == name) {
            return Err(PcowError::SnapshotExists(name.to_string()));
        }
        let img = &mut self.images[0];
        if !img.is_writable() {
            return Err(PcowError::ReadOnly(img.path().to_path_buf()));
        }
        let h = img.header().clone();
        if h.next_epoch == u32::MAX {
            return Err(img.inconsistent("epoch numbers exhausted".into()));
        }
        let record = SnapshotRecord {
            epoch: h.current_epoch,
            parent: h.current_parent,
            created_ns: now_ns(),
            virtual_size: h.virtual_size,
            name: name.to_string(),
        };
        let slot = img.take_slot(false)?;
        img.write_data(slot, 0, &record.encode())?;
        let zero = vec![0u64; img.geometry().bitmap_words()];
        img.write_entry(slot, EntryKind::Snapshot, h.current_epoch, 0, &zero)?;
        img.storage().flush()?;
        let mut nh = h.clone();
        nh.current_epoch = h.next_epoch;
        nh.current_parent = h.current_epoch;
        nh.next_epoch = h.next_epoch + 1;
        img.write_header(nh)?;
        img.snapshots.insert(
            record.epoch,
            SnapshotInfo {
                slot,
                hidden: false,
                record,
            },
        );
        // O(1) map update: a new, empty writable layer on top.
        let epoch = img.header().current_epoch;
        self.layers.push(crate::chain::Layer {
            image: 0,
            epoch,
            index: crate::map::ClusterMap::Sparse(Default::default()),
        });
        Ok(())
    }

    /// Reverts the writable state to snapshot `name` (the snapshot is kept). The header
    /// switch is the commit point; the old writable epoch's clusters are freed after it.
    pub fn snapshot_apply(&mut self, name: &str) -> Result<()> {
        let snap = self.find_snapshot(name)?;
        let img = &mut self.images[0];
        if !img.is_writable() {
            return Err(PcowError::ReadOnly(img.path().to_path_buf()));
        }
        let h = img.header().clone();
        let mut nh = h.clone();
        nh.current_epoch = h.next_epoch;
        nh.current_parent = snap.record.epoch;
        nh.next_epoch = h.next_epoch + 1;
        img.write_header(nh)?;
        self.collect_garbage()?;
        self.rebuild()
    }

    /// Deletes snapshot `name`. Its clusters still needed by later states are kept: a
    /// deleted snapshot with exactly one child (the writable epoch or another snapshot,
    /// visible or deleted) is merged into that child; the rest are freed.
    pub fn snapshot_delete(&mut self, name: &str) -> Result<()> {
        let snap = self.find_snapshot(name)?;
        let img = &mut self.images[0];
        if !img.is_writable() {
            return Err(PcowError::ReadOnly(img.path().to_path_buf()));
        }
        let s_epoch = snap.record.epoch;
        let zero = vec![0u64; img.geometry().bitmap_words()];
        // 1. Hide it (one entry rewrite = the commit point of the deletion), flushed.
        img.write_entry(
            snap.slot,
            EntryKind::Snapshot,
            s_epoch,
            SNAPSHOT_HIDDEN,
            &zero,
        )?;
        img.storage().flush()?;
        if let Some(s) = img.snapshots.get_mut(&s_epoch) {
            s.hidden = true;
        }
        // 2. Every deleted snapshot with a single child is merged into it.
        self.merge_hidden()?;
        self.collect_garbage()?;
        self.rebuild()
    }

    /// Merges deleted (hidden) snapshots that have exactly one child into that child, until
    /// none is left. Every step preserves every visible state.
    fn merge_hidden(&mut self) -> Result<()> {
        loop {
            let img = &self.images[0];
            let (cur, cur_parent) = (img.header().current_epoch, img.header().current_parent);
            let found = img.snapshots.values().filter(|s| s.hidden).find_map(|s| {
                let e = s.record.epoch;
                let children: Vec<u32> = img
                    .snapshots
                    .values()
                    .filter(|c| c.record.parent == e)
                    .map(|c| c.record.epoch)
                    .chain((cur_parent == e).then_some(cur))
                    .collect();
                (children.len() == 1).then(|| (s.clone(), children[0]))
            });
            let Some((snap, child)) = found else {
                return Ok(());
            };
            self.merge_epoch_into(snap.record.epoch, child)?;
            let img = &mut self.images[0];
            img.storage().flush()?;
            if child == cur {
                let mut nh = img.header().clone();
                nh.current_parent = snap.record.parent;
                img.write_header(nh)?;
            } else {
                self.relink(child, snap.record.parent)?;
            }
            let img = &mut self.images[0];
            img.free_slot(snap.slot)?;
            img.snapshots.remove(&snap.record.epoch);
            img.storage().flush()?;
        }
    }

    /// Points snapshot `epoch`'s record at parent `parent` (the grandparent, once the parent
    /// is merged into it): the new record goes to a fresh slot (data, flush, entry, flush),
    /// then the old record's slot is freed. A crash in between leaves two records for the
    /// epoch that differ only in the parent, both valid (the old parent is empty and still
    /// recorded); the one in the lower slot is used and the other is a leak (docs/pcow.md §5).
    fn relink(&mut self, epoch: u32, parent: u32) -> Result<()> {
        let img = &mut self.images[0];
        let Some(old) = img.snapshots.get(&epoch).cloned() else {
            return Err(img.inconsistent(format!("no snapshot record for epoch {epoch}")));
        };
        let mut record = old.record.clone();
        record.parent = parent;
        let slot = img.take_slot(false)?;
        img.write_data(slot, 0, &record.encode())?;
        img.storage().flush()?;
        let zero = vec![0u64; img.geometry().bitmap_words()];
        let flags = if old.hidden { SNAPSHOT_HIDDEN } else { 0 };
        img.write_entry(slot, EntryKind::Snapshot, epoch, flags, &zero)?;
        img.storage().flush()?;
        img.free_slot(old.slot)?;
        img.snapshots.insert(
            epoch,
            SnapshotInfo {
                slot,
                hidden: old.hidden,
                record,
            },
        );
        Ok(())
    }

    /// Moves the clusters of epoch `from` (a deleted snapshot) into its only child `to`:
    /// an entry `to` lacks is relabelled; otherwise the units `to` still reads from `from`
    /// are copied into `to`'s cluster (data, flush, entry, flush) and `from`'s slot is freed.
    fn merge_epoch_into(&mut self, from: u32, to: u32) -> Result<()> {
        let img = &mut self.images[0];
        let to_has: HashMap<u64, u64> = (0..img.slot_count())
            .filter(|&s| {
                let m = img.slot(s);
                m.epoch == to && matches!(m.kind, EntryKind::Data | EntryKind::Zero)
            })
            .map(|s| (img.slot(s).logical, s))
            .collect();
        let geo = img.geometry();
        let mut unit = vec![0u8; crate::format::UNIT_SIZE as usize];
        for slot in 0..img.slot_count() {
            let m = img.slot(slot);
            if m.epoch != from || !matches!(m.kind, EntryKind::Data | EntryKind::Zero) {
                continue;
            }
            match to_has.get(&m.logical) {
                None => {
                    // Move it: relabel the entry into the child epoch.
                    let bm = img.bitmap(slot).to_vec();
                    img.write_entry(slot, m.kind, to, m.logical, &bm)?;
                }
                Some(&cs) => {
                    // Units the child's cluster still reads from `from` are copied up first
                    // (data, flush, bitmap), then the slot is freed.
                    let cm = img.slot(cs);
                    if cm.kind == EntryKind::Data && m.kind == EntryKind::Data {
                        let mut cbm = img.bitmap(cs).to_vec();
                        let sbm = img.bitmap(slot).to_vec();
                        let mut copied = false;
                        for u in 0..geo.units() {
                            let (w, b) = ((u / 64) as usize, 1u64 << (u % 64));
                            if cbm[w] & b == 0 && sbm[w] & b != 0 {
                                let off = u as u64 * crate::format::UNIT_SIZE;
                                img.read_data(slot, off, &mut unit)?;
                                img.write_data(cs, off, &unit)?;
                                cbm[w] |= b;
                                copied = true;
                            }
                        }
                        if copied {
                            img.storage().flush()?;
                            img.write_entry(cs, EntryKind::Data, to, cm.logical, &cbm)?;
                            img.storage().flush()?;
                        }
                    } else if cm.kind == EntryKind::Data && m.kind == EntryKind::Zero {
                        // Units not held by the child's cluster read zeros via the
                        // tombstone: they are zero-filled and marked valid.
                        let mut cbm = img.bitmap(cs).to_vec();
                        let zero_unit = vec![0u8; crate::format::UNIT_SIZE as usize];
                        for u in 0..geo.units() {
                            let (w, b) = ((u / 64) as usize, 1u64 << (u % 64));
                            if cbm[w] & b == 0 {
                                img.write_data(
                                    cs,
                                    u as u64 * crate::format::UNIT_SIZE,
                                    &zero_unit,
                                )?;
                                cbm[w] |= b;
                            }
                        }
                        img.storage().flush()?;
                        img.write_entry(cs, EntryKind::Data, to, cm.logical, &cbm)?;
                        img.storage().flush()?;
                    }
                    img.free_slot(slot)?;
                }
            }
        }
        Ok(())
    }

    /// Epochs of the top file still reachable from the writable epoch or a visible snapshot.
    pub(crate) fn live_epochs(&self) -> Result<HashSet<u32>> {
        let img = &self.images[0];
        let mut live: HashSet<u32> = img.lineage()?.into_iter().collect();
        for s in img.snapshots.values().filter(|s| !s.hidden) {
            for e in img.lineage_from(s.record.epoch, s.record.parent)? {
                live.insert(e);
            }
        }
        Ok(live)
    }

    /// Frees every cluster and snapshot record of the top file whose epoch is unreachable.
    /// Returns the number of slots freed.
    pub fn collect_garbage(&mut self) -> Result<u64> {
        let live = self.live_epochs()?;
        let img = &mut self.images[0];
        let cur = img.header().current_epoch;
        let mut dead = Vec::new();
        for slot in 0..img.slot_count() {
            let m = img.slot(slot);
            let is_dead = match m.kind {
                EntryKind::Free => false,
                EntryKind::Snapshot => m.epoch == cur || !live.contains(&m.epoch),
                _ => !live.contains(&m.epoch),
            };
            if is_dead {
                dead.push(slot);
                if m.kind == EntryKind::Snapshot {
                    img.snapshots.remove(&m.epoch);
                }
            }
        }
        // Every dead entry freed, one flush, then the punches.
        img.free_slots(&dead)?;
        if !dead.is_empty() {
            img.storage().flush()?;
        }
        Ok(dead.len() as u64)
    }

    /// Moves clusters of the top file into free slots near the start and truncates the file.
    /// Each move: copy data, flush, write the new entry, flush, then free the old slot.
    /// Returns the number of bytes the file shrank by.
    pub fn compact(&mut self, mut progress: impl FnMut(u64, u64)) -> Result<u64> {
        self.collect_garbage()?;
        let img = &mut self.images[0];
        if !img.is_writable() {
            return Err(PcowError::ReadOnly(img.path().to_path_buf()));
        }
        let geo = img.geometry();
        let before = img.storage().len()?;
        let mut buf = vec![0u8; geo.cluster_size() as usize];
        let used: Vec<u64> = (0..img.slot_count())
            .filter(|&s| img.slot(s).kind != EntryKind::Free && !img.bad_slots.contains(&s))
            .collect();
        let total = used.len() as u64;
        for (done, &src) in used.iter().rev().enumerate() {
            let Some(&dst) = img.free.first() else { break };
            if dst >= src {
                break;
            }
            img.free.remove(&dst);
            let m = img.slot(src);
            let bm = img.bitmap(src).to_vec();
            if m.kind == EntryKind::Snapshot {
                img.read_data(src, 0, &mut buf[..SNAPSHOT_RECORD_SIZE])?;
                img.write_data(dst, 0, &buf[..SNAPSHOT_RECORD_SIZE])?;
            } else if m.kind == EntryKind::Data {
                img.read_data(src, 0, &mut buf)?;
                img.write_data(dst, 0, &buf)?;
            } else {
                img.storage()
                    .punch_hole(geo.data_offset(dst), geo.cluster_size())?;
            }
            img.storage().flush()?;
            img.write_entry(dst, m.kind, m.epoch, m.logical, &bm)?;
            img.storage().flush()?;
            img.free_slot(src)?;
            if let Some(s) = img.snapshots.get_mut(&m.epoch) {
                if s.slot == src {
                    s.slot = dst;
                }
            }
            progress(done as u64 + 1, total);
        }
        img.storage().flush()?;
        // Truncate after the last used slot.
        let last_used = (0..img.slot_count())
            .rev()
            .find(|&s| img.slot(s).kind != EntryKind::Free || img.bad_slots.contains(&s));
        let new_len = match last_used {
            Some(s) => geo.data_offset(s) + geo.cluster_size(),
            None => geo.cluster_size(),
        };
        if new_len < before {
            img.storage().set_len(new_len)?;
            img.storage().flush()?;
        }
        let storage = img.storage().clone();
        let writable = img.is_writable();
        self.images[0] = Image::open(storage, writable)?;
        self.rebuild()?;
        Ok(before.saturating_sub(new_len))
    }
}
