//! A chain of pcow files (top + bases) seen as one logical disk: the merged O(1) map,
//! byte-granular read/write/discard, and the allocation API used by the mapping service.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{PcowError, Result};
use crate::format::{EntryKind, Geometry, UNIT_SIZE};
use crate::image::{is_live, Image};
use crate::map::ClusterMap;
use crate::storage::{FileStorage, Storage};

/// Makes the storage of one chain file: `(path, writable)`.
pub type Opener<'a> = dyn Fn(&Path, bool) -> Result<Arc<dyn Storage>> + 'a;

/// Maximum depth of a backing chain.
pub const MAX_CHAIN_DEPTH: usize = 64;

/// One layer: an epoch of one file. Layers are ordered bottom (oldest base) first.
pub(crate) struct Layer {
    pub(crate) image: usize,
    pub(crate) epoch: u32,
    pub(crate) index: ClusterMap,
}

/// How to initialise a cluster allocated through [`Chain::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocInit {
    /// The cluster reads as zeros and every unit is valid (thin-provisioning expansion).
    Zeroed,
    /// No unit is valid: every unit still reads from the layers below until marked valid
    /// (copy-on-write; copy units in, then [`Chain::mark_valid`]).
    Empty,
}

/// Where a logical cluster lives (its topmost holder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterLocation {
    /// Layer number (0 = bottom-most; the writable layer is the highest).
    pub layer: usize,
    /// Index of the file in the chain (0 = top file).
    pub image: usize,
    /// True if this is the writable layer (current epoch of the top file).
    pub writable: bool,
    /// Physical slot in that file.
    pub slot: u64,
    /// File offset of the data cluster.
    pub file_offset: u64,
    /// `Data` or `Zero` (a tombstone: the whole cluster reads as zeros).
    pub kind: EntryKind,
    /// Validity bitmap: bit u set = 4 KiB unit u is held here (up to 512 units).
    pub bitmap: [u64; 8],
}

impl ClusterLocation {
    /// True if every unit is valid in this layer.
    pub fn is_full(&self, units: u32) -> bool {
        (0..units).all(|u| self.bitmap[(u / 64) as usize] & (1 << (u % 64)) != 0)
    }
    /// True if unit `u` is valid in this layer.
    pub fn unit_valid(&self, u: u32) -> bool {
        self.bitmap[(u / 64) as usize] & (1 << (u % 64)) != 0
    }
}

/// Where one 4 KiB unit's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitSource {
    /// Reads as zeros (unallocated everywhere, or a tombstone).
    Zero,
    /// Bytes at `file_offset` of chain file `image`.
    File {
        /// Chain file index (0 = top).
        image: usize,
        /// Byte offset of the unit in that file.
        file_offset: u64,
    },
}

/// Result of [`Chain::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Physical slot in the top file.
    pub slot: u64,
    /// File offset of the data cluster in the top file.
    pub file_offset: u64,
    /// False if the cluster was already allocated in the writable layer (nothing was done).
    pub newly_allocated: bool,
}

/// A file of the chain, for mapping its data clusters.
#[derive(Clone, Debug)]
pub struct LayerFile {
    /// Path of the file.
    pub path: PathBuf,
    /// Open descriptor (only for real files).
    pub fd: Option<std::os::unix::io::RawFd>,
    /// True for the top (writable) file of a writable chain.
    pub writable: bool,
}

/// Options for [`Chain::open`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Open the top file writable.
    pub writable: bool,
    /// Open the base files writable too (needed by `commit`).
    pub writable_bases: bool,
    /// Open even if the metadata has corruption problems (for `check`).
    pub allow_corrupt: bool,
}

/// An open chain: `images[0]` is the top file, `images[i+1]` the base of `images[i]`.
pub struct Chain {
    pub(crate) images: Vec<Image>,
    pub(crate) layers: Vec<Layer>,
    /// logical → (layer << 40 | slot) of the topmost holder.
    pub(crate) merged: ClusterMap,
    pub(crate) paths: Vec<PathBuf>,
    /// Tolerate broken snapshot ancestry (for check/repair).
    pub(crate) tolerant: bool,
}

