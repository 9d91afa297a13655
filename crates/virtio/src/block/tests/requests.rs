//! Each request type on raw files and pcow images.

use super::*;

const MIB: u64 = 1 << 20;

#[test]
fn write_then_read_round_trip() {
    both(|format| {
        let disk = TestDisk::of(format, 4 * MIB);
        let block = disk.open(false);
        let mut d = Driver::new();
        let data = pattern(1, 3 * 512);
        // The data split over two descriptors, one of them not sector-sized.
        let status = {
            let r = d.request(&block, &[&header(OUT, 7), &data[..700], &data[700..]], &[1]);
            assert_eq!(r.len, 1);
            r.status()
        };
        assert_eq!(status, OK, "{format:?}: write");
        // Read back into three buffers of odd sizes.
        let r = d.request(&block, &[&header(IN, 7)], &[100, 1000, 436, 1]);
        assert_eq!(r.status(), OK, "{format:?}: read");
        assert_eq!(r.len, 3 * 512 + 1, "{format:?}: used length");
        assert_eq!(r.data(), data, "{format:?}: data read back");
        // The neighbours are untouched.
        let (s, before) = d.read(&block, 6, 512);
        assert_eq!((s, before), (OK, vec![0; 512]), "{format:?}: sector 6");
        let (s, after) = d.read(&block, 10, 512);
        assert_eq!((s, after), (OK, vec![0; 512]), "{format:?}: sector 10");
        // The bytes really are in the file, at sector 7.
        drop(block);
        assert_eq!(
            disk.contents(7 * 512, data.len()),
            data,
            "{format:?}: on disk"
        );
    });
}

#[test]
fn large_request_crosses_chunks() {
    both(|format| {
        let disk = TestDisk::of(format, 8 * MIB);
        let block = disk.open(false);
        let mut d = Driver::new();
        let data = pattern(2, (2 * MIB + 4096) as usize);
        assert_eq!(d.write(&block, 8, &data), OK);
        let (s, back) = d.read(&block, 8, data.len() as u32);
        assert_eq!(s, OK);
        assert!(
            back == data,
            "{format:?}: a 2 MiB read returns what was written"
        );
    });
}

#[test]
fn flush_completes_and_write_through_without_flush_feature() {
    both(|format| {
        let disk = TestDisk::of(format, MIB);
        let mut block = disk.open(false);
        block.ack_features(block.features());
        let mut d = Driver::new();
        assert_eq!(d.write(&block, 0, &pattern(3, 512)), OK);
        let r = d.request(&block, &[&header(FLUSH, 0)], &[1]);
        assert_eq!((r.status(), r.len), (OK, 1), "{format:?}: flush");
    });
    // The flushes themselves, counted by an in-memory disk.
    let flushes = |ack_flush: bool| {
        let mem = MemDisk::new(64 * 512);
        let counter = std::sync::Arc::new(std::sync::Mutex::new(mem));
        struct Shared(std::sync::Arc<std::sync::Mutex<MemDisk>>);
        impl Backend for Shared {
            fn size(&self) -> u64 {
                self.0.lock().unwrap().size()
            }
            fn read(&mut self, o: u64, b: &mut [u8]) -> std::io::Result<()> {
                self.0.lock().unwrap().read(o, b)
            }
            fn write(&mut self, o: u64, b: &[u8]) -> std::io::Result<()> {
                self.0.lock().unwrap().write(o, b)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                self.0.lock().unwrap().flush()
            }
            fn discard(&mut self, o: u64, l: u64) -> std::io::Result<()> {
                self.0.lock().unwrap().discard(o, l)
            }
            fn write_zeroes(&mut self, o: u64, l: u64, u: bool) -> std::io::Result<()> {
                self.0.lock().unwrap().write_zeroes(o, l, u)
            }
            fn discard_granularity(&self) -> u64 {
                4096
            }
        }
        let mut block = Block::from_backend(Box::new(Shared(counter.clone())), false, [0; 20]);
        let mut f = block.features();
        if !ack_flush {
            f &= !(1 << VIRTIO_BLK_F_FLUSH);
        }
        block.ack_features(f);
        let mut d = Driver::new();
        assert_eq!(d.write(&block, 1, &pattern(4, 1024)), OK);
        let after_write = counter.lock().unwrap().flushes;
        assert_eq!(d.request(&block, &[&header(FLUSH, 0)], &[1]).status(), OK);
        let after_flush = counter.lock().unwrap().flushes;
        (after_write, after_flush)
    };
    assert_eq!(flushes(true), (0, 1), "write-back: only FLUSH flushes");
    assert_eq!(flushes(false), (1, 2), "write-through: every write flushes");
}

