//! densevm-kernel on synthetic bzImages and ELF files built in the test.

use densevm_kernel::{
    detect_format, extract_vmlinux, extract_vmlinux_with_progress, load_segments, parse_elf,
    pvh_entry, read_bzimage_header, Compression, KernelError, KernelFormat,
};
use std::io::Write;

const PVH_ENTRY: u64 = 0x100_0850;

/// A small x86_64 ELF: two PT_LOAD segments and a PT_NOTE with the PVH entry.
struct ElfBuilder {
    machine: u16,
    notes: Vec<u8>,
    segments: Vec<(u64, u64, u64, u64)>, // (paddr, offset, filesz, memsz)
}

fn note(name: &[u8], n_type: u32, desc: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(&n_type.to_le_bytes());
    out.extend_from_slice(name);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out.extend_from_slice(desc);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

impl ElfBuilder {
    fn new() -> Self {
        let mut notes = note(b"GNU\0", 3, &[1, 2, 3, 4]);
        notes.extend(note(b"Xen\0", 18, &PVH_ENTRY.to_le_bytes()));
        ElfBuilder {
            machine: 62,
            notes,
            segments: vec![
                (0x100_0000, 0x1000, 0x2000, 0x2000),
                (0x100_2000, 0x3000, 0x800, 0x4000),
            ],
        }
    }

    fn build(&self) -> Vec<u8> {
        let phnum = self.segments.len() + 1;
        let notes_off = 64 + 56 * phnum as u64;
        let mut f = vec![0u8; 0x4000];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&self.machine.to_le_bytes());
        f[24..32].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes());
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&(phnum as u16).to_le_bytes());
        let mut ph = Vec::new();
        for &(paddr, offset, filesz, memsz) in &self.segments {
            ph.push((1u32, 5u32, offset, paddr, filesz, memsz));
        }
        ph.push((
            4,
            4,
            notes_off,
            0,
            self.notes.len() as u64,
            self.notes.len() as u64,
        ));
        for (i, (ty, flags, off, paddr, filesz, memsz)) in ph.into_iter().enumerate() {
            let b = 64 + i * 56;
            f[b..b + 4].copy_from_slice(&ty.to_le_bytes());
            f[b + 4..b + 8].copy_from_slice(&flags.to_le_bytes());
            f[b + 8..b + 16].copy_from_slice(&off.to_le_bytes());
            f[b + 16..b + 24].copy_from_slice(&(paddr | 0xffff_ffff_8000_0000).to_le_bytes());
            f[b + 24..b + 32].copy_from_slice(&paddr.to_le_bytes());
            f[b + 32..b + 40].copy_from_slice(&filesz.to_le_bytes());
            f[b + 40..b + 48].copy_from_slice(&memsz.to_le_bytes());
            f[b + 48..b + 56].copy_from_slice(&0x1000u64.to_le_bytes());
        }
        let n = notes_off as usize;
        f[n..n + self.notes.len()].copy_from_slice(&self.notes);
        for (i, byte) in f[0x1000..].iter_mut().enumerate() {
            *byte = (i * 7 % 251) as u8;
        }
        f
    }
}

