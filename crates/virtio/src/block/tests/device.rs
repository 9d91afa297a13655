//! Opening disks, the configuration space, activation through the worker thread, reset.

use super::*;
use std::time::{Duration, Instant};

fn open_err(path: &Path, format: ImageFormat, readonly: bool) -> BlockError {
    match Block::open(BlockConfig {
        path: path.to_path_buf(),
        readonly,
        format,
    }) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e,
    }
}

#[test]
fn open_errors_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.raw");
    let e = open_err(&missing, ImageFormat::Raw, false);
    assert!(matches!(e, BlockError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("does not exist") && e.to_string().contains("create"));

    let e = open_err(dir.path(), ImageFormat::Raw, false);
    assert!(matches!(e, BlockError::IsDirectory { .. }), "{e:?}");
    assert!(e.to_string().contains("is a directory"), "{e}");

    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path, which outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = open_err(&fifo, ImageFormat::Raw, false);
    assert!(
        matches!(e, BlockError::NotFileOrBlockDevice { kind: "FIFO", .. }),
        "{e:?}"
    );
    let e = open_err(Path::new("/dev/null"), ImageFormat::Raw, true);
    assert!(e.to_string().contains("character device"), "{e}");

    // A raw file opened as pcow.
    let raw = TestDisk::raw(1 << 20);
    let e = open_err(&raw.path, ImageFormat::Pcow, false);
    assert!(matches!(e, BlockError::Pcow { .. }), "{e:?}");
    assert!(e.to_string().contains("format raw"), "{e}");
}

/// Makes `path` unwritable even for root (the immutable attribute); false where the file
/// system or the process cannot.
fn set_immutable(path: &Path, on: bool) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS/SETFLAGS read and write one c_long through the valid pointer;
    // the descriptor is open for the calls.
    unsafe {
        if libc::ioctl(fd, libc::FS_IOC_GETFLAGS, &mut flags) != 0 {
            return false;
        }
        let imm: libc::c_long = 0x10; // FS_IMMUTABLE_FL (linux/fs.h)
        flags = if on { flags | imm } else { flags & !imm };
        libc::ioctl(fd, libc::FS_IOC_SETFLAGS, &flags) == 0
    }
}

#[test]
fn readonly_file_opened_writable() {
    both(|format| {
        let disk = TestDisk::of(format, 1 << 20);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let locked = if root {
            set_immutable(&disk.path, true)
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&disk.path, std::fs::Permissions::from_mode(0o444)).is_ok()
        };
        if !locked {
            eprintln!("cannot make a file read-only here; skipped");
            return;
        }
        let e = open_err(&disk.path, format, false);
        assert!(
            matches!(e, BlockError::ReadOnlyFile { .. }),
            "{format:?}: {e:?}"
        );
        assert!(e.to_string().contains("read-only"), "{e}");
        // Read-only it opens.
        let block = disk.open(true);
        assert_eq!(block.capacity(), 2048);
        if root {
            assert!(set_immutable(&disk.path, false), "clear the immutable flag");
        }
    });
}

