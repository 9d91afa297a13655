//! On-disk structures of pcow version 1 (see `docs/pcow.md`): geometry, header slots,
//! entry slots and snapshot records, with their encoders and validating decoders.

use crate::error::{PcowError, Result};

/// Magic bytes at offset 0 of every header slot.
pub const HEADER_MAGIC: [u8; 8] = *b"PCOWIMG\0";
/// Magic bytes at offset 0 of a snapshot record.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"PCOWSNAP";
/// The only format version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Size of one header slot; two slots live at offsets 0 and `HEADER_SLOT_SIZE`.
pub const HEADER_SLOT_SIZE: usize = 2048;
/// Maximum length in bytes of the backing file name.
pub const MAX_BACKING_NAME: usize = 1024;
/// Size of a snapshot record at the start of its cluster.
pub const SNAPSHOT_RECORD_SIZE: usize = 512;
/// Maximum length in bytes of a snapshot name.
pub const MAX_SNAPSHOT_NAME: usize = 256;
/// Offset of the bitmap in an entry copy (the checksum is in the last 4 bytes).
pub const BITMAP_OFFSET: usize = 20;
/// Copy-on-write granularity: one validity bit per 4 KiB unit.
pub const UNIT_SIZE: u64 = 4096;
/// Smallest and largest supported cluster size (log2).
pub const MIN_CLUSTER_BITS: u32 = 12;
/// Largest supported cluster size (log2): 2 MiB.
pub const MAX_CLUSTER_BITS: u32 = 21;
/// Largest supported virtual size (1 PiB).
pub const MAX_VIRTUAL_SIZE: u64 = 1 << 50;
/// Largest number of entry slots (physical data clusters) in one file.
pub const MAX_SLOTS: u64 = u32::MAX as u64 - 1;

/// Computes the CRC32C checksum used by every pcow structure.
#[inline]
pub fn checksum(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if bytes.len() <= 256 && std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE4.2 (checked just above).
            return unsafe { crc32c_small_sse42(bytes) };
        }
    }
    crc32c::crc32c(bytes)
}

/// CRC32C of a short buffer with the SSE4.2 `crc32` instruction (entry copies are 32–128
/// bytes; the general-purpose routine's setup dominates at that size).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_small_sse42(data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let mut words = data.chunks_exact(8);
    let mut crc: u64 = 0xffff_ffff;
    for w in &mut words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let mut crc = crc as u32;
    let mut rest = words.remainder();
    if let Some((half, tail)) = rest.split_first_chunk::<4>() {
        crc = _mm_crc32_u32(crc, u32::from_le_bytes(*half));
        rest = tail;
    }
    for &b in rest {
        crc = _mm_crc32_u8(crc, b);
    }
    !crc
}

/// Cluster geometry derived from the cluster size: where meta clusters, entries and data live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// log2 of the cluster size.
    pub cluster_bits: u32,
    /// Size of one entry slot (an entry is a pair of slots).
    pub slot_size: u32,
    /// Entries per meta cluster (= data clusters per segment).
    pub entries_per_meta: u64,
}

impl Geometry {
    /// Builds the geometry for a cluster size of `1 << cluster_bits`.
    pub fn new(cluster_bits: u32) -> Result<Self> {
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
            return Err(PcowError::InvalidParameter(format!(
                "cluster size 2^{cluster_bits} is outside 4 KiB..2 MiB"
            )));
        }
        let units = 1u64 << (cluster_bits - 12);
        let words = units.div_ceil(64);
        let slot_size = (24 + 8 * words).next_power_of_two() as u32;
        let entries_per_meta = (1u64 << cluster_bits) / (2 * slot_size as u64);
        Ok(Geometry {
            cluster_bits,
            slot_size,
            entries_per_meta,
        })
    }
    /// Cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }
    /// Number of 4 KiB units per cluster.
    pub fn units(&self) -> u32 {
        1 << (self.cluster_bits - 12)
    }
    /// Number of u64 bitmap words per entry.
    pub fn bitmap_words(&self) -> usize {
        (self.units() as usize).div_ceil(64)
    }
    /// Size of an entry (two slots).
    pub fn pair_size(&self) -> u64 {
        2 * self.slot_size as u64
    }
    /// File offset of the meta cluster of segment `segment`.
    pub fn meta_offset(&self, segment: u64) -> u64 {
        (1 + segment * (self.entries_per_meta + 1)) << self.cluster_bits
    }
    /// File offset of the entry (slot pair) of physical slot `slot`.
    pub fn entry_offset(&self, slot: u64) -> u64 {
        self.meta_offset(slot / self.entries_per_meta)
            + (slot % self.entries_per_meta) * self.pair_size()
    }
    /// File offset of the data cluster of physical slot `slot`.
    pub fn data_offset(&self, slot: u64) -> u64 {
        let seg = slot / self.entries_per_meta;
        (1 + seg * (self.entries_per_meta + 1) + 1 + slot % self.entries_per_meta)
            << self.cluster_bits
    }
    /// Number of segments whose meta cluster starts below `file_len`.
    pub fn segments_in(&self, file_len: u64) -> u64 {
        let c = self.cluster_size();
        if file_len <= c {
            return 0;
        }
        (file_len - c).div_ceil((self.entries_per_meta + 1) * c)
    }
    /// Bitmap with every unit valid.
    pub fn full_bitmap(&self) -> Vec<u64> {
        let mut words = vec![u64::MAX; self.bitmap_words()];
        let units = self.units();
        if units < 64 {
            words[0] = (1u64 << units) - 1;
        }
        words
    }
}

