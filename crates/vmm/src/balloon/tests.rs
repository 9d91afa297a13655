//! The VMM's balloon releases against real mappings: RAM in a shared RAM file, anonymous
//! RAM, RAM private over a frozen template, a boot-image window, refused ranges, and a
//! template freezing RAM while releases run.

use super::*;
use crate::memory::{
    back_ram_with_file, ram_with_windows, Backing, GuestMemory, RegionKind, RegionSpec,
};
use crate::snapshot::ram::{create_ram_file, remap, write_memory};
use densevm_virtio::balloon::BalloonMemory;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use vm_memory::{Bytes, GuestAddress};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;

fn read_page(memory: &GuestMemory, gpa: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE as usize];
    memory.mem().read_slice(&mut p, GuestAddress(gpa)).unwrap();
    p
}

fn all(p: &[u8], b: u8) -> bool {
    p.iter().all(|&x| x == b)
}

/// 4 MiB of RAM in a shared RAM file with a 1 MiB boot-image window at 1 MiB (a private
/// mapping of `image`, whose bytes are 0x5a).
fn vm_with_window() -> (GuestMemory, Arc<File>, SharedRam, tempdir::Dir) {
    let dir = tempdir::Dir::new("window");
    let image_path = dir.0.join("image");
    std::fs::write(&image_path, vec![0x5au8; MIB as usize]).unwrap();
    let image = Arc::new(File::open(&image_path).unwrap());
    let window = RegionSpec {
        name: "kernel.0".into(),
        gpa: MIB,
        size: MIB,
        backing: Backing::FilePrivate {
            file: image,
            offset: 0,
        },
    };
    let size = 4 * MIB;
    let file = Arc::new(create_ram_file(size).unwrap());
    let mut specs = ram_with_windows(size, 0, 4 << 30, vec![window]);
    back_ram_with_file(&mut specs, &file, true);
    let memory = GuestMemory::new(specs).unwrap();
    let ram = Arc::new(Mutex::new(RamFile::new(Some(file.clone()), true)));
    (memory, file, ram, dir)
}

#[test]
fn ram_in_a_shared_file_is_punched_out() {
    let (memory, file, ram, _dir) = vm_with_window();
    let release = GuestRamRelease::new(memory.regions().to_vec(), ram);
    memory
        .mem()
        .write_slice(&[7u8; 64 << 10], GuestAddress(0x30_0000))
        .unwrap();
    let before = file.metadata().unwrap().blocks();
    release.release(0x30_0000, 64 << 10).unwrap();
    let after = file.metadata().unwrap().blocks();
    // st_blocks counts 512-byte units: 64 KiB is 128 of them.
    assert!(before - after >= 128, "blocks {before} -> {after}");
    assert!(all(&read_page(&memory, 0x30_0000), 0));
    assert_eq!(release.counters().ram_bytes, 64 << 10);
}

#[test]
fn anonymous_ram_reads_zero_after_a_release() {
    let memory = GuestMemory::new(ram_with_windows(2 * MIB, 0, 4 << 30, Vec::new())).unwrap();
    let ram = Arc::new(Mutex::new(RamFile::new(None, false)));
    let release = GuestRamRelease::new(memory.regions().to_vec(), ram);
    memory
        .mem()
        .write_slice(&[3u8; 8192], GuestAddress(0x8000))
        .unwrap();
    release.release(0x8000, 8192).unwrap();
    assert!(all(&read_page(&memory, 0x9000), 0));
    assert_eq!(release.counters().ram_bytes, 8192);
}

/// A window page the guest rewrote loses its private copy and shows the image again; the
/// image file and the RAM around the window are untouched.
#[test]
fn a_window_release_drops_the_private_copy() {
    let (memory, file, ram, dir) = vm_with_window();
    let release = GuestRamRelease::new(memory.regions().to_vec(), ram);
    memory
        .mem()
        .write_slice(&[1u8; 3 * 4096], GuestAddress(MIB - PAGE))
        .unwrap();
    assert!(all(&read_page(&memory, MIB), 1), "the write did not land");
    release.release(MIB, PAGE).unwrap();
    assert!(
        all(&read_page(&memory, MIB), 0x5a),
        "the image's bytes are not back"
    );
    assert!(
        all(&read_page(&memory, MIB + PAGE), 1),
        "a neighbour was dropped"
    );
    assert!(
        all(&read_page(&memory, MIB - PAGE), 1),
        "RAM below was dropped"
    );
    let image = std::fs::read(dir.0.join("image")).unwrap();
    assert!(all(&image, 0x5a), "the image file changed");
    let c = release.counters();
    assert_eq!((c.window_bytes, c.ram_bytes, c.refused_bytes), (PAGE, 0, 0));
    drop(file);
}