fn config_u32(block: &Block, field: usize) -> u32 {
    let mut b = [0u8; 4];
    block.read_config(field as u64, &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn config_space_and_features() {
    use std::mem::offset_of;
    use virtio_bindings::bindings::virtio_blk::virtio_blk_config as C;
    let disk = TestDisk::raw((3 << 20) + 300);
    let block = disk.open(false);
    assert_eq!(block.device_type(), 2);
    assert_eq!(block.queue_max_sizes(), &[256]);
    let mut cap = [0u8; 8];
    block.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 3 * 2048, "whole sectors only");
    assert_eq!(config_u32(&block, offset_of!(C, size_max)), SIZE_MAX);
    assert_eq!(config_u32(&block, offset_of!(C, seg_max)), SEG_MAX);
    assert_eq!(config_u32(&block, offset_of!(C, blk_size)), 512);
    assert_eq!(
        config_u32(&block, offset_of!(C, max_discard_sectors)),
        MAX_DWZ_SECTORS
    );
    assert_eq!(
        config_u32(&block, offset_of!(C, max_discard_seg)),
        MAX_DWZ_SEG
    );
    let align = config_u32(&block, offset_of!(C, discard_sector_alignment));
    assert!(align >= 1 && align.is_power_of_two(), "alignment {align}");
    assert_eq!(
        config_u32(&block, offset_of!(C, max_write_zeroes_sectors)),
        MAX_DWZ_SECTORS
    );
    assert_eq!(
        config_u32(&block, offset_of!(C, max_write_zeroes_seg)),
        MAX_DWZ_SEG
    );
    let mut unmap = [0u8; 1];
    block.read_config(offset_of!(C, write_zeroes_may_unmap) as u64, &mut unmap);
    assert_eq!(unmap, [1]);
    // Unaligned and past-the-end reads.
    let mut two = [0xffu8; 2];
    block.read_config(1, &mut two);
    assert_eq!(two, [(6144u64 >> 8) as u8, 0]);
    let mut past = [0xffu8; 8];
    block.read_config(CONFIG_LEN as u64 - 2, &mut past);
    assert_eq!(past, [0; 8]);
    block.read_config(u64::MAX, &mut past);
    assert_eq!(past, [0; 8]);

    let f = block.features();
    for bit in [
        VIRTIO_BLK_F_SEG_MAX,
        VIRTIO_BLK_F_SIZE_MAX,
        VIRTIO_BLK_F_BLK_SIZE,
        VIRTIO_BLK_F_FLUSH,
        VIRTIO_BLK_F_DISCARD,
        VIRTIO_BLK_F_WRITE_ZEROES,
    ] {
        assert_ne!(f & (1 << bit), 0, "feature {bit}");
    }
    assert_eq!(f & features::COMMON, features::COMMON);
    assert_eq!(f & (1 << VIRTIO_BLK_F_RO), 0, "writable disk");
    // pcow: the alignment is the cluster size.
    let p = TestDisk::pcow(1 << 20).open(false);
    assert_eq!(config_u32(&p, offset_of!(C, discard_sector_alignment)), 128);
}

/// Waits until the used ring holds `n` entries.
fn wait_used(mq: &MockQueue, n: usize) {
    let start = Instant::now();
    while mq.used().len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the worker served nothing"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn worker_serves_notifications_and_reset_reactivates() {
    let disk = TestDisk::raw(1 << 20);
    let mut block = disk.open(false);
    let irq = Arc::new(RecordingInterrupt::default());
    assert!(!block.is_active());
    block.ack_features(block.features());

    let mut mq = MockQueue::new(guest_memory(8 << 20), 0, QUEUE_SIZE);
    // A request made available before activation is served when the worker starts.
    let data = pattern(20, 1024);
    mq.add_request(&[&header(OUT, 2), &data], &[1]);
    let dq = mq.device_queue();
    let kick = dq.event.try_clone().unwrap();
    block
        .activate(mq.mem.clone(), irq.clone(), vec![dq])
        .unwrap();
    assert!(block.is_active());
    wait_used(&mq, 1);
    // Then one per notification.
    let (_, outs) = mq.add_request(&[&header(IN, 2)], &[1024, 1]);
    kick.write(1).unwrap();
    wait_used(&mq, 2);
    assert_eq!(mq.used()[1].1, 1025);
    assert_eq!(mq.read(outs[0], 1024), data);
    assert_eq!(mq.read(outs[1], 1), [OK]);
    assert!(
        !irq.queues.lock().unwrap().is_empty(),
        "the driver was interrupted"
    );

    block.reset();
    assert!(!block.is_active());
    // The write reached the file (flushed on reset).
    assert_eq!(disk.contents(2 * 512, 1024), data);
    // Re-activation on fresh rings, as a driver does after a reset.
    block.ack_features(block.features());
    let mut mq = MockQueue::new(guest_memory(8 << 20), 0, QUEUE_SIZE);
    let dq = mq.device_queue();
    let kick = dq.event.try_clone().unwrap();
    block
        .activate(mq.mem.clone(), irq.clone(), vec![dq])
        .unwrap();
    let (_, outs) = mq.add_request(&[&header(IN, 2)], &[1024, 1]);
    kick.write(1).unwrap();
    wait_used(&mq, 1);
    assert_eq!(mq.read(outs[0], 1024), data, "served after re-activation");
    assert_eq!(mq.read(outs[1], 1), [OK]);
    block.reset();
    block.reset(); // twice, and on a never-activated device, is fine
    disk.open(true).reset();
}

#[test]
fn activation_checks_its_queues() {
    let mut block = mem_block(8, false);
    let irq: Arc<dyn Interrupt> = Arc::new(RecordingInterrupt::default());
    let mem = guest_memory(4 << 20);
    let e = block
        .activate(mem.clone(), irq.clone(), vec![])
        .unwrap_err();
    assert!(
        matches!(e, ActivateError::QueueCount { want: 1, got: 0 }),
        "{e:?}"
    );
    let mq = MockQueue::new(mem.clone(), 0, 16);
    let two = vec![mq.device_queue(), mq.device_queue()];
    let e = block.activate(mem.clone(), irq.clone(), two).unwrap_err();
    assert!(
        matches!(e, ActivateError::QueueCount { want: 1, got: 2 }),
        "{e:?}"
    );
    // Rings past the end of guest memory.
    let far = MockQueue::new(guest_memory(8 << 20), (4 << 20) - 64, 16);
    let e = block
        .activate(mem, irq, vec![far.device_queue()])
        .unwrap_err();
    assert!(matches!(e, ActivateError::InvalidQueue(0)), "{e:?}");
    assert!(!block.is_active());
}

#[test]
fn corrupt_ring_needs_reset_until_reset() {
    let mut block = mem_block(64, false);
    block.ack_features(block.features());
    let irq = Arc::new(RecordingInterrupt::default());
    let mut mq = MockQueue::new(guest_memory(8 << 20), 0, 16);
    let dq = mq.device_queue();
    let kick = dq.event.try_clone().unwrap();
    block
        .activate(mq.mem.clone(), irq.clone(), vec![dq])
        .unwrap();
    // The available index runs 100 entries ahead of a 16-entry queue.
    mq.set_avail_idx(100);
    kick.write(1).unwrap();
    let start = Instant::now();
    while irq.resets.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "no needs_reset");
        std::thread::sleep(Duration::from_millis(2));
    }
    // Until reset, a sane request is not served.
    mq.set_avail_idx(0);
    mq.add_request(&[&header(FLUSH, 0)], &[1]);
    kick.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(mq.used().is_empty(), "a broken device serves nothing");
    assert_eq!(irq.resets.load(std::sync::atomic::Ordering::SeqCst), 1);
    block.reset();
    let mut mq = MockQueue::new(guest_memory(8 << 20), 0, 16);
    mq.add_request(&[&header(FLUSH, 0)], &[1]);
    block
        .activate(mq.mem.clone(), irq, vec![mq.device_queue()])
        .unwrap();
    wait_used(&mq, 1);
}

#[test]
fn pcow_writes_are_in_the_image_after_drop() {
    let disk = TestDisk::pcow(1 << 20);
    let data = pattern(21, 8192);
    {
        let mut block = disk.open(false);
        block.ack_features(block.features());
        let mut d = Driver::new();
        assert_eq!(d.write(&block, 16, &data), OK);
    }
    assert_eq!(disk.contents(16 * 512, 8192), data);
}