/// The decoded header (super cluster) of a pcow file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Incremented by every header update; the valid slot with the highest value wins.
    pub generation: u64,
    /// Incompatible feature bits (none defined in version 1; must be 0).
    pub incompat_features: u64,
    /// Compatible feature bits (ignored if unknown).
    pub compat_features: u64,
    /// log2 of the cluster size.
    pub cluster_bits: u32,
    /// Guest-visible size in bytes.
    pub virtual_size: u64,
    /// Random identity of this image, checked by images that use it as their base.
    pub image_id: [u8; 16],
    /// The writable epoch.
    pub current_epoch: u32,
    /// The snapshot epoch the writable epoch derives from (0 = none).
    pub current_parent: u32,
    /// Next unused epoch number.
    pub next_epoch: u32,
    /// Identity (image_id) the backing file must have; zero when there is no backing file.
    pub backing_id: [u8; 16],
    /// Backing file name relative to this image's directory (empty = no backing file).
    pub backing_name: String,
}

fn get_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

impl Header {
    /// Encodes the header into one 2048-byte slot with its checksum.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_SLOT_SIZE];
        b[0..8].copy_from_slice(&HEADER_MAGIC);
        put_u32(&mut b, 8, VERSION);
        put_u32(&mut b, 12, HEADER_SLOT_SIZE as u32);
        put_u64(&mut b, 16, self.generation);
        put_u64(&mut b, 24, self.incompat_features);
        put_u64(&mut b, 32, self.compat_features);
        put_u32(&mut b, 40, self.cluster_bits);
        put_u64(&mut b, 48, self.virtual_size);
        b[56..72].copy_from_slice(&self.image_id);
        put_u32(&mut b, 72, self.current_epoch);
        put_u32(&mut b, 76, self.current_parent);
        put_u32(&mut b, 80, self.next_epoch);
        b[88..104].copy_from_slice(&self.backing_id);
        let name = self.backing_name.as_bytes();
        put_u16(&mut b, 112, name.len() as u16);
        b[128..128 + name.len()].copy_from_slice(name);
        let crc = checksum(&b[..HEADER_SLOT_SIZE - 4]);
        put_u32(&mut b, HEADER_SLOT_SIZE - 4, crc);
        b
    }

    /// Decodes and validates one header slot; `slot` is only used in error messages.
    pub fn decode(b: &[u8], slot: usize) -> Result<Header> {
        let bad = |reason: String| PcowError::BadHeader { slot, reason };
        if b.len() < HEADER_SLOT_SIZE {
            return Err(bad("file shorter than a header".into()));
        }
        if b[0..8] != HEADER_MAGIC {
            return Err(bad("bad magic (not a pcow image)".into()));
        }
        let version = get_u32(b, 8);
        if version != VERSION {
            return Err(PcowError::Unsupported(format!(
                "pcow version {version} (this build reads version {VERSION})"
            )));
        }
        let stored = get_u32(b, HEADER_SLOT_SIZE - 4);
        if checksum(&b[..HEADER_SLOT_SIZE - 4]) != stored
            || get_u32(b, 12) as usize != HEADER_SLOT_SIZE
        {
            return Err(bad("checksum mismatch (torn or corrupted header)".into()));
        }
        let h = Header {
            generation: get_u64(b, 16),
            incompat_features: get_u64(b, 24),
            compat_features: get_u64(b, 32),
            cluster_bits: get_u32(b, 40),
            virtual_size: get_u64(b, 48),
            image_id: b[56..72].try_into().expect("16 bytes"),
            current_epoch: get_u32(b, 72),
            current_parent: get_u32(b, 76),
            next_epoch: get_u32(b, 80),
            backing_id: b[88..104].try_into().expect("16 bytes"),
            backing_name: {
                let len = get_u16(b, 112) as usize;
                if len > MAX_BACKING_NAME {
                    return Err(bad(format!(
                        "backing name length {len} > {MAX_BACKING_NAME}"
                    )));
                }
                String::from_utf8(b[128..128 + len].to_vec())
                    .map_err(|_| bad("backing name is not UTF-8".into()))?
            },
        };
        if h.incompat_features != 0 {
            return Err(PcowError::Unsupported(format!(
                "incompatible feature bits {:#x}",
                h.incompat_features
            )));
        }
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&h.cluster_bits) {
            return Err(bad(format!("cluster_bits {} out of range", h.cluster_bits)));
        }
        if h.virtual_size > MAX_VIRTUAL_SIZE {
            return Err(bad(format!("virtual size {} too large", h.virtual_size)));
        }
        if h.current_epoch == 0
            || h.current_epoch >= h.next_epoch
            || h.current_parent >= h.next_epoch
        {
            return Err(bad(format!(
                "epoch fields inconsistent (current {}, parent {}, next {})",
                h.current_epoch, h.current_parent, h.next_epoch
            )));
        }
        Ok(h)
    }
}

