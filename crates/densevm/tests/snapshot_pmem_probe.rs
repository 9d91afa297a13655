//! Snapshots, restores and clones of a probe guest with a `--pmem` region (issue #11): the
//! region is saved by reference (its image flushed at the snapshot), and each clone of a
//! running VM gets its own pcow overlay of the image, as does the parent, which goes on in
//! an overlay mapped at the same place.

mod common;

use common::{
    assert_image_clean, densevm, require_kvm, stderr, stdout, vm, wait_for, wait_for_line, TempDir,
};
use densevm_probe::probe_checksum;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

const K: usize = 1024;

fn create_image(path: &Path, size: &str) {
    let out = densevm()
        .args(["image", "create", path.to_str().unwrap(), size])
        .output()
        .unwrap();
    assert!(out.status.success(), "image create: {}", stderr(&out));
}

/// Starts a probe VM with `image` as pmem0 and an API socket; its console goes to `console`.
fn start(dir: &Path, image: &Path, script: &str, console: &Path) -> (Child, PathBuf) {
    require_kvm();
    let sock = dir.join("api.sock");
    let out = std::fs::File::create(console).unwrap();
    let child = densevm()
        .args(["run", "--memory", "64M", "--timeout", "600", "--pmem"])
        .arg(image)
        .args(["--api-sock"])
        .arg(&sock)
        .args(["--probe", script])
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, sock)
}

/// `len` bytes at `offset` of the pcow chain whose top is `path`, read on the host.
fn read_image(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let chain = pcow::Chain::open(path, pcow::OpenOptions::default()).unwrap();
    let mut buf = vec![0u8; len];
    chain.read(offset, &mut buf).unwrap();
    buf
}

fn sum_line(what: &str, byte: u8, len: usize) -> String {
    format!("sum {what} = {:016x}", probe_checksum(&vec![byte; len]))
}

/// Clones of a running probe with a pmem region: each VM (the parent and two clones) fills
/// 64 KiB of the region with its own byte after the clone point and reads back its own
/// data and the 1 MiB written before it; the image the parent had is frozen (it still
/// holds only what was written before the clone), and each VM's writes are in its own
/// overlay.
#[test]
fn clones_of_a_probe_with_pmem_each_write_their_own_overlay() {
    let tmp = TempDir::new("clone-pmem");
    let image = tmp.0.join("pmem.pcow");
    create_image(&image, "16M");
    let console = tmp.0.join("parent.console");
    let script = "write pmem0 0 1M 0x11; sleep 2500; fill-id pmem0 1M 64K; \
                  sum pmem0 1M 64K; sum pmem0 0 1M; exit 3";
    let (mut parent, sock) = start(&tmp.0, &image, script, &console);
    wait_for(&console, "sleep 2500 ms");
    let dir = tmp.0.join("tmpl");
    let out = vm(
        &[
            "clone",
            "--count",
            "2",
            "--json",
            "--dir",
            dir.to_str().unwrap(),
        ],
        &sock,
    );
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let clones = doc["clones"].as_array().unwrap();
    assert_eq!(clones.len(), 2, "{out}");
    let status = parent.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(3),
        "parent: {}",
        std::fs::read_to_string(&console).unwrap()
    );
    // (console, overlay, the byte its fill-id writes: instance + 1; clone K is instance K + 1).
    let mut vms = vec![(console.clone(), dir.join("pmem0.parent.pcow"), 0x01u8)];
    for c in clones {
        let index = c["index"].as_u64().unwrap() as usize;
        vms.push((
            PathBuf::from(c["console"].as_str().unwrap()),
            dir.join(format!("pmem0.clone-{index}.pcow")),
            index as u8 + 2,
        ));
    }
    let before = sum_line("pmem0 0 1M", 0x11, 1 << 20);
    for (console, overlay, byte) in &vms {
        wait_for_line(console, "sum pmem0 0 1M");
        let text = std::fs::read_to_string(console).unwrap();
        let own = sum_line("pmem0 1M 64K", *byte, 64 * K);
        assert!(
            text.contains(&own) && text.contains(&before),
            "{}: expected `{own}` and `{before}`:\n{text}",
            console.display()
        );
        assert!(overlay.exists(), "{} missing", overlay.display());
    }
    // Let the clones finish (exit 3) and flush their overlays.
    for c in clones {
        let pid = c["pid"].as_u64().unwrap();
        let t0 = std::time::Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(t0.elapsed().as_secs() < 60, "clone {pid} did not exit");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    assert_eq!(read_image(&image, 0, 4), vec![0x11; 4]);
    assert_eq!(
        read_image(&image, 1 << 20, 64 * K),
        vec![0; 64 * K],
        "the frozen image was written after the clone point"
    );
    assert_image_clean(&image, "frozen image: ");
    for (_, overlay, byte) in &vms {
        assert_eq!(read_image(overlay, 1 << 20, 64 * K), vec![*byte; 64 * K]);
        assert_eq!(
            read_image(overlay, 0, 4),
            vec![0x11; 4],
            "{}",
            overlay.display()
        );
        assert_image_clean(overlay, "overlay: ");
    }
}

/// A full snapshot of a probe with a pmem region refers to its image: with the VM killed
/// (SIGKILL) right after the snapshot, a restore maps the image again, reads what the guest
/// wrote before the snapshot and goes on writing it. (The snapshot also fsyncs the image,
/// which only a host crash would show.) A restore whose image is not the snapshotted one
/// (another size) is refused.
#[test]
fn a_snapshot_flushes_the_pmem_image_and_a_restore_maps_it_again() {
    let tmp = TempDir::new("snap-pmem");
    let image = tmp.0.join("pmem.pcow");
    create_image(&image, "16M");
    let console = tmp.0.join("parent.console");
    let script = "write pmem0 0 512K 0x5a; sleep 2500; sum pmem0 0 512K; \
                  write pmem0 2M 4K 0x6b; sum pmem0 2M 4K; exit 5";
    let (mut parent, sock) = start(&tmp.0, &image, script, &console);
    wait_for(&console, "sleep 2500 ms");
    let snap = tmp.0.join("snap");
    vm(&["snapshot", "--dir", snap.to_str().unwrap()], &sock);
    parent.kill().unwrap();
    parent.wait().unwrap();
    assert_image_clean(&image, "after SIGKILL: ");

    let out = densevm()
        .args(["run", "--timeout", "600", "--restore"])
        .arg(&snap)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(5), "{text}{}", stderr(&out));
    assert!(
        text.contains(&sum_line("pmem0 0 512K", 0x5a, 512 * K)),
        "{text}"
    );
    assert!(
        text.contains(&sum_line("pmem0 2M 4K", 0x6b, 4 * K)),
        "{text}"
    );
    assert!(
        !text.contains("write pmem0 0 512K"),
        "the restore reran the script: {text}"
    );
    assert_eq!(read_image(&image, 2 << 20, 4), vec![0x6b; 4]);
    assert_image_clean(&image, "after the restored run: ");

    // Another image under the same name: a different size lands elsewhere and is refused.
    std::fs::remove_file(&image).unwrap();
    create_image(&image, "8M");
    let out = densevm()
        .args(["run", "--timeout", "60", "--restore"])
        .arg(&snap)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("not the image the VM had"), "{err}");
}
