//! `densevm run --pmem IMAGE`: the probe guest on /dev/kvm reads and writes a mapped pcow
//! region. Thin expansion, reads that allocate nothing, copy-on-write against a snapshot and
//! a base image, rollback, persistence across VM restarts.

mod common;

use common::{densevm, run_probe, stderr, stdout};
use densevm_probe::probe_checksum;
use std::path::{Path, PathBuf};

const K: usize = 1024;

/// A scratch directory for this test, removed when it drops (pass or fail).
fn tmpdir(name: &str) -> common::TempDir {
    common::TempDir::new(&format!("pmem-{name}"))
}

fn image(args: &[&str]) {
    let out = densevm().arg("image").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "densevm image {args:?}: {}",
        stderr(&out)
    );
}

fn create(path: &Path, size: &str, backing: Option<&str>) {
    let p = path.to_str().unwrap();
    match backing {
        Some(b) => image(&["create", p, size, "-b", b]),
        None => image(&["create", p, size]),
    }
}

/// Runs the probe with `--pmem` images; returns stdout after checking the exit code.
fn run(images: &[&Path], script: &str) -> String {
    let mut args: Vec<String> = vec!["--probe".into(), script.into()];
    for i in images {
        args.push("--pmem".into());
        args.push(i.to_str().unwrap().into());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_probe(&refs);
    assert_eq!(
        out.status.code(),
        Some(0),
        "script {script:?}\nstdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// The checksum the probe printed for `sum REGION_ARGS`.
fn sum(out: &str, what: &str) -> u64 {
    let prefix = format!("sum {what} = ");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{out}"));
    u64::from_str_radix(line.trim(), 16).unwrap()
}

/// Creates `base.pcow` (16 MiB) in a fresh directory `name` and has the probe write `byte`
/// over its first `len` bytes; returns the directory and the base's path.
fn filled_base(name: &str, len: &str, byte: &str) -> (common::TempDir, PathBuf) {
    let dir = tmpdir(name);
    let base = dir.join("base.pcow");
    create(&base, "16M", None);
    run(&[&base], &format!("write pmem0 0 {len} {byte}; exit 0"));
    (dir, base)
}

fn check_clean(path: &Path) {
    common::assert_image_clean(path, "");
}

fn chain(path: &Path) -> pcow::Chain {
    pcow::Chain::open(path, pcow::OpenOptions::default()).unwrap()
}

fn read(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    chain(path).read(offset, &mut buf).unwrap();
    buf
}

#[test]
fn guest_writes_expand_thinly_and_reads_allocate_nothing() {
    let dir = tmpdir("thin");
    let img = dir.join("a.pcow");
    create(&img, "64M", None);
    let out = run(
        &[&img],
        "sum pmem0 0 64K; write pmem0 1M 128K 0xab; sum pmem0 1M 128K; sum pmem0 2M 4K; exit 0",
    );
    assert_eq!(sum(&out, "pmem0 0 64K"), probe_checksum(&[0; 64 * K]));
    assert_eq!(sum(&out, "pmem0 1M 128K"), probe_checksum(&[0xab; 128 * K]));
    assert_eq!(sum(&out, "pmem0 2M 4K"), probe_checksum(&[0; 4 * K]));
    let c = chain(&img);
    let cs = c.cluster_size();
    assert!(c.lookup(0).is_none(), "a read allocated cluster 0");
    assert!(c.lookup((2 << 20) / cs).is_none(), "a read allocated at 2M");
    let allocated: Vec<u64> = (0..c.virtual_clusters())
        .filter(|&l| c.lookup(l).is_some())
        .collect();
    let expect: Vec<u64> = ((1 << 20) / cs..((1 << 20) + (128 << 10)) / cs).collect();
    assert_eq!(allocated, expect, "only the written clusters are allocated");
    assert_eq!(read(&img, 1 << 20, 128 * K), vec![0xab; 128 * K]);
    check_clean(&img);

    // Persistence across VM restarts.
    let out = run(&[&img], "sum pmem0 1M 128K; sum pmem0 0 64K; exit 0");
    assert_eq!(sum(&out, "pmem0 1M 128K"), probe_checksum(&[0xab; 128 * K]));
    assert_eq!(sum(&out, "pmem0 0 64K"), probe_checksum(&[0; 64 * K]));
}

#[test]
fn guest_writes_copy_on_write_over_a_snapshot_and_rollback_restores() {
    let dir = tmpdir("snap");
    let img = dir.join("a.pcow");
    let p = img.to_str().unwrap();
    create(&img, "16M", None);
    run(&[&img], "write pmem0 0 256K 0x11; exit 0");
    image(&["snapshot", "create", p, "before"]);
    let out = run(
        &[&img],
        "write pmem0 4K 8K 0x22; sum pmem0 0 256K; write pmem0 1M 4K 0x33; exit 0",
    );
    let mut expect = vec![0x11u8; 256 * K];
    expect[4 * K..12 * K].fill(0x22);
    assert_eq!(sum(&out, "pmem0 0 256K"), probe_checksum(&expect));
    assert_eq!(read(&img, 0, 256 * K), expect);
    assert_eq!(read(&img, 1 << 20, 4 * K), vec![0x33; 4 * K]);
    // Only the two written units were copied into the new epoch: a partial cluster.
    let c = chain(&img);
    let loc = c.lookup(0).expect("cluster 0 held");
    assert_eq!(
        loc.layer,
        c.layer_count() - 1,
        "cluster 0 copied up into the writable epoch"
    );
    let units = (c.cluster_size() / 4096) as u32;
    let valid: Vec<u32> = (0..units).filter(|&u| loc.unit_valid(u)).collect();
    assert_eq!(
        valid,
        vec![1, 2],
        "4 KiB copy-on-write of exactly the written units"
    );
    drop(c);
    check_clean(&img);

    image(&["snapshot", "apply", p, "before"]);
    let out = run(&[&img], "sum pmem0 0 256K; sum pmem0 1M 4K; exit 0");
    assert_eq!(sum(&out, "pmem0 0 256K"), probe_checksum(&[0x11; 256 * K]));
    assert_eq!(sum(&out, "pmem0 1M 4K"), probe_checksum(&[0; 4 * K]));
    check_clean(&img);
}

#[test]
fn guest_writes_over_a_base_image_leave_it_untouched() {
    let (dir, base) = filled_base("base", "128K", "0x44");
    let base_bytes = std::fs::read(&base).unwrap();
    let top = dir.join("top.pcow");
    create(&top, "16M", Some("base.pcow"));
    let out = run(
        &[&top],
        "sum pmem0 0 128K; write pmem0 60K 8K 0x55; sum pmem0 0 128K; exit 0",
    );
    let mut expect = vec![0x44u8; 128 * K];
    expect[60 * K..68 * K].fill(0x55);
    assert_eq!(
        std::fs::read(&base).unwrap(),
        base_bytes,
        "base file changed"
    );
    assert_eq!(read(&top, 0, 128 * K), expect);
    assert_eq!(read(&base, 0, 128 * K), vec![0x44; 128 * K]);
    assert!(
        out.contains(&format!("= {:016x}", probe_checksum(&expect))),
        "guest saw its write: {out}"
    );
    check_clean(&top);
    check_clean(&base);
    // Two regions in one VM: pmem0 and pmem1.
    let other = dir.join("other.pcow");
    create(&other, "8M", None);
    let out = run(
        &[&top, &other],
        "write pmem1 0 4K 0x66; sum pmem1 0 4K; sum pmem0 60K 8K; exit 0",
    );
    assert_eq!(sum(&out, "pmem1 0 4K"), probe_checksum(&[0x66; 4 * K]));
    assert_eq!(sum(&out, "pmem0 60K 8K"), probe_checksum(&[0x55; 8 * K]));
}

#[test]
fn three_vcpus_fault_copy_on_write_and_expansion_concurrently() {
    let dir = tmpdir("smp");
    let img = dir.join("a.pcow");
    let p = img.to_str().unwrap();
    create(&img, "16M", None);
    run(&[&img], "write pmem0 0 512K 0x11; exit 0");
    image(&["snapshot", "create", p, "s"]);
    // `touch` splits the pages between the vCPUs; each stores (index in its slice | 1) into
    // the first byte of every page: copy-ups over the snapshot and expansions after it.
    let out = run_probe(&[
        "--cpus",
        "3",
        "--pmem",
        p,
        "--probe",
        "touch pmem0 0 1M; sum pmem0 0 1M; exit 0",
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let pages = 256usize;
    let per = pages / 3;
    let mut expect = vec![0u8; 1 << 20];
    expect[..512 * K].fill(0x11);
    for j in 0..pages {
        let first = (j / per).min(2) * per;
        expect[j * 4 * K] = ((j - first) | 1) as u8;
    }
    assert_eq!(
        sum(&stdout(&out), "pmem0 0 1M"),
        probe_checksum(&expect),
        "guest view"
    );
    assert!(read(&img, 0, 1 << 20) == expect, "image content");
    let c = chain(&img);
    let cs = c.cluster_size();
    // Exactly one slot per cluster: 8 snapshot clusters + 8 copied up + 8 expanded.
    let top = &c.images()[0];
    let data_slots = (0..top.slot_count())
        .filter(|&s| top.slot(s).kind == pcow::EntryKind::Data)
        .count() as u64;
    assert_eq!(data_slots, 3 * (512 << 10) / cs);
    drop(c);
    check_clean(&img);
}

#[test]
fn writes_to_copied_up_pages_stop_exiting_once_the_slots_are_refreshed() {
    let (dir, base) = filled_base("refresh", "256K", "0x44");
    let top = dir.join("top.pcow");
    create(&top, "16M", Some("base.pcow"));
    // Two passes of 8-byte stores over 64 base pages, with a second vCPU spinning in the
    // guest (every slot refresh must get it out of KVM_RUN and park it).
    let out = run_probe(&[
        "--cpus",
        "2",
        "--json",
        "--pmem",
        top.to_str().unwrap(),
        "--probe",
        "write pmem0 0 256K 0x55; write pmem0 0 256K 0x66; sum pmem0 0 256K; exit 0",
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let pmem = &doc["pmem"][0];
    let slots = &doc["readonly_slots"];
    let exits = pmem["guest_write_exits"].as_u64().unwrap();
    let stale = slots["stale_exits"].as_u64().unwrap();
    // Without refreshes every store exits: 2 passes x 64 pages x 512 stores. With them, a
    // page costs its copy-up exit and 16 stale exits (the vCPU that sees the 16th parks
    // until the slots are refreshed); allow twice that.
    let without = 2 * 64 * 512;
    let bound = 2 * 64 * (1 + 16);
    assert_eq!(pmem["cow_units"].as_u64(), Some(64), "{doc}");
    let refreshes = slots["refreshes"].as_u64().unwrap();
    assert!(refreshes >= 1, "{doc}");
    // One copied-up page changes at most four slots (split: delete 1, add 3; shrink: delete
    // and add 2 each); the other slots stay registered. Allow some slack.
    assert!(
        slots["slot_updates"].as_u64().unwrap() <= 6 * refreshes,
        "each refresh should change only the pieces around the copied-up page: {doc}"
    );
    assert_eq!(slots["pause_timeouts"].as_u64(), Some(0), "{doc}");
    assert_eq!(
        stale,
        pmem["guest_writes_already_writable"].as_u64().unwrap()
    );
    assert!(
        exits <= bound,
        "{exits} write exits (stale: {stale}; more than {bound}) for {without} stores over copied-up pages: {doc}"
    );
    assert!(
        stderr(&out).contains(&format!(
            "sum pmem0 0 256K = {:016x}",
            probe_checksum(&[0x66; 256 * K])
        )),
        "guest view: {}",
        stderr(&out)
    );
    assert_eq!(read(&top, 0, 256 * K), vec![0x66; 256 * K]);
    assert_eq!(read(&base, 0, 256 * K), vec![0x44; 256 * K]);
    check_clean(&top);
    check_clean(&base);
}

/// Unmounts a scratch tmpfs when dropped.
struct Tmpfs(common::TempDir);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. "512K") on a fresh directory.
    fn mount(name: &str, size: &str) -> Tmpfs {
        let dir = tmpdir(name);
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.as_os_str())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs to mount a small tmpfs (root with CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.as_os_str())
            .status();
    }
}

#[test]
fn a_copy_up_that_cannot_be_stored_stops_the_vm_instead_of_dropping_the_write() {
    let (_dir, base) = filled_base("enospc-base", "1M", "0x44");
    let base_bytes = std::fs::read(&base).unwrap();
    // The overlay lives on a filesystem too small for any copied cluster.
    let full = Tmpfs::mount("enospc", "512K");
    let top = full.0.join("top.pcow");
    create(&top, "16M", Some(base.to_str().unwrap()));
    let out = run_probe(&[
        "--pmem",
        top.to_str().unwrap(),
        "--probe",
        "write pmem0 0 64K 0x55; sum pmem0 0 64K; exit 0",
    ]);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the VM must fail, not go on without the write\nstdout: {}\nstderr: {err}",
        stdout(&out)
    );
    assert!(
        err.contains("No space left on device") && err.contains("could not be served"),
        "the error names the cause: {err}"
    );
    assert!(
        !stdout(&out).contains("sum pmem0"),
        "the guest ran past the failed store: {}",
        stdout(&out)
    );
    assert_eq!(
        std::fs::read(&base).unwrap(),
        base_bytes,
        "base file changed"
    );
    check_clean(&top);
}