fn xz(data: &[u8]) -> Vec<u8> {
    let mut enc = xz2::write::XzEncoder::new(Vec::new(), 6);
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn lz4_legacy(data: &[u8]) -> Vec<u8> {
    let mut out = 0x184c_2102u32.to_le_bytes().to_vec();
    for chunk in data.chunks(8 << 20) {
        let block = lz4_flex::block::compress(chunk);
        out.extend_from_slice(&(block.len() as u32).to_le_bytes());
        out.extend_from_slice(&block);
    }
    out
}

/// A bzImage (protocol 2.15, one setup sector) around `payload`; like the real
/// thing, the payload is followed by the 4-byte uncompressed size.
fn bzimage(payload: &[u8]) -> Vec<u8> {
    let setup_sects = 1u8;
    let kernel_offset = (setup_sects as usize + 1) * 512;
    let payload_rel = 0x100usize;
    let mut f = vec![0u8; kernel_offset + payload_rel];
    f[0x1f1] = setup_sects;
    f[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    f[0x202..0x206].copy_from_slice(b"HdrS");
    f[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    f[0x211] = 1;
    f[0x230..0x234].copy_from_slice(&0x20_0000u32.to_le_bytes());
    f[0x234] = 1;
    f[0x236..0x238].copy_from_slice(&0x7fu16.to_le_bytes());
    f[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
    let len = payload.len() as u32 + 4;
    f[0x248..0x24c].copy_from_slice(&(payload_rel as u32).to_le_bytes());
    f[0x24c..0x250].copy_from_slice(&len.to_le_bytes());
    f[0x258..0x260].copy_from_slice(&0x100_0000u64.to_le_bytes());
    f[0x260..0x264].copy_from_slice(&0x400_0000u32.to_le_bytes());
    f.extend_from_slice(payload);
    f.extend_from_slice(&0x4000u32.to_le_bytes());
    f
}

#[test]
fn header_fields_of_a_valid_bzimage() {
    let image = bzimage(&xz(&ElfBuilder::new().build()));
    let h = read_bzimage_header(&image).unwrap();
    assert_eq!(h.protocol_string(), "2.15");
    assert_eq!(h.kernel_offset, 1024);
    assert_eq!(h.payload_offset, 1024 + 0x100);
    assert_eq!(h.payload_length as usize, image.len() - 1024 - 0x100);
    assert_eq!(h.compression, Compression::Xz);
    assert!(h.xloadflags.kernel_64());
    assert!(h.xloadflags.names().contains(&"CAN_BE_LOADED_ABOVE_4G"));
    assert!(h.relocatable && h.loaded_high);
    assert_eq!(h.pref_address, 0x100_0000);
    assert_eq!(h.init_size, 0x400_0000);
    assert_eq!(h.cmdline_size, 2047);
    assert_eq!(detect_format(&image), KernelFormat::BzImage);
}

#[test]
fn extracts_xz_gzip_lz4_and_uncompressed_payloads() {
    let elf = ElfBuilder::new().build();
    for (payload, kind) in [
        (xz(&elf), Compression::Xz),
        (gzip(&elf), Compression::Gzip),
        (lz4_legacy(&elf), Compression::Lz4),
        (elf.clone(), Compression::None),
    ] {
        let image = bzimage(&payload);
        assert_eq!(read_bzimage_header(&image).unwrap().compression, kind);
        let out = extract_vmlinux(&image).unwrap_or_else(|e| panic!("{kind}: {e}"));
        // An uncompressed payload keeps the 4-byte size word the build appends.
        let expected_len = if kind == Compression::None {
            elf.len() + 4
        } else {
            elf.len()
        };
        assert_eq!(out.len(), expected_len, "{kind}: extracted length");
        assert!(
            out[..elf.len()] == elf[..],
            "{kind}: extracted bytes differ"
        );
    }
}

#[test]
fn progress_reaches_the_whole_input_and_output() {
    let elf = ElfBuilder::new().build();
    let image = bzimage(&xz(&elf));
    let mut last = None;
    extract_vmlinux_with_progress(&image, &mut |p| last = Some(p)).unwrap();
    let last = last.expect("no progress reported");
    assert_eq!(last.output_done, elf.len() as u64);
    assert!(last.input_done > 0 && last.input_done <= last.input_total);
}

#[test]
fn elf_segments_and_pvh_entry() {
    let elf = ElfBuilder::new().build();
    let k = parse_elf(&elf).unwrap();
    assert_eq!(k.pvh_entry, Some(PVH_ENTRY));
    assert_eq!(pvh_entry(&elf).unwrap(), PVH_ENTRY);
    let segs = load_segments(&elf).unwrap();
    assert_eq!(segs.len(), 2);
    assert_eq!(
        (segs[1].paddr, segs[1].offset, segs[1].filesz, segs[1].memsz),
        (0x100_2000, 0x3000, 0x800, 0x4000)
    );
    assert!(segs.iter().all(|s| s.mappable()));
    assert_eq!(segs[0].flags.as_rwx(), "r-x");
    assert_eq!((k.load_start(), k.load_end()), (0x100_0000, 0x100_6000));
    assert_eq!(detect_format(&elf), KernelFormat::Elf);
}

#[test]
fn four_byte_pvh_note_is_accepted_and_missing_note_is_an_error() {
    let mut b = ElfBuilder::new();
    b.notes = note(b"Xen\0", 18, &0x100_0850u32.to_le_bytes());
    assert_eq!(pvh_entry(&b.build()).unwrap(), 0x100_0850);
    b.notes = note(b"GNU\0", 3, &[0; 4]);
    assert!(matches!(
        pvh_entry(&b.build()),
        Err(KernelError::NoPvhEntry)
    ));
    b.notes = note(b"Xen\0", 18, &[1, 2]);
    assert!(matches!(
        parse_elf(&b.build()),
        Err(KernelError::BadNote { .. })
    ));
}

#[test]
fn bad_bzimages_give_typed_errors() {
    let good = bzimage(&xz(&ElfBuilder::new().build()));

    assert!(matches!(
        read_bzimage_header(&good[..0x100]),
        Err(KernelError::Truncated { .. })
    ));
    assert!(matches!(
        read_bzimage_header(&[]),
        Err(KernelError::Truncated { .. })
    ));

    let mut bad = good.clone();
    bad[0x1fe] = 0;
    assert!(matches!(
        read_bzimage_header(&bad),
        Err(KernelError::BadMagic { .. })
    ));

    let mut bad = good.clone();
    bad[0x202] = b'X';
    assert!(matches!(
        read_bzimage_header(&bad),
        Err(KernelError::BadMagic { .. })
    ));

    let mut bad = good.clone();
    bad[0x206..0x208].copy_from_slice(&0x0204u16.to_le_bytes());
    let err = read_bzimage_header(&bad).unwrap_err();
    assert!(
        matches!(err, KernelError::ProtocolTooOld { major: 2, minor: 4 }),
        "{err}"
    );

    let mut bad = good.clone();
    bad[0x24c..0x250].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        read_bzimage_header(&bad),
        Err(KernelError::PayloadOutOfBounds { .. })
    ));

    let truncated = &good[..good.len() - 10];
    assert!(matches!(
        extract_vmlinux(truncated),
        Err(KernelError::PayloadOutOfBounds { .. })
    ));

    let mut bad = good.clone();
    bad[1024 + 0x100] = 0x42;
    let err = extract_vmlinux(&bad).unwrap_err();
    assert!(
        matches!(err, KernelError::UnknownCompression { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("42 37 7a 58"), "{err}");
}

#[test]
fn recognised_but_undecoded_compressions_are_named() {
    for (magic, kind) in [
        (&[0x28u8, 0xb5, 0x2f, 0xfd][..], Compression::Zstd),
        (b"BZh9", Compression::Bzip2),
        (&[0x5d, 0, 0, 0x80], Compression::Lzma),
        (&[0x89, b'L', b'Z', b'O'], Compression::Lzo),
    ] {
        let mut payload = magic.to_vec();
        payload.extend_from_slice(&[0u8; 64]);
        let err = extract_vmlinux(&bzimage(&payload)).unwrap_err();
        assert!(
            matches!(err, KernelError::UnsupportedCompression(k) if k == kind),
            "{err}"
        );
        assert!(err.to_string().contains(&kind.to_string()));
    }
}

#[test]
fn corrupt_and_truncated_streams_are_decompress_errors() {
    let elf = ElfBuilder::new().build();
    // xz and gzip carry checksums, so any flipped byte is detected.
    for (name, payload) in [("xz", xz(&elf)), ("gzip", gzip(&elf))] {
        let mut corrupt = payload.clone();
        let mid = corrupt.len() / 2;
        for b in &mut corrupt[mid..mid + 8] {
            *b ^= 0x5a;
        }
        let err = extract_vmlinux(&bzimage(&corrupt)).err();
        assert!(
            matches!(err, Some(KernelError::Decompress { .. })),
            "{name} corrupt: {err:?}"
        );
    }
    for (name, payload) in [
        ("xz", xz(&elf)),
        ("gzip", gzip(&elf)),
        ("lz4", lz4_legacy(&elf)),
    ] {
        let cut = &payload[..payload.len() * 2 / 3];
        let err = extract_vmlinux(&bzimage(cut)).err();
        assert!(
            matches!(err, Some(KernelError::Decompress { .. })),
            "{name} truncated: {err:?}"
        );
    }
}

#[test]
fn payload_that_is_not_an_elf_is_rejected_after_decompression() {
    let err = extract_vmlinux(&bzimage(&xz(&[0xabu8; 4096]))).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::BadMagic {
                what: "ELF file",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_elves_give_typed_errors() {
    let good = ElfBuilder::new().build();
    assert!(matches!(
        parse_elf(&good[..40]),
        Err(KernelError::Truncated { .. })
    ));

    let mut b = ElfBuilder::new();
    b.machine = 3;
    let err = parse_elf(&b.build()).unwrap_err();
    assert!(err.to_string().contains("not x86_64"), "{err}");

    let mut bad = good.clone();
    bad[4] = 1;
    assert!(matches!(
        parse_elf(&bad),
        Err(KernelError::UnsupportedElf(_))
    ));

    let mut b = ElfBuilder::new();
    b.segments[1] = (0x100_2000, 0x3000, 0x10_0000, 0x10_0000);
    assert!(matches!(
        parse_elf(&b.build()),
        Err(KernelError::BadSegment { index: 1, .. })
    ));

    let mut b = ElfBuilder::new();
    b.segments[1] = (0x100_1000, 0x3000, 0x800, 0x4000);
    let err = parse_elf(&b.build()).unwrap_err();
    assert!(err.to_string().contains("overlaps"), "{err}");

    let mut b = ElfBuilder::new();
    b.segments[0] = (0x100_0000, 0x1000, 0x3000, 0x2000);
    let err = parse_elf(&b.build()).unwrap_err();
    assert!(err.to_string().contains("exceeds memsz"), "{err}");

    let mut bad = good.clone();
    bad[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse_elf(&bad),
        Err(KernelError::Truncated { .. })
    ));

    let mut b = ElfBuilder::new();
    b.segments.clear();
    assert!(matches!(
        parse_elf(&b.build()),
        Err(KernelError::NoLoadSegments)
    ));
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Arbitrary byte flips in a valid bzImage or ELF give a result or an error, never a panic.
        #[test]
        fn mutated_inputs_never_panic(flips in proptest::collection::vec((0usize..0x5000, any::<u8>()), 1..8)) {
            let elf = ElfBuilder::new().build();
            let mut image = bzimage(&xz(&elf));
            let mut elf_mut = elf.clone();
            for (pos, val) in flips {
                let n = image.len();
                image[pos % n] ^= val;
                let m = elf_mut.len();
                elf_mut[pos % m] ^= val;
            }
            let _ = read_bzimage_header(&image);
            let _ = extract_vmlinux(&image);
            let _ = parse_elf(&elf_mut);
            let _ = pvh_entry(&elf_mut);
        }

        /// Random bytes never panic any parser.
        #[test]
        fn random_inputs_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = read_bzimage_header(&data);
            let _ = extract_vmlinux(&data);
            let _ = parse_elf(&data);
            let _ = detect_format(&data);
        }
    }
}