#[test]
fn get_id_is_device_and_inode() {
    both(|format| {
        use std::os::unix::fs::MetadataExt;
        let disk = TestDisk::of(format, MIB);
        let block = disk.open(true);
        let meta = std::fs::metadata(&disk.path).unwrap();
        let want = format!("{:x}-{:x}", meta.dev(), meta.ino());
        let mut d = Driver::new();
        let r = d.request(&block, &[&header(GET_ID, 0)], &[20, 1]);
        assert_eq!((r.status(), r.len), (OK, 21), "{format:?}");
        let id = r.data();
        let text: Vec<u8> = id.iter().copied().take_while(|&b| b != 0).collect();
        let tail = &want.as_bytes()[want.len().saturating_sub(20)..];
        assert_eq!(text, tail, "{format:?}: serial");
        assert!(id[text.len()..].iter().all(|&b| b == 0), "zero padded");
        assert_eq!(block.serial().as_slice(), id.as_slice());
        // A shorter buffer gets the start of it.
        let r = d.request(&block, &[&header(GET_ID, 0)], &[4, 1]);
        assert_eq!((r.status(), r.len), (OK, 5));
        assert_eq!(r.data(), id[..4]);
        // No buffer at all: an error.
        let r = d.request(&block, &[&header(GET_ID, 0)], &[1]);
        assert_eq!((r.status(), r.len), (IOERR, 1));
    });
}

#[test]
fn discard_punches_raw_and_zeroes_pcow() {
    both(|format| {
        let disk = TestDisk::of(format, 4 * MIB);
        let block = disk.open(false);
        let mut d = Driver::new();
        let data = pattern(5, MIB as usize);
        assert_eq!(d.write(&block, 0, &data), OK);
        assert_eq!(d.request(&block, &[&header(FLUSH, 0)], &[1]).status(), OK);
        let full = disk.host_blocks();
        // Two segments: the first 512 KiB and the last 256 KiB of the 1 MiB written.
        let s = d.dwz(&block, DISCARD, &[(0, 1024, 0), (1536, 512, 0)]);
        assert_eq!(s, OK, "{format:?}: discard");
        let (s, back) = d.read(&block, 0, MIB as u32);
        assert_eq!(s, OK);
        match format {
            ImageFormat::Raw => {
                let now = disk.host_blocks();
                assert!(
                    now + 1536 <= full,
                    "the holes freed 768 KiB: {full} -> {now} blocks"
                );
                assert!(
                    back[..512 << 10].iter().all(|&b| b == 0),
                    "punched range reads 0"
                );
            }
            ImageFormat::Pcow => {
                assert!(
                    back[..512 << 10].iter().all(|&b| b == 0),
                    "discarded range reads 0"
                );
            }
        }
        assert_eq!(
            back[512 << 10..768 << 10],
            data[512 << 10..768 << 10],
            "kept"
        );
        assert!(back[768 << 10..].iter().all(|&b| b == 0), "second segment");
        // The unmap flag on a discard, or an unknown flag: unsupported.
        assert_eq!(d.dwz(&block, DISCARD, &[(0, 8, UNMAP)]), UNSUPP);
        assert_eq!(d.dwz(&block, DISCARD, &[(0, 8, 4)]), UNSUPP);
    });
}

#[test]
fn write_zeroes_with_and_without_unmap() {
    both(|format| {
        let disk = TestDisk::of(format, 4 * MIB);
        let block = disk.open(false);
        let mut d = Driver::new();
        let data = pattern(6, MIB as usize);
        assert_eq!(d.write(&block, 0, &data), OK);
        assert_eq!(d.request(&block, &[&header(FLUSH, 0)], &[1]).status(), OK);
        let full = disk.host_blocks();
        // Without unmap: sectors 8..16 and 100..101 (not aligned to anything).
        assert_eq!(d.dwz(&block, WRITE_ZEROES, &[(8, 8, 0), (100, 1, 0)]), OK);
        let (_, back) = d.read(&block, 0, MIB as u32);
        let mut want = data.clone();
        want[8 * 512..16 * 512].fill(0);
        want[100 * 512..101 * 512].fill(0);
        assert!(back == want, "{format:?}: zeroed ranges and nothing else");
        if format == ImageFormat::Raw {
            assert!(
                disk.host_blocks() >= full - 16,
                "no unmap: storage stays allocated"
            );
        }
        // With unmap: the second half of the data.
        assert_eq!(d.dwz(&block, WRITE_ZEROES, &[(1024, 1024, UNMAP)]), OK);
        let (_, back) = d.read(&block, 0, MIB as u32);
        want[512 << 10..].fill(0);
        assert!(back == want, "{format:?}: unmapped range reads zeros");
        if format == ImageFormat::Raw {
            assert!(disk.host_blocks() + 1024 <= full, "unmap freed 512 KiB");
        }
        assert_eq!(
            d.dwz(&block, WRITE_ZEROES, &[(0, 8, 2)]),
            UNSUPP,
            "unknown flag"
        );
    });
}

