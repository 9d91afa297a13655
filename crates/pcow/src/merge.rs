//! Commit (top into its base) and rebase (onto another base or none), also when the top file
//! has visible snapshots, with the copies batched: data in large writes, one flush per batch
//! before its entries (docs/pcow.md §6 "Commit", "Rebase").
//!
//! Snapshots of the top file read through the backing chain too. Before the backing bytes
//! that a snapshot reads change (commit writes into the base, rebase switches it), the
//! snapshot's old bytes are copied into the snapshot's own epoch. That never changes a visible
//! state: the copied unit holds exactly what every reader of that epoch already saw (readers
//! above it that hold the unit themselves are not affected, the others read the same old
//! backing bytes through it).

use std::collections::HashMap;

use crate::chain::{Chain, UnitSource};
use crate::error::{PcowError, Result};
use crate::format::{EntryKind, UNIT_SIZE};
use crate::image::{is_live, Image};

/// Bytes copied per batch (one data flush each).
const BATCH: usize = 32 << 20;

/// The top file's live entries: (epoch, logical) → slot.
pub(crate) type EpochIndex = HashMap<(u32, u64), u64>;

/// `new_bytes(chain, logical, unit, out)`: false when the unit is left alone, else its new
/// bytes are written into `out` (zero-filled on entry).
type NewBytes<'a> = dyn FnMut(&Chain, u64, u32, &mut [u8]) -> Result<bool> + 'a;

/// Units to write into one epoch: (logical, unit, 4 KiB of data).
type UnitWrites = Vec<(u64, u32, Vec<u8>)>;

fn contiguous(a: UnitSource, b: UnitSource) -> bool {
    match (a, b) {
        (UnitSource::Zero, UnitSource::Zero) => true,
        (
            UnitSource::File {
                image: i,
                file_offset: o,
            },
            UnitSource::File {
                image: j,
                file_offset: p,
            },
        ) => i == j && o + UNIT_SIZE == p,
        _ => false,
    }
}

impl Chain {
    /// Reads unit sources `srcs` (one per 4 KiB of `buf`; a short last unit is allowed) with
    /// one read per run of adjacent file units.
    pub(crate) fn read_sources(&self, srcs: &[UnitSource], buf: &mut [u8]) -> Result<()> {
        let u = UNIT_SIZE as usize;
        let mut i = 0;
        while i < srcs.len() && i * u < buf.len() {
            let mut j = i + 1;
            while j < srcs.len() && contiguous(srcs[j - 1], srcs[j]) {
                j += 1;
            }
            let range = i * u..(j * u).min(buf.len());
            match srcs[i] {
                UnitSource::Zero => buf[range].fill(0),
                UnitSource::File { image, file_offset } => self.images[image]
                    .storage()
                    .read_at(&mut buf[range], file_offset)?,
            }
            i = j;
        }
        Ok(())
    }

    /// The top file's live entries by (epoch, logical).
    pub(crate) fn epoch_index(&self) -> EpochIndex {
        let img = &self.images[0];
        (0..img.slot_count())
            .filter(|&s| is_live(img.slot(s).kind))
            .map(|s| ((img.slot(s).epoch, img.slot(s).logical), s))
            .collect()
    }

    /// Where unit `u` of `logical` reads from in the top file's `lineage` (newest first);
    /// `None` when no epoch of it holds the unit (it reads through the backing chain).
    pub(crate) fn resolve_in_lineage(
        &self,
        idx: &EpochIndex,
        lineage: &[u32],
        logical: u64,
        u: u32,
    ) -> Option<UnitSource> {
        let img = &self.images[0];
        for &epoch in lineage {
            let Some(&slot) = idx.get(&(epoch, logical)) else {
                continue;
            };
            match img.slot(slot).kind {
                EntryKind::Zero => return Some(UnitSource::Zero),
                EntryKind::Data if img.bitmap(slot)[(u / 64) as usize] & (1 << (u % 64)) != 0 => {
                    return Some(UnitSource::File {
                        image: 0,
                        file_offset: img.geometry().data_offset(slot) + u as u64 * UNIT_SIZE,
                    })
                }
                _ => {}
            }
        }
        None
    }