const SLOT_BITS: u64 = 40;

/// Remembers the last epoch → layer lookup (entries of one epoch are usually together).
#[derive(Default)]
struct EpochCache {
    last: Option<(u32, Option<usize>)>,
}

impl EpochCache {
    #[inline]
    fn get(&mut self, map: &HashMap<u32, usize>, epoch: u32) -> Option<usize> {
        match self.last {
            Some((e, l)) if e == epoch => l,
            _ => {
                let l = map.get(&epoch).copied();
                self.last = Some((epoch, l));
                l
            }
        }
    }
}

pub(crate) fn pack(layer: usize, slot: u64) -> u64 {
    ((layer as u64) << SLOT_BITS) | slot
}
pub(crate) fn unpack(v: u64) -> (usize, u64) {
    ((v >> SLOT_BITS) as usize, v & ((1 << SLOT_BITS) - 1))
}

impl Chain {
    /// Opens the image at `path` and its backing chain (backing names are relative to the
    /// directory of the image that names them).
    pub fn open(path: &Path, opts: OpenOptions) -> Result<Chain> {
        Self::open_with(path, opts, &|p, writable| {
            Ok(Arc::new(FileStorage::open(p, writable)?) as Arc<dyn Storage>)
        })
    }

    /// Like [`Chain::open`], with each file's storage made by `opener(path, writable)`
    /// (e.g. [`crate::dax::open_mapped`] for the mapped / DAX flush path).
    pub fn open_with(path: &Path, opts: OpenOptions, opener: &Opener<'_>) -> Result<Chain> {
        let mut images = Vec::new();
        let mut paths = Vec::new();
        let mut current = path.to_path_buf();
        loop {
            if images.len() >= MAX_CHAIN_DEPTH {
                return Err(PcowError::Backing {
                    path: path.to_path_buf(),
                    reason: format!("chain deeper than {MAX_CHAIN_DEPTH} (a loop?)"),
                });
            }
            let writable = if images.is_empty() {
                opts.writable
            } else {
                opts.writable_bases
            };
            let storage: Arc<dyn Storage> = opener(&current, writable)?;
            let img = Image::open(storage, writable)?;
            let backing = img.header().backing_name.clone();
            let dir = current.parent().map(Path::to_path_buf).unwrap_or_default();
            paths.push(current.clone());
            images.push(img);
            if backing.is_empty() {
                break;
            }
            current = dir.join(backing);
        }
        let mut chain = Chain::from_images(images, opts.allow_corrupt)?;
        chain.paths = paths;
        Ok(chain)
    }

    /// Builds a chain from already-open files (top first), checking identities and building
    /// the map. Used by tests and tools with in-memory storage.
    pub fn from_images(images: Vec<Image>, allow_corrupt: bool) -> Result<Chain> {
        if images.is_empty() {
            return Err(PcowError::InvalidParameter("empty chain".into()));
        }
        for w in images.windows(2) {
            let (upper, lower) = (&w[0], &w[1]);
            if upper.header().backing_id != lower.header().image_id {
                return Err(PcowError::Backing {
                    path: upper.path().to_path_buf(),
                    reason: format!(
                        "backing file {} has a different identity than recorded (replaced or \
                         modified?); use `densevm image rebase -u` if this is intended",
                        lower.path().display()
                    ),
                });
            }
        }
        if !allow_corrupt {
            for img in &images {
                if let Some(p) = img.problems.iter().find(|p| p.corruption) {
                    return Err(img.inconsistent(p.what.clone()));
                }
            }
        }
        let paths = images.iter().map(|i| i.path().to_path_buf()).collect();
        let mut chain = Chain {
            images,
            layers: Vec::new(),
            merged: ClusterMap::Sparse(HashMap::new()),
            paths,
            tolerant: allow_corrupt,
        };
        chain.rebuild()?;
        Ok(chain)
    }