/// What an entry describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// Unused slot.
    Free,
    /// A data cluster holding the units whose bitmap bit is set.
    Data,
    /// A tombstone: the logical cluster reads as zeros (shadows lower layers).
    Zero,
    /// The data cluster holds a snapshot record.
    Snapshot,
}

impl EntryKind {
    fn code(self) -> u8 {
        match self {
            EntryKind::Free => 0,
            EntryKind::Data => 1,
            EntryKind::Zero => 2,
            EntryKind::Snapshot => 3,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => EntryKind::Free,
            1 => EntryKind::Data,
            2 => EntryKind::Zero,
            3 => EntryKind::Snapshot,
            _ => return None,
        })
    }
}

/// One decoded entry slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Logical cluster number (guest offset / cluster size).
    pub logical: u64,
    /// Epoch that owns the entry.
    pub epoch: u32,
    /// Entry kind.
    pub kind: EntryKind,
    /// Update sequence number; of the two slots the valid one with the newer seq wins.
    pub seq: u32,
    /// Per-4 KiB validity bitmap (little-endian words).
    pub bitmap: Vec<u64>,
}

/// Result of decoding one slot.
#[derive(Debug, PartialEq, Eq)]
pub enum SlotState {
    /// All bytes zero: never written.
    Empty,
    /// Checksum or field check failed.
    Torn,
    /// A valid entry.
    Valid(Entry),
}

impl Entry {
    /// Encodes the entry into one slot of `geo.slot_size` bytes.
    pub fn encode(&self, geo: &Geometry) -> Vec<u8> {
        let mut b = vec![0u8; geo.slot_size as usize];
        put_u64(&mut b, 0, self.logical);
        put_u32(&mut b, 8, self.epoch);
        b[12] = self.kind.code();
        put_u32(&mut b, 16, self.seq);
        for (i, w) in self.bitmap.iter().enumerate() {
            put_u64(&mut b, BITMAP_OFFSET + 8 * i, *w);
        }
        let end = b.len() - 4;
        let crc = checksum(&b[..end]) ^ 0xffff_ffff;
        put_u32(&mut b, end, crc);
        b
    }

    /// Decodes one slot, checking checksum and field ranges.
    pub fn decode(b: &[u8], geo: &Geometry) -> SlotState {
        match decode_raw(b, &geo.full_bitmap()) {
            RawSlot::Empty => SlotState::Empty,
            RawSlot::Torn => SlotState::Torn,
            RawSlot::Valid(e) => SlotState::Valid(Entry {
                logical: e.logical,
                epoch: e.epoch,
                kind: e.kind,
                seq: e.seq,
                bitmap: e.bitmap[..geo.bitmap_words()].to_vec(),
            }),
        }
    }
}