    /// Source of unit `u` of `logical` in the backing chain (below every top-file layer).
    pub(crate) fn resolve_backing(&self, logical: u64, u: u32) -> UnitSource {
        match self.layers.iter().rposition(|l| l.image != 0) {
            Some(l) => self.resolve_unit_below(logical, u, l),
            None => UnitSource::Zero,
        }
    }

    /// Writes whole units into epoch `epoch` of the top file (a frozen snapshot epoch or the
    /// writable one): data, flush, entry updates (new entries or bitmap |= units), flush.
    /// The units must not be valid there yet.
    pub(crate) fn write_units_into_epoch(
        &mut self,
        epoch: u32,
        idx: &mut EpochIndex,
        writes: &mut UnitWrites,
    ) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        writes.sort_by_key(|w| (w.0, w.1));
        let img = &mut self.images[0];
        let words = img.geometry().bitmap_words();
        let mut entries: Vec<(u64, u64, Vec<u64>)> = Vec::new();
        // Adjacent units of one slot are written together: (slot, first unit, bytes).
        let mut run: Option<(u64, u32, Vec<u8>)> = None;
        for (logical, u, data) in writes.iter() {
            if entries.last().is_none_or(|e| e.1 != *logical) {
                let (slot, bm) = match idx.get(&(epoch, *logical)) {
                    Some(&s) if img.slot(s).kind == EntryKind::Data => (s, img.bitmap(s).to_vec()),
                    Some(_) => {
                        return Err(img.inconsistent(format!(
                            "epoch {epoch} has a tombstone for cluster {logical}"
                        )))
                    }
                    None => (img.take_slot(false)?, vec![0u64; words]),
                };
                idx.insert((epoch, *logical), slot);
                entries.push((slot, *logical, bm));
            }
            let e = entries.last_mut().expect("pushed above");
            e.2[(*u / 64) as usize] |= 1 << (u % 64);
            let slot = e.0;
            match &mut run {
                Some((s, first, bytes))
                    if *s == slot
                        && *first as u64 + bytes.len() as u64 / UNIT_SIZE == *u as u64 =>
                {
                    bytes.extend_from_slice(data)
                }
                _ => {
                    if let Some((s, first, bytes)) = run.take() {
                        img.write_data(s, first as u64 * UNIT_SIZE, &bytes)?;
                    }
                    run = Some((slot, *u, data.clone()));
                }
            }
        }
        if let Some((s, first, bytes)) = run.take() {
            img.write_data(s, first as u64 * UNIT_SIZE, &bytes)?;
        }
        img.storage().flush()?;
        for (slot, logical, bm) in entries {
            img.write_entry(slot, EntryKind::Data, epoch, logical, &bm)?;
        }
        img.storage().flush()?;
        writes.clear();
        Ok(())
    }

    /// For every visible snapshot of the top file: the units it reads through the backing
    /// chain that `new_bytes` would change (`new_bytes(chain, logical, unit, out)` returns
    /// false when the unit is left alone, else writes the new bytes into `out`) are copied,
    /// with their old bytes, into the snapshot's epoch. Only clusters of `logicals` are looked at.
    fn preserve_snapshots(
        &mut self,
        idx: &mut EpochIndex,
        logicals: &[u64],
        new_bytes: &mut NewBytes<'_>,
    ) -> Result<()> {
        let views: Vec<(u32, Vec<u32>)> = self
            .snapshot_list()
            .iter()
            .map(|s| {
                let lin = self.images[0].lineage_from(s.record.epoch, s.record.parent)?;
                Ok((s.record.epoch, lin))
            })
            .collect::<Result<_>>()?;
        self.copy_changed_units(idx, logicals, &views, new_bytes)
    }

    /// For each (epoch, lineage) of `views`: units of `logicals` the lineage does not hold
    /// whose backing bytes differ from `new_bytes` get their backing bytes written into
    /// `epoch`, in batches.
    fn copy_changed_units(
        &mut self,
        idx: &mut EpochIndex,
        logicals: &[u64],
        views: &[(u32, Vec<u32>)],
        new_bytes: &mut NewBytes<'_>,
    ) -> Result<()> {
        let cs = self.cluster_size();
        let units = self.geometry().units();
        let size = self.virtual_size();
        let mut old = vec![0u8; cs as usize];
        let mut new = vec![0u8; UNIT_SIZE as usize];
        let mut srcs = Vec::with_capacity(units as usize);
        for (epoch, lineage) in views {
            let mut writes: UnitWrites = Vec::new();
            for &logical in logicals {
                let n = cs.min(size - logical * cs) as usize;
                let want: Vec<u32> = (0..units)
                    .take_while(|&u| (u as u64 * UNIT_SIZE) < n as u64)
                    .filter(|&u| self.resolve_in_lineage(idx, lineage, logical, u).is_none())
                    .collect();
                if want.is_empty() {
                    continue;
                }
                srcs.clear();
                srcs.extend((0..units).map(|u| self.resolve_backing(logical, u)));
                self.read_sources(&srcs, &mut old[..n])?;
                for u in want {
                    let a = u as usize * UNIT_SIZE as usize;
                    let b = (a + UNIT_SIZE as usize).min(n);
                    new[..b - a].fill(0);
                    if !new_bytes(self, logical, u, &mut new[..b - a])? {
                        continue;
                    }
                    if old[a..b] != new[..b - a] {
                        let mut unit = vec![0u8; UNIT_SIZE as usize];
                        unit[..b - a].copy_from_slice(&old[a..b]);
                        writes.push((logical, u, unit));
                    }
                }
                if writes.len() * UNIT_SIZE as usize >= BATCH {
                    self.write_units_into_epoch(*epoch, idx, &mut writes)?;
                }
            }
            self.write_units_into_epoch(*epoch, idx, &mut writes)?;
        }
        Ok(())
    }

    /// Copies the top file's current data into its base and empties the writable epoch
    /// (qemu-img commit). The chain must be opened with `writable_bases`. Visible snapshots of
    /// the top file are kept and keep their contents: units they read from the base that the
    /// commit changes are first copied into them. Crash-safe: the top keeps shadowing the base
    /// until the base copy is flushed, and the writable epoch is emptied only after that.
    pub fn commit(&mut self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        if self.images.len() < 2 {
            return Err(PcowError::InvalidParameter(
                "image has no backing file".into(),
            ));
        }
        if !self.images[1].is_writable() {
            return Err(PcowError::ReadOnly(self.images[1].path().to_path_buf()));
        }
        if !self.images[0].is_writable() {
            return Err(PcowError::ReadOnly(self.images[0].path().to_path_buf()));
        }
        let cs = self.cluster_size();
        let units = self.geometry().units();
        let mut idx = self.epoch_index();
        let current = self.images[0].lineage()?;
        let mut logicals: Vec<u64> = idx
            .keys()
            .filter(|(e, _)| current.contains(e))
            .map(|&(_, l)| l)
            .collect();
        logicals.sort_unstable();
        logicals.dedup();
        // Per cluster, per unit: where the current view reads it in the top file (None = it
        // reads through the base, so the commit leaves it alone).
        let plan: Vec<(u64, Vec<Option<UnitSource>>)> = logicals
            .iter()
            .map(|&l| {
                let v = (0..units)
                    .map(|u| self.resolve_in_lineage(&idx, &current, l, u))
                    .collect();
                (l, v)
            })
            .collect();
        // 1. Snapshots keep the base bytes the commit replaces.
        if !self.snapshot_list().is_empty() {
            let by_logical: HashMap<u64, &Vec<Option<UnitSource>>> =
                plan.iter().map(|(l, v)| (*l, v)).collect();
            self.preserve_snapshots(
                &mut idx,
                &logicals,
                &mut |c, logical, u, out| match by_logical.get(&logical).and_then(|v| v[u as usize])
                {
                    None => Ok(false),
                    Some(src) => c.read_unit_from(src, out, 0).map(|_| true),
                },
            )?;
        }
        // 2. The current view's units into the base, in batches.
        let base_images = self.images.split_off(1);
        let paths = self.paths.clone();
        let mut base = Chain::from_images(base_images, true)?;
        let result = (|| -> Result<()> {
            let bsize = base.virtual_size();
            let mut buf = vec![0u8; BATCH + cs as usize];
            let mut parts: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
            let mut used = 0usize;
            let total = plan.len() as u64;
            let mut srcs = Vec::with_capacity(units as usize);
            for (i, (logical, per_unit)) in plan.iter().enumerate() {
                let start = logical * cs;
                if start >= bsize {
                    continue;
                }
                let n = cs.min(bsize - start) as usize;
                srcs.clear();
                srcs.extend(per_unit.iter().map(|s| s.unwrap_or(UnitSource::Zero)));
                self.read_sources(&srcs, &mut buf[used..used + n])?;
                // Runs of units the top holds.
                let mut u = 0usize;
                while u < per_unit.len() && u * (UNIT_SIZE as usize) < n {
                    if per_unit[u].is_none() {
                        u += 1;
                        continue;
                    }
                    let mut v = u + 1;
                    while v < per_unit.len() && per_unit[v].is_some() {
                        v += 1;
                    }
                    let a = u * UNIT_SIZE as usize;
                    let b = (v * UNIT_SIZE as usize).min(n);
                    parts.push((start + a as u64, used + a..used + b));
                    u = v;
                }
                used += n;
                if used >= BATCH {
                    let v: Vec<(u64, &[u8])> =
                        parts.iter().map(|(o, r)| (*o, &buf[r.clone()])).collect();
                    base.write_vectored(&v)?;
                    parts.clear();
                    used = 0;
                }
                progress(i as u64 + 1, total);
            }
            let v: Vec<(u64, &[u8])> = parts.iter().map(|(o, r)| (*o, &buf[r.clone()])).collect();
            base.write_vectored(&v)?;
            base.flush()
        })();
        self.images.append(&mut base.images);
        self.paths = paths;
        result?;
        // 3. The base now holds the current data: detach the writable epoch from the top
        // file's history, then free its clusters and whatever no snapshot needs.
        let img = &mut self.images[0];
        if img.header().current_parent != 0 {
            let mut h = img.header().clone();
            h.current_parent = 0;
            img.write_header(h)?;
        }
        let cur = img.header().current_epoch;
        let mine: Vec<u64> = (0..img.slot_count())
            .filter(|&s| is_live(img.slot(s).kind) && img.slot(s).epoch == cur)
            .collect();
        img.free_slots(&mine)?;
        self.collect_garbage()?;
        self.images[0].storage().flush()?;
        self.rebuild()
    }

    /// Changes the backing file to `new_base` (None = no backing file). Unless `unsafe_mode`,
    /// every view of the top file (the writable one and each visible snapshot) first gets
    /// the units whose bytes would change copied into its own epoch, so no view changes; the
    /// header switch is the commit point.
    pub fn rebase(
        &mut self,
        new_base: Option<(&str, Chain)>,
        unsafe_mode: bool,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<()> {
        if !self.images[0].is_writable() {
            return Err(PcowError::ReadOnly(self.images[0].path().to_path_buf()));
        }
        if !unsafe_mode {
            let mut idx = self.epoch_index();
            // Only clusters some backing layer (old or new) holds can differ.
            let top_layers = self.layers.iter().filter(|l| l.image == 0).count();
            let first_top = self.layers.len() - top_layers;
            let mut logicals: Vec<u64> = self.layers[..first_top]
                .iter()
                .flat_map(|l| l.index.iter().map(|(k, _)| k))
                .collect();
            if let Some((_, nb)) = &new_base {
                let vc = self.virtual_clusters();
                logicals.extend(nb.merged.iter().map(|(k, _)| k).filter(|&k| k < vc));
            }
            logicals.sort_unstable();
            logicals.dedup();
            let mut views: Vec<(u32, Vec<u32>)> = Vec::new();
            for s in self.snapshot_list() {
                let lin = self.images[0].lineage_from(s.record.epoch, s.record.parent)?;
                views.push((s.record.epoch, lin));
            }
            let current = self.images[0].lineage()?;
            views.push((current[0], current));
            let nb = new_base.as_ref().map(|(_, c)| c);
            let mut nb_cluster: (u64, Vec<u8>) = (u64::MAX, Vec::new());
            let cs = self.cluster_size();
            let total = logicals.len() as u64;
            let mut done = 0u64;
            self.copy_changed_units(&mut idx, &logicals, &views, &mut |_, logical, u, out| {
                let Some(nb) = nb else {
                    return Ok(true); // no new base: zeros (`out` is zero-filled)
                };
                if nb_cluster.0 != logical {
                    // One read of the new chain per cluster.
                    let start = logical * cs;
                    let n = cs.min(nb.virtual_size().saturating_sub(start)) as usize;
                    nb_cluster.1.clear();
                    nb_cluster.1.resize(cs as usize, 0);
                    if n > 0 {
                        let srcs: Vec<UnitSource> = (0..nb.geometry().units())
                            .map(|u| nb.resolve_unit(logical, u))
                            .collect();
                        nb.read_sources(&srcs, &mut nb_cluster.1[..n])?;
                    }
                    nb_cluster.0 = logical;
                    done += 1;
                    progress(done.min(total), total);
                }
                let a = u as usize * UNIT_SIZE as usize;
                out.copy_from_slice(&nb_cluster.1[a..a + out.len()]);
                Ok(true)
            })?;
            self.flush()?;
        }
        let mut h = self.images[0].header().clone();
        let (name, id, mut new_images) = match new_base {
            Some((name, nb)) => (name.to_string(), nb.images[0].header().image_id, nb.images),
            None => (String::new(), [0u8; 16], Vec::new()),
        };
        h.backing_name = name;
        h.backing_id = id;
        self.images[0].write_header(h)?;
        self.images.truncate(1);
        self.paths.truncate(1);
        self.paths
            .extend(new_images.iter().map(|i| i.path().to_path_buf()));
        self.images.append(&mut new_images);
        self.rebuild()
    }
}

impl Image {
    /// Frees several slots with one flush: every `Free` entry, then the flush, then every
    /// punch (the order of [`Image::free_slot`], batched).
    pub(crate) fn free_slots(&mut self, slots: &[u64]) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let zero = vec![0u64; self.geo.bitmap_words()];
        for &slot in slots {
            self.write_entry(slot, EntryKind::Free, 0, 0, &zero)?;
        }
        self.storage.flush()?;
        let cs = self.geo.cluster_size();
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        // Consecutive slots of one segment have adjacent data clusters: one punch per run.
        let mut i = 0;
        while i < sorted.len() {
            let start = self.geo.data_offset(sorted[i]);
            let mut end = start + cs;
            let mut j = i + 1;
            while j < sorted.len() && self.geo.data_offset(sorted[j]) == end {
                end += cs;
                j += 1;
            }
            self.storage.punch_hole(start, end - start)?;
            i = j;
        }
        self.free.extend(sorted);
        Ok(())
    }
}