/// Ranges across two regions, outside memory, in pmem or not whole pages are refused,
/// counted, and change nothing.
#[test]
fn bad_ranges_are_refused_and_counted() {
    let (memory, _file, ram, _dir) = vm_with_window();
    let mut regions = memory.regions().to_vec();
    // A pmem region above RAM: never touched, so no mapping is needed behind it.
    regions.push(RegionInfo {
        name: "pmem0".into(),
        gpa: 4 << 30,
        size: 2 * MIB,
        host_addr: 0x1000,
        kind: RegionKind::External,
        kvm_readonly: Vec::new(),
    });
    let release = GuestRamRelease::new(regions, ram);
    memory
        .mem()
        .write_slice(&[9u8; 2 * 4096], GuestAddress(MIB - PAGE))
        .unwrap();
    for (gpa, len) in [
        (MIB - PAGE, 2 * PAGE),  // ram | kernel.0
        (16 * MIB, PAGE),        // beyond RAM
        (4 << 30, PAGE),         // pmem
        (0x2000, 100),           // not whole pages
        (u64::MAX - PAGE, PAGE), // wraps
    ] {
        let e = release.release(gpa, len).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{gpa:#x}: {e}");
    }
    assert!(all(&read_page(&memory, MIB - PAGE), 9));
    assert!(all(&read_page(&memory, MIB), 9));
    let c = release.counters();
    assert_eq!(c.ram_bytes + c.window_bytes, 0);
    assert_eq!(c.refused_bytes, 2 * PAGE + PAGE + PAGE + 100 + PAGE);
}

/// After a template froze RAM (private over the file), a release maps zeros over the range:
/// the guest and a later snapshot read zeros, the template keeps its bytes.
#[test]
fn private_ram_over_a_template_reads_zero_and_the_template_keeps_its_bytes() {
    let (memory, file, ram, dir) = vm_with_window();
    memory
        .mem()
        .write_slice(&[0xaa; 4 * 4096], GuestAddress(0x20_0000))
        .unwrap();
    for r in memory
        .regions()
        .iter()
        .filter(|r| crate::memory::is_ram(&r.name))
    {
        remap(r, &file, false).unwrap();
    }
    *lock_ram(&ram) = RamFile::new(Some(file.clone()), false);
    let release = GuestRamRelease::new(memory.regions().to_vec(), ram.clone());
    memory
        .mem()
        .write_slice(&[0xbb; 4096], GuestAddress(0x20_1000))
        .unwrap();
    release.release(0x20_0000, 2 * PAGE).unwrap();
    // The same range again and a neighbour: one merged range is remembered.
    release.release(0x20_0000, 2 * PAGE).unwrap();
    release.release(0x20_2000, PAGE).unwrap();
    assert_eq!(lock_ram(&ram).discarded(), &[(0x20_0000, 3 * PAGE)]);
    for at in [0x20_0000, 0x20_1000, 0x20_2000] {
        assert!(all(&read_page(&memory, at), 0), "{at:#x} not zero");
    }
    assert!(all(&read_page(&memory, 0x20_3000), 0xaa));
    let mut t = vec![0u8; PAGE as usize];
    file.read_exact_at(&mut t, 0x20_0000).unwrap();
    assert!(all(&t, 0xaa), "the template changed");
    let out = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.0.join("memory"))
        .unwrap();
    write_memory(memory.regions(), &lock_ram(&ram), &out).unwrap();
    out.read_exact_at(&mut t, 0x20_1000).unwrap();
    assert!(
        all(&t, 0),
        "the snapshot shows the template or the old write"
    );
    out.read_exact_at(&mut t, 0x20_3000).unwrap();
    assert!(all(&t, 0xaa));
}

/// A template freezes RAM while the balloon's worker releases pages: once the freeze holds
/// the lock, no release punches the file the clones map (every page written before the
/// freeze is still in it, except those released before).
#[test]
fn releases_racing_a_freeze_never_punch_the_template() {
    let (memory, file, ram, _dir) = vm_with_window();
    let ram_region = memory.regions()[0].clone();
    assert_eq!((ram_region.name.as_str(), ram_region.size), ("ram", MIB));
    memory
        .mem()
        .write_slice(&vec![0xcc; MIB as usize], GuestAddress(0))
        .unwrap();
    let release = Arc::new(GuestRamRelease::new(memory.regions().to_vec(), ram.clone()));
    let worker = {
        let release = release.clone();
        std::thread::spawn(move || {
            for page in 0..MIB / PAGE {
                release.release(page * PAGE, PAGE).unwrap();
                std::thread::yield_now();
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(2));
    let frozen = {
        let mut guard = lock_ram(&ram);
        remap(&ram_region, &file, false).unwrap();
        *guard = RamFile::new(Some(file.clone()), false);
        let mut content = vec![0u8; MIB as usize];
        file.read_exact_at(&mut content, 0).unwrap();
        content
    };
    worker.join().unwrap();
    let mut now = vec![0u8; MIB as usize];
    file.read_exact_at(&mut now, 0).unwrap();
    assert!(now == frozen, "the template changed after the freeze");
    // Every page was released: the guest reads zeros everywhere.
    for page in 0..MIB / PAGE {
        assert!(all(&read_page(&memory, page * PAGE), 0), "page {page}");
    }
    assert_eq!(release.counters().ram_bytes, MIB);
}

#[test]
fn the_device_is_refused_above_guest_ram() {
    let (memory, _file, ram, _dir) = vm_with_window();
    let config = BalloonConfig {
        amount_mib: 5,
        deflate_on_oom: false,
        stats_polling_interval_s: 1,
        free_page_reporting: true,
    };
    let e = create(&config, 4 * MIB, memory.regions(), ram.clone())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("from 0 to 4"), "{e}");
    let (_device, balloon) = create(
        &BalloonConfig {
            amount_mib: 4,
            ..config
        },
        4 * MIB,
        memory.regions(),
        ram,
    )
    .unwrap();
    assert_eq!(balloon.handle.target_pages(), 4 * 256);
    assert_eq!(balloon.report().released, ReleaseCounters::default());
}

/// A directory removed when dropped.
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(what: &str) -> Self {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "densevm-balloon-{what}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