#[test]
fn pcow_chain_over_a_base() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.pcow");
    let top = dir.path().join("top.pcow");
    create_pcow(&base, 2 * MIB, None);
    let base_data = pattern(7, (256 << 10) as usize);
    {
        let mut c = pcow::Chain::open(
            &base,
            pcow::OpenOptions {
                writable: true,
                ..Default::default()
            },
        )
        .unwrap();
        c.write(0, &base_data).unwrap();
        c.flush().unwrap();
    }
    create_pcow(&top, 2 * MIB, Some("base.pcow"));
    let block = Block::open(BlockConfig {
        path: top.clone(),
        readonly: false,
        format: ImageFormat::Pcow,
    })
    .unwrap();
    assert_eq!(block.capacity(), 2 * MIB / 512);
    let mut d = Driver::new();
    let (s, back) = d.read(&block, 0, 256 << 10);
    assert_eq!((s, back == base_data), (OK, true), "the base shows through");
    // Write into the top, discard a cluster the base holds.
    assert_eq!(d.write(&block, 1, &pattern(8, 512)), OK);
    assert_eq!(d.dwz(&block, DISCARD, &[(128, 128, 0)]), OK);
    let (_, back) = d.read(&block, 0, 256 << 10);
    let mut want = base_data.clone();
    want[512..1024].copy_from_slice(&pattern(8, 512));
    want[64 << 10..128 << 10].fill(0);
    assert!(back == want, "top write and discard over the base");
    drop(block);
    let mut on_base = vec![0u8; 256 << 10];
    pcow::Chain::open(&base, pcow::OpenOptions::default())
        .unwrap()
        .read(0, &mut on_base)
        .unwrap();
    assert!(on_base == base_data, "the base file is not written");
}

#[test]
fn readonly_refuses_every_change() {
    both(|format| {
        let disk = TestDisk::of(format, MIB);
        {
            let block = disk.open(false);
            let mut d = Driver::new();
            assert_eq!(d.write(&block, 0, &pattern(9, 4096)), OK);
        }
        let block = disk.open(true);
        assert_ne!(block.features() & (1 << VIRTIO_BLK_F_RO), 0, "RO offered");
        let mut d = Driver::new();
        assert_eq!(
            d.write(&block, 0, &pattern(10, 512)),
            IOERR,
            "{format:?}: write"
        );
        assert_eq!(
            d.dwz(&block, DISCARD, &[(0, 8, 0)]),
            IOERR,
            "{format:?}: discard"
        );
        assert_eq!(
            d.dwz(&block, WRITE_ZEROES, &[(0, 8, 0)]),
            IOERR,
            "{format:?}: zeroes"
        );
        assert_eq!(d.dwz(&block, WRITE_ZEROES, &[(0, 8, UNMAP)]), IOERR);
        assert_eq!(d.request(&block, &[&header(FLUSH, 0)], &[1]).status(), OK);
        let (s, back) = d.read(&block, 0, 4096);
        assert_eq!(
            (s, back),
            (OK, pattern(9, 4096)),
            "{format:?}: reads still work"
        );
        drop(block);
        assert_eq!(
            disk.contents(0, 4096),
            pattern(9, 4096),
            "{format:?}: unchanged"
        );
    });
    // The device refuses by itself, whatever the backend would do.
    let block = mem_block(16, true);
    let mut d = Driver::new();
    assert_eq!(d.write(&block, 0, &[7; 512]), IOERR);
    assert_eq!(d.dwz(&block, WRITE_ZEROES, &[(0, 1, 0)]), IOERR);
    assert_eq!(d.read(&block, 0, 512), (OK, vec![0; 512]));
}