    /// Rebuilds layers and the merged map from the files' entry tables.
    pub(crate) fn rebuild(&mut self) -> Result<()> {
        let vclusters = self.virtual_clusters();
        let mut layers: Vec<Layer> = Vec::new();
        // Per image: epoch → layer number.
        let mut epoch_layer: Vec<HashMap<u32, usize>> = vec![HashMap::new(); self.images.len()];
        for (i, img) in self.images.iter().enumerate().rev() {
            let lineage = match img.lineage() {
                Ok(l) => l,
                Err(_) if self.tolerant => vec![img.header().current_epoch],
                Err(e) => return Err(e),
            };
            for &epoch in lineage.iter().rev() {
                epoch_layer[i].insert(epoch, layers.len());
                layers.push(Layer {
                    image: i,
                    epoch,
                    index: ClusterMap::Sparse(HashMap::new()),
                });
            }
        }
        // Map sizes from the per-epoch entry counts kept by each image (no counting pass).
        let mut counts = vec![0u64; layers.len()];
        for (i, img) in self.images.iter().enumerate() {
            for (epoch, &n) in &img.live_counts {
                if let Some(&l) = epoch_layer[i].get(epoch) {
                    counts[l] += n;
                }
            }
        }
        for (l, layer) in layers.iter_mut().enumerate() {
            layer.index = ClusterMap::with_expected_narrow(vclusters, counts[l]);
        }
        let mut merged = ClusterMap::with_expected(vclusters, counts.iter().sum());
        for (i, img) in self.images.iter().enumerate() {
            let mut cache = EpochCache::default();
            for (slot, m) in img.slots.iter().enumerate() {
                if !is_live(m.kind) || m.logical >= vclusters {
                    continue;
                }
                let Some(l) = cache.get(&epoch_layer[i], m.epoch) else {
                    continue;
                };
                // A duplicate (interrupted compaction) keeps the lower slot.
                if layers[l]
                    .index
                    .insert_unless(m.logical, slot as u64, |_| true)
                {
                    merged.insert_unless(m.logical, pack(l, slot as u64), |v| unpack(v).0 > l);
                }
            }
        }
        self.layers = layers;
        self.merged = merged;
        Ok(())
    }