/// An entry copy decoded without allocation (bitmap in a fixed array of 8 words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEntry {
    /// Logical cluster number (or snapshot flags).
    pub logical: u64,
    /// Owning epoch.
    pub epoch: u32,
    /// Entry kind.
    pub kind: EntryKind,
    /// Update sequence number.
    pub seq: u32,
    /// Validity bitmap (only the first `Geometry::bitmap_words()` words are used).
    pub bitmap: [u64; 8],
}

/// True if every byte is zero (word at a time; entry copies are multiples of 8 bytes).
#[inline]
fn is_all_zero(b: &[u8]) -> bool {
    let mut acc = 0u64;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        acc |= u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    acc == 0 && chunks.remainder().iter().all(|&x| x == 0)
}

/// Checks one entry copy's checksum only: 0 = empty, 1 = torn, 2 = checksum valid.
#[inline]
pub fn copy_state(b: &[u8]) -> u8 {
    let end = b.len() - 4;
    let stored = get_u32(b, end);
    if stored == 0 && is_all_zero(b) {
        0
    } else if checksum(&b[..end]) ^ 0xffff_ffff != stored {
        1
    } else {
        2
    }
}

/// Sequence number of an entry copy (no validation).
#[inline]
pub fn copy_seq(b: &[u8]) -> u32 {
    get_u32(b, 16)
}

/// Result of [`decode_raw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawSlot {
    /// All zero.
    Empty,
    /// Checksum or field check failed.
    Torn,
    /// A valid copy.
    Valid(RawEntry),
}

/// Decodes one entry copy like [`Entry::decode`], without allocating; `full` is
/// `geo.full_bitmap()`.
#[inline]
pub fn decode_raw(b: &[u8], full: &[u64]) -> RawSlot {
    let end = b.len() - 4;
    let stored = get_u32(b, end);
    if stored == 0 && is_all_zero(b) {
        return RawSlot::Empty;
    }
    if checksum(&b[..end]) ^ 0xffff_ffff != stored {
        return RawSlot::Torn;
    }
    parse_checked(b, full)
}

/// Parses a copy whose checksum was already verified (see [`copy_state`]).
#[inline]
pub fn parse_checked(b: &[u8], full: &[u64]) -> RawSlot {
    let mut bitmap = [0u64; 8];
    match parse_checked_into(b, full, &mut bitmap[..full.len()]) {
        Some(h) => RawSlot::Valid(RawEntry {
            logical: h.logical,
            epoch: h.epoch,
            kind: h.kind,
            seq: h.seq,
            bitmap,
        }),
        None => RawSlot::Torn,
    }
}

/// The fixed fields of an entry copy (its bitmap is written separately).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryFields {
    /// Logical cluster number (or snapshot flags).
    pub logical: u64,
    /// Owning epoch.
    pub epoch: u32,
    /// Entry kind.
    pub kind: EntryKind,
    /// Update sequence number.
    pub seq: u32,
}

/// Like [`parse_checked`] (same checks: known kind, no bitmap bit beyond the cluster), but
/// writes the bitmap into `bitmap` (`full.len()` words) instead of returning a copy; `None`
/// for a damaged copy (`bitmap` may then be partly written).
#[inline]
pub fn parse_checked_into(b: &[u8], full: &[u64], bitmap: &mut [u64]) -> Option<EntryFields> {
    let kind = EntryKind::from_code(b[12])?;
    for (i, (f, out)) in full.iter().zip(bitmap.iter_mut()).enumerate() {
        let w = get_u64(b, BITMAP_OFFSET + 8 * i);
        if w & !f != 0 {
            return None;
        }
        *out = w;
    }
    Some(EntryFields {
        logical: get_u64(b, 0),
        epoch: get_u32(b, 8),
        kind,
        seq: get_u32(b, 16),
    })
}

/// Returns true if sequence number `a` is newer than `b` (serial-number arithmetic).
pub fn seq_newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// A snapshot record, stored at the start of the data cluster of a `Snapshot` entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotRecord {
    /// The frozen epoch this snapshot names.
    pub epoch: u32,
    /// The epoch it derives from (0 = none).
    pub parent: u32,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_ns: u64,
    /// Virtual size at creation.
    pub virtual_size: u64,
    /// Snapshot name (unique within the image).
    pub name: String,
}