#[test]
fn out_of_range_and_misaligned() {
    both(|format| {
        let disk = TestDisk::of(format, MIB);
        let block = disk.open(false);
        let last = block.capacity() - 1;
        let mut d = Driver::new();
        assert_eq!(d.read(&block, last, 512).0, OK, "the last sector");
        assert_eq!(d.read(&block, last, 1024).0, IOERR, "past the end");
        assert_eq!(d.read(&block, last + 1, 512).0, IOERR);
        assert_eq!(d.read(&block, u64::MAX, 512).0, IOERR, "sector overflows");
        assert_eq!(d.read(&block, u64::MAX / 512 + 1, 512).0, IOERR);
        assert_eq!(d.read(&block, 0, 100).0, IOERR, "not whole sectors");
        assert_eq!(
            d.write(&block, last, &[1; 1024]),
            IOERR,
            "write past the end"
        );
        assert_eq!(
            d.write(&block, 0, &[1; 513]),
            IOERR,
            "write not whole sectors"
        );
        assert_eq!(d.write(&block, u64::MAX, &[1; 512]), IOERR);
        assert_eq!(d.dwz(&block, DISCARD, &[(last, 2, 0)]), IOERR);
        assert_eq!(d.dwz(&block, WRITE_ZEROES, &[(u64::MAX, 1, 0)]), IOERR);
        let too_many = vec![(0, 1, 0); MAX_DWZ_SEG as usize + 1];
        assert_eq!(
            d.dwz(&block, DISCARD, &too_many),
            IOERR,
            "too many segments"
        );
        assert_eq!(
            d.dwz(&block, DISCARD, &[(0, MAX_DWZ_SECTORS + 1, 0)]),
            IOERR
        );
        let r = d.request(&block, &[&header(DISCARD, 0), &[0; 15]], &[1]);
        assert_eq!(r.status(), IOERR, "a partial segment");
        let r = d.request(&block, &[&header(DISCARD, 0)], &[1]);
        assert_eq!(r.status(), IOERR, "no segment");
        drop(block);
        assert_eq!(
            disk.contents(0, 4096),
            vec![0; 4096],
            "{format:?}: nothing written"
        );
    });
}

#[test]
fn unknown_type_and_short_header() {
    let block = mem_block(16, false);
    let mut d = Driver::new();
    let r = d.request(&block, &[&header(2, 0)], &[1]);
    assert_eq!((r.status(), r.len), (UNSUPP, 1), "SCSI command");
    let r = d.request(&block, &[&header(0xdead, 0)], &[8, 1]);
    assert_eq!(r.status(), UNSUPP);
    assert_eq!(r.outs[0], vec![POISON; 8], "nothing written for it");
    let r = d.request(&block, &[&header(IN, 0)[..15]], &[512, 1]);
    assert_eq!((r.status(), r.len), (IOERR, 1), "a 15-byte header");
    assert_eq!(r.outs[0], vec![POISON; 512]);
    // The header split over descriptors is fine.
    let h = header(IN, 0);
    let r = d.request(&block, &[&h[..3], &h[3..9], &h[9..]], &[512, 1]);
    assert_eq!((r.status(), r.len), (OK, 513));
}

#[test]
fn several_requests_per_notification() {
    both(|format| {
        let disk = TestDisk::of(format, MIB);
        let block = disk.open(false);
        let mut d = Driver::new();
        let (a, b) = (pattern(11, 1024), pattern(12, 512));
        d.submit(&[&header(OUT, 0), &a], &[1]);
        d.submit(&[&header(OUT, 40), &b], &[1]);
        d.submit(&[&header(IN, 0)], &[1024, 1]);
        d.submit(&[&header(0x77, 0)], &[1]);
        d.submit(&[&header(IN, 40)], &[512, 1]);
        d.submit(&[&header(FLUSH, 0)], &[1]);
        assert_eq!(d.serve(&block), 6, "{format:?}: all served at once");
        let r = d.replies();
        let status: Vec<u8> = r.iter().map(Reply::status).collect();
        assert_eq!(status, [OK, OK, OK, UNSUPP, OK, OK]);
        assert_eq!(r[2].data(), a);
        assert_eq!(r[4].data(), b);
        assert_eq!(
            d.irq.queues.lock().unwrap().as_slice(),
            &[0],
            "one interrupt"
        );
        assert_eq!(d.serve(&block), 0, "nothing left");
    });
}