    /// Virtual size in bytes (that of the top file).
    pub fn virtual_size(&self) -> u64 {
        self.images[0].header().virtual_size
    }
    /// Number of logical clusters.
    pub fn virtual_clusters(&self) -> u64 {
        self.images[0].virtual_clusters()
    }
    /// Cluster geometry of the top file.
    pub fn geometry(&self) -> Geometry {
        self.images[0].geometry()
    }
    /// Cluster size of the top file in bytes.
    pub fn cluster_size(&self) -> u64 {
        self.geometry().cluster_size()
    }
    /// The files of the chain, top first.
    pub fn images(&self) -> &[Image] {
        &self.images
    }
    /// Number of layers (epochs of all files in the current lineages).
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }
    /// (file index, epoch) of layer `layer`.
    pub fn layer_info(&self, layer: usize) -> Option<(usize, u32)> {
        self.layers.get(layer).map(|l| (l.image, l.epoch))
    }
    /// Files to map, top first.
    pub fn layer_files(&self) -> Vec<LayerFile> {
        self.images
            .iter()
            .enumerate()
            .map(|(i, img)| LayerFile {
                path: img.path().to_path_buf(),
                fd: img.storage().raw_fd(),
                writable: i == 0 && img.is_writable(),
            })
            .collect()
    }

    pub(crate) fn top_layer(&self) -> usize {
        self.layers.len() - 1
    }

    fn location(&self, layer: usize, slot: u64) -> ClusterLocation {
        let l = &self.layers[layer];
        let img = &self.images[l.image];
        let m = img.slot(slot);
        let mut bitmap = [0u64; 8];
        let words = img.bitmap(slot);
        bitmap[..words.len()].copy_from_slice(words);
        ClusterLocation {
            layer,
            image: l.image,
            writable: layer == self.top_layer() && img.is_writable(),
            slot,
            file_offset: img.geometry().data_offset(slot),
            kind: m.kind,
            bitmap,
        }
    }

    /// The topmost holder of logical cluster `logical` (O(1)), or `None` if no layer has it.
    pub fn lookup(&self, logical: u64) -> Option<ClusterLocation> {
        let (layer, slot) = unpack(self.merged.get(logical)?);
        Some(self.location(layer, slot))
    }

    /// The holder of `logical` in layer `layer` only.
    pub fn lookup_in_layer(&self, layer: usize, logical: u64) -> Option<ClusterLocation> {
        let slot = self.layers.get(layer)?.index.get(logical)?;
        Some(self.location(layer, slot))
    }

    /// Where unit `unit` of `logical` is read from, searching layers `..=from_layer` downwards.
    pub fn resolve_unit_below(&self, logical: u64, unit: u32, from_layer: usize) -> UnitSource {
        let cs = self.cluster_size();
        for l in (0..=from_layer.min(self.layers.len() - 1)).rev() {
            let layer = &self.layers[l];
            let Some(slot) = layer.index.get(logical) else {
                continue;
            };
            let img = &self.images[layer.image];
            match img.slot(slot).kind {
                EntryKind::Zero => return UnitSource::Zero,
                EntryKind::Data => {
                    let geo = img.geometry();
                    // Files of the chain may have different cluster sizes only if equal to ours.
                    if geo.cluster_size() != cs {
                        return UnitSource::Zero;
                    }
                    let bm = img.bitmap(slot);
                    if bm[(unit / 64) as usize] & (1 << (unit % 64)) != 0 {
                        return UnitSource::File {
                            image: layer.image,
                            file_offset: geo.data_offset(slot) + unit as u64 * UNIT_SIZE,
                        };
                    }
                }
                _ => {}
            }
        }
        UnitSource::Zero
    }

    /// Where unit `unit` of `logical` is read from (through every layer).
    pub fn resolve_unit(&self, logical: u64, unit: u32) -> UnitSource {
        match self.merged.get(logical) {
            None => UnitSource::Zero,
            Some(v) => self.resolve_unit_below(logical, unit, unpack(v).0),
        }
    }

    pub(crate) fn read_unit_from(
        &self,
        src: UnitSource,
        buf: &mut [u8],
        within: u64,
    ) -> Result<()> {
        match src {
            UnitSource::Zero => {
                buf.fill(0);
                Ok(())
            }
            UnitSource::File { image, file_offset } => self.images[image]
                .storage()
                .read_at(buf, file_offset + within),
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.virtual_size();
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(PcowError::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    /// Reads guest bytes at `offset`. Never allocates.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let cs = self.cluster_size();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let logical = at / cs;
            let unit = ((at % cs) / UNIT_SIZE) as u32;
            let within = at % UNIT_SIZE;
            let n = ((UNIT_SIZE - within) as usize).min(buf.len() - done);
            let src = self.resolve_unit(logical, unit);
            self.read_unit_from(src, &mut buf[done..done + n], within)?;
            done += n;
        }
        Ok(())
    }

    fn top_mut(&mut self) -> Result<&mut Image> {
        let img = &mut self.images[0];
        if !img.is_writable() {
            return Err(PcowError::ReadOnly(img.path().to_path_buf()));
        }
        Ok(img)
    }

    /// Writes guest bytes at `offset`: data first, one flush, then the entries (not flushed;
    /// call [`Chain::flush`] to make the write durable).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_vectored(&[(offset, data)])
    }

    /// Writes several ranges with a single data flush before their entry updates (used by
    /// bulk copies such as `convert`). Same ordering as [`Chain::write`].
    pub fn write_vectored(&mut self, parts: &[(u64, &[u8])]) -> Result<()> {
        for (offset, data) in parts {
            self.check_range(*offset, data.len() as u64)?;
        }
        self.top_mut()?;
        let cs = self.cluster_size();
        let top = self.top_layer();
        let words = self.geometry().bitmap_words();
        let full = self.geometry().full_bitmap();
        // (slot, logical, new bitmap, newly allocated)
        let mut pending: Vec<(u64, u64, Vec<u64>, bool)> = Vec::new();
        let mut pending_idx: HashMap<u64, usize> = HashMap::new();
        let mut unit_buf = vec![0u8; UNIT_SIZE as usize];
        for &(offset, data) in parts {
            let mut done = 0usize;
            while done < data.len() {
                let at = offset + done as u64;
                let logical = at / cs;
                let n = ((cs - at % cs) as usize).min(data.len() - done);
                let piece = &data[done..done + n];
                let in_cluster = at % cs;
                let pend = pending_idx.get(&logical).copied();
                let (slot, mut bitmap, newly) = match self.layers[top].index.get(logical) {
                    Some(slot) if pend.is_some() => {
                        let p = &pending[pend.unwrap_or(0)];
                        (slot, p.2.clone(), p.3)
                    }
                    Some(slot) => {
                        let img = &self.images[0];
                        match img.slot(slot).kind {
                            // A tombstone's data cluster was punched: it is all zeros and valid.
                            EntryKind::Zero => (slot, full.clone(), false),
                            _ => (slot, img.bitmap(slot).to_vec(), false),
                        }
                    }
                    None => (self.images[0].take_slot(false)?, vec![0u64; words], true),
                };
                let was_zero_kind =
                    pend.is_none() && !newly && self.images[0].slot(slot).kind == EntryKind::Zero;
                let first = (in_cluster / UNIT_SIZE) as u32;
                let last = ((in_cluster + n as u64 - 1) / UNIT_SIZE) as u32;
                // Units written directly are coalesced into one write per contiguous span.
                let mut span: Option<(u64, u64)> = None;
                for u in first..=last {
                    let ustart = u as u64 * UNIT_SIZE;
                    let lo = in_cluster.max(ustart);
                    let hi = (in_cluster + n as u64).min(ustart + UNIT_SIZE);
                    let src = &piece[(lo - in_cluster) as usize..(hi - in_cluster) as usize];
                    let valid = bitmap[(u / 64) as usize] & (1 << (u % 64)) != 0;
                    if valid || (lo == ustart && hi == ustart + UNIT_SIZE) {
                        span = Some((span.map_or(lo, |s| s.0), hi));
                    } else {
                        if let Some((a, b)) = span.take() {
                            let bytes =
                                &piece[(a - in_cluster) as usize..(b - in_cluster) as usize];
                            self.images[0].write_data(slot, a, bytes)?;
                        }
                        // Partial write of a unit held below: copy the unit up, then merge.
                        let below = if top == 0 {
                            UnitSource::Zero
                        } else {
                            self.resolve_unit_below(logical, u, top - 1)
                        };
                        self.read_unit_from(below, &mut unit_buf, 0)?;
                        unit_buf[(lo - ustart) as usize..(hi - ustart) as usize]
                            .copy_from_slice(src);
                        self.images[0].write_data(slot, ustart, &unit_buf)?;
                    }
                    bitmap[(u / 64) as usize] |= 1 << (u % 64);
                }
                if let Some((a, b)) = span {
                    let bytes = &piece[(a - in_cluster) as usize..(b - in_cluster) as usize];
                    self.images[0].write_data(slot, a, bytes)?;
                }
                let changed =
                    newly || was_zero_kind || bitmap.as_slice() != self.images[0].bitmap(slot);
                if let Some(i) = pend {
                    pending[i].2 = bitmap;
                } else if changed {
                    pending_idx.insert(logical, pending.len());
                    pending.push((slot, logical, bitmap, newly));
                    if newly {
                        // Reserve it in the map now so a later piece of this write finds it.
                        self.layers[top].index.insert(logical, slot);
                    }
                }
                done += n;
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        // The data must be durable before any entry makes it valid.
        self.images[0].storage().flush()?;
        let epoch = self.images[0].header().current_epoch;
        for (slot, logical, bitmap, _) in pending {
            self.images[0].write_entry(slot, EntryKind::Data, epoch, logical, &bitmap)?;
            self.merged.insert(logical, pack(top, slot));
        }
        Ok(())
    }

    /// Discards `[offset, offset+len)`: whole clusters are freed (or become tombstones when a
    /// lower layer holds them), partial clusters are zeroed. Not flushed.
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        self.top_mut()?;
        let cs = self.cluster_size();
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let logical = at / cs;
            let cend = ((logical + 1) * cs).min(end);
            if at % cs == 0 && cend - at == cs.min(self.virtual_size() - at) {
                self.discard_cluster(logical)?;
            } else {
                let zeros = vec![0u8; (cend - at) as usize];
                self.write(at, &zeros)?;
            }
            at = cend;
        }
        Ok(())
    }

    fn lower_holds(&self, logical: u64) -> bool {
        let top = self.top_layer();
        (0..top).any(|l| self.layers[l].index.get(logical).is_some())
    }

    fn discard_cluster(&mut self, logical: u64) -> Result<()> {
        let top = self.top_layer();
        let lower = self.lower_holds(logical);
        let epoch = self.images[0].header().current_epoch;
        let zero = vec![0u64; self.geometry().bitmap_words()];
        match self.layers[top].index.get(logical) {
            Some(slot) => {
                if lower {
                    if self.images[0].slot(slot).kind == EntryKind::Zero {
                        return Ok(());
                    }
                    let geo = self.geometry();
                    let img = &mut self.images[0];
                    img.storage()
                        .punch_hole(geo.data_offset(slot), geo.cluster_size())?;
                    img.storage().flush()?;
                    img.write_entry(slot, EntryKind::Zero, epoch, logical, &zero)?;
                } else {
                    self.images[0].free_slot(slot)?;
                    self.layers[top].index.remove(logical);
                    self.merged.remove(logical);
                }
            }
            None if lower => {
                let img = &mut self.images[0];
                let slot = img.take_slot(false)?;
                let geo = img.geometry();
                img.storage()
                    .punch_hole(geo.data_offset(slot), geo.cluster_size())?;
                img.storage().flush()?;
                img.write_entry(slot, EntryKind::Zero, epoch, logical, &zero)?;
                self.layers[top].index.insert(logical, slot);
                self.merged.insert(logical, pack(top, slot));
            }
            None => {}
        }
        Ok(())
    }

    /// Makes every completed write and metadata update durable (fdatasync of the top file).
    pub fn flush(&self) -> Result<()> {
        self.images[0].storage().flush()
    }

    /// Allocates logical cluster `logical` in the writable layer, exactly once: if it is
    /// already there, returns it with `newly_allocated = false`. The entry is written (not
    /// flushed) after the data cluster is known to read as zeros (`Zeroed`) or with an empty
    /// bitmap (`Empty`), so it never makes stale data valid.
    pub fn allocate(&mut self, logical: u64, init: AllocInit) -> Result<Allocation> {
        if logical >= self.virtual_clusters() {
            return Err(PcowError::OutOfRange {
                offset: logical * self.cluster_size(),
                len: self.cluster_size(),
                size: self.virtual_size(),
            });
        }
        self.top_mut()?;
        let top = self.top_layer();
        let geo = self.geometry();
        let epoch = self.images[0].header().current_epoch;
        let full = geo.full_bitmap();
        if let Some(slot) = self.layers[top].index.get(logical) {
            if self.images[0].slot(slot).kind == EntryKind::Zero {
                // Tombstone data is punched (zeros): turn it into a full data cluster.
                self.ensure_mapped(slot)?;
                self.images[0].write_entry(slot, EntryKind::Data, epoch, logical, &full)?;
                return Ok(Allocation {
                    slot,
                    file_offset: geo.data_offset(slot),
                    newly_allocated: true,
                });
            }
            return Ok(Allocation {
                slot,
                file_offset: geo.data_offset(slot),
                newly_allocated: false,
            });
        }
        let slot = self.images[0].take_slot(init == AllocInit::Zeroed)?;
        if let Err(e) = self.ensure_mapped(slot) {
            self.images[0].untake_slot(slot);
            return Err(e);
        }
        let bitmap = match init {
            AllocInit::Zeroed => full,
            AllocInit::Empty => vec![0u64; geo.bitmap_words()],
        };
        self.images[0].write_entry(slot, EntryKind::Data, epoch, logical, &bitmap)?;
        self.layers[top].index.insert(logical, slot);
        self.merged.insert(logical, pack(top, slot));
        Ok(Allocation {
            slot,
            file_offset: geo.data_offset(slot),
            newly_allocated: true,
        })
    }

    /// Makes sure the file covers slot `slot`'s data cluster (so it can be mmapped).
    fn ensure_mapped(&mut self, slot: u64) -> Result<()> {
        let geo = self.geometry();
        let end = geo.data_offset(slot) + geo.cluster_size();
        let img = &mut self.images[0];
        if end <= img.known_len {
            return Ok(());
        }
        let len = img.storage().len()?;
        if len < end {
            // Extend by a batch (the pre-allocation pool) so that following allocations
            // are already covered.
            let batch = geo.cluster_size() * 64;
            img.storage().preallocate(len, end - len + batch)?;
            img.known_len = end + batch;
        } else {
            img.known_len = len;
        }
        Ok(())
    }

    /// Pre-allocates room for `count` more clusters at the end of the top file (the
    /// background pool refill of the paper's Algorithm 1).
    pub fn preallocate(&mut self, count: u64) -> Result<()> {
        self.top_mut()?.preallocate(count).map(|_| ())
    }

    /// Marks units of the writable-layer cluster `logical` valid (bitmap |= `units`). The
    /// caller must have made the copied data durable first (msync / DAX flush); the entry is
    /// written but not flushed.
    pub fn mark_valid(&mut self, logical: u64, units: &[u64]) -> Result<()> {
        let top = self.top_layer();
        let Some(slot) = self.layers[top].index.get(logical) else {
            return Err(PcowError::InvalidParameter(format!(
                "logical cluster {logical} is not allocated in the writable layer"
            )));
        };
        if self.images[0].slot(slot).kind != EntryKind::Data {
            return Err(PcowError::InvalidParameter(format!(
                "logical cluster {logical} is a zero tombstone: allocate it first"
            )));
        }
        let epoch = self.images[0].header().current_epoch;
        let img = self.top_mut()?;
        let full = img.geometry().full_bitmap();
        let mut bm = img.bitmap(slot).to_vec();
        let old = bm.clone();
        for (i, w) in bm.iter_mut().enumerate() {
            *w |= units.get(i).copied().unwrap_or(0) & full[i];
        }
        if bm != old {
            img.write_entry(slot, EntryKind::Data, epoch, logical, &bm)?;
        }
        Ok(())
    }

    /// Logical clusters held by layer `layer`, as (logical, location) pairs sorted by logical.
    pub fn layer_clusters(&self, layer: usize) -> Vec<(u64, ClusterLocation)> {
        let mut v: Vec<(u64, ClusterLocation)> = match self.layers.get(layer) {
            Some(l) => l
                .index
                .iter()
                .map(|(k, slot)| (k, self.location(layer, slot)))
                .collect(),
            None => Vec::new(),
        };
        v.sort_by_key(|(k, _)| *k);
        v
    }
}