impl SnapshotRecord {
    /// Encodes the record into `SNAPSHOT_RECORD_SIZE` bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SNAPSHOT_RECORD_SIZE];
        b[0..8].copy_from_slice(&SNAPSHOT_MAGIC);
        put_u32(&mut b, 8, self.epoch);
        put_u32(&mut b, 12, self.parent);
        put_u64(&mut b, 16, self.created_ns);
        put_u64(&mut b, 24, self.virtual_size);
        let name = self.name.as_bytes();
        put_u16(&mut b, 32, name.len() as u16);
        b[40..40 + name.len()].copy_from_slice(name);
        let crc = checksum(&b[..SNAPSHOT_RECORD_SIZE - 4]);
        put_u32(&mut b, SNAPSHOT_RECORD_SIZE - 4, crc);
        b
    }

    /// Decodes and validates a record; `slot` is used in error messages.
    pub fn decode(b: &[u8], slot: u64) -> Result<Self> {
        let bad = |reason: &str| PcowError::BadSnapshotRecord {
            slot,
            reason: reason.to_string(),
        };
        if b.len() < SNAPSHOT_RECORD_SIZE || b[0..8] != SNAPSHOT_MAGIC {
            return Err(bad("bad magic"));
        }
        if checksum(&b[..SNAPSHOT_RECORD_SIZE - 4]) != get_u32(b, SNAPSHOT_RECORD_SIZE - 4) {
            return Err(bad("checksum mismatch"));
        }
        let len = get_u16(b, 32) as usize;
        if len > MAX_SNAPSHOT_NAME {
            return Err(bad("name too long"));
        }
        Ok(SnapshotRecord {
            epoch: get_u32(b, 8),
            parent: get_u32(b, 12),
            created_ns: get_u64(b, 16),
            virtual_size: get_u64(b, 24),
            name: String::from_utf8(b[40..40 + len].to_vec()).map_err(|_| bad("name not UTF-8"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_positions_do_not_overlap() {
        for bits in MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS {
            let g = Geometry::new(bits).unwrap();
            assert!(g.entries_per_meta >= 8, "bits {bits}");
            let e = g.entries_per_meta;
            // The last entry of a meta cluster ends inside it; the data follows it.
            assert!(g.entry_offset(e - 1) + g.pair_size() <= g.meta_offset(0) + g.cluster_size());
            assert_eq!(g.data_offset(0), g.meta_offset(0) + g.cluster_size());
            assert_eq!(g.data_offset(e - 1) + g.cluster_size(), g.meta_offset(1));
            assert_eq!(g.entry_offset(e), g.meta_offset(1));
            // 64-bit arithmetic beyond 4 GiB (the prototype's int overflow).
            let far = 3 * e + 5;
            assert_eq!(g.data_offset(far), (1 + 3 * (e + 1) + 1 + 5) << bits);
        }
    }

    #[test]
    fn small_checksum_matches_reference_crc32c() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 7, 8, 9, 28, 60, 124, 256, 257, 300] {
            assert_eq!(
                checksum(&data[..len]),
                crc32c::crc32c(&data[..len]),
                "len {len}"
            );
        }
        // Known CRC32C test vector.
        assert_eq!(checksum(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn entry_roundtrip_and_torn_detection() {
        let g = Geometry::new(16).unwrap();
        let e = Entry {
            logical: 77,
            epoch: 3,
            kind: EntryKind::Data,
            seq: 9,
            bitmap: vec![0b1011],
        };
        let mut b = e.encode(&g);
        assert_eq!(Entry::decode(&b, &g), SlotState::Valid(e));
        b[3] ^= 1;
        assert_eq!(Entry::decode(&b, &g), SlotState::Torn);
        assert_eq!(Entry::decode(&[0; 32], &g), SlotState::Empty);
    }

    #[test]
    fn header_roundtrip_and_checksum() {
        let h = Header {
            generation: 1,
            incompat_features: 0,
            compat_features: 0,
            cluster_bits: 16,
            virtual_size: 1 << 30,
            image_id: [7; 16],
            current_epoch: 1,
            current_parent: 0,
            next_epoch: 2,
            backing_id: [0; 16],
            backing_name: "base.pcow".into(),
        };
        let mut b = h.encode();
        assert_eq!(Header::decode(&b, 0).unwrap(), h);
        b[50] ^= 0x10;
        assert!(Header::decode(&b, 0).is_err());
    }
}
