//! Two densevm VMs over one pcow base image share its pages in the host page cache: while
//! both VMs run, the PSS of each VMM's mapping of the base file is about half its RSS.
//!
//! Each VM maps its own overlay (backed by the shared base) as `pmem0`, reads the whole
//! base range at page stride, then idles with `sleep` (its vCPU thread asleep on the host)
//! while the test reads `/proc/PID/smaps` of both VMM processes. Also checks that `sleep`
//! idles without burning CPU and that `--timeout` still ends a sleeping VM.

mod common;

use common::{densevm, require_kvm, stderr, stdout};
use densevm_probe::probe_checksum;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Virtual size of the base and the overlays; every byte of the base holds data.
const BASE_SIZE: u64 = 8 * MIB;
/// How long each guest idles after reading; the test kills both VMs well before.
const SLEEP_MS: u64 = 60_000;
/// Bound on each wait of the test (guest start-up and reads, smaps residency).
const WAIT: Duration = Duration::from_secs(90);

/// A scratch directory for this test, removed when it drops (pass or fail).
fn tmpdir(name: &str) -> common::TempDir {
    common::TempDir::new(&format!("share-{name}"))
}

fn image(args: &[&str]) {
    let out = densevm().arg("image").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "densevm image {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The base's data: every 4 KiB page filled with a non-zero byte that depends on its index.
fn base_data() -> Vec<u8> {
    let mut data = vec![0u8; BASE_SIZE as usize];
    for (i, page) in data.chunks_mut(4096).enumerate() {
        page.fill((i % 251 + 1) as u8);
    }
    data
}

/// A running VMM whose console lines arrive on a channel; killed and reaped on drop.
struct Vm {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Vm {
    fn start(args: &[&str]) -> Vm {
        let mut child = densevm()
            .arg("run")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("densevm binary runs");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Vm {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) for a console line starting with `prefix`; returns it.
    fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no `{prefix}` line from VM {} within {WAIT:?}; console so far: {:?}",
                    self.child.id(),
                    self.seen
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "VM {} ended ({:?}) before printing `{prefix}`; console: {:?}",
                    self.child.id(),
                    self.child.wait(),
                    self.seen
                ),
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (RSS, PSS) in KiB summed over `pid`'s mappings of `file`.
fn rss_pss(pid: u32, file: &Path) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/smaps: {e}"));
    let name = file.to_str().unwrap();
    let (mut inside, mut rss, mut pss) = (false, 0, 0);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if !first.ends_with(':') && first.contains('-') {
            // A mapping header: `start-end perms offset dev inode [path]`.
            inside = words.nth(4) == Some(name);
            continue;
        }
        if inside {
            let kib = words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            match first {
                "Rss:" => rss += kib,
                "Pss:" => pss += kib,
                _ => {}
            }
        }
    }
    (rss, pss)
}

/// CPU time (user + system) of `pid` so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the `(comm)`: state is field 3; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Logical clusters the overlay's own (writable) layer holds.
fn overlay_clusters(path: &Path) -> usize {
    let c = pcow::Chain::open(path, pcow::OpenOptions::default()).unwrap();
    let top = c.layer_count() - 1;
    let data_slots = (0..c.images()[0].slot_count())
        .filter(|&s| c.images()[0].slot(s).kind == pcow::EntryKind::Data)
        .count();
    c.layer_clusters(top).len() + data_slots
}

#[test]
fn two_vms_on_one_base_share_its_page_cache_pages() {
    require_kvm();
    let dir = tmpdir("base");
    let raw = dir.join("base.raw");
    let base = dir.join("base.pcow");
    let data = base_data();
    std::fs::write(&raw, &data).unwrap();
    image(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "pcow",
        raw.to_str().unwrap(),
        base.to_str().unwrap(),
    ]);
    std::fs::remove_file(&raw).unwrap();
    let base_bytes = std::fs::read(&base).unwrap();
    let overlays: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("top{i}.pcow"))).collect();
    for top in &overlays {
        image(&["create", top.to_str().unwrap(), "8M", "-b", "base.pcow"]);
        assert_eq!(overlay_clusters(top), 0, "a fresh overlay holds nothing");
    }
    let sizes_before: Vec<u64> = overlays
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();

    let script = format!(
        "read pmem0 0 {}M; sum pmem0 0 64K; sleep {SLEEP_MS}; exit 0",
        BASE_SIZE / MIB
    );
    let mut vms: Vec<Vm> = overlays
        .iter()
        .map(|top| {
            Vm::start(&[
                "--timeout",
                "600",
                "--pmem",
                top.to_str().unwrap(),
                "--probe",
                &script,
            ])
        })
        .collect();
    let expect_sum = format!(
        "sum pmem0 0 64K = {:016x}",
        probe_checksum(&data[..64 * KIB as usize])
    );
    for vm in &mut vms {
        vm.wait_line(&format!("read pmem0 0 {}M", BASE_SIZE / MIB));
        let sum = vm.wait_line("sum pmem0 0 64K");
        assert_eq!(sum, expect_sum, "VM {} sees the base data", vm.pid());
        vm.wait_line(&format!("sleep {SLEEP_MS} ms"));
    }

    // Both guests have read every base page; wait (bounded) until the pages show as resident
    // in both VMMs' mappings of the base file.
    let base_kib = BASE_SIZE / KIB;
    let deadline = Instant::now() + WAIT;
    let figures = loop {
        let figures: Vec<(u64, u64)> = vms.iter().map(|vm| rss_pss(vm.pid(), &base)).collect();
        if figures.iter().all(|&(rss, _)| rss >= base_kib * 9 / 10) {
            break figures;
        }
        assert!(
            Instant::now() < deadline,
            "base mapping not resident in both VMs within {WAIT:?}: (RSS KiB, PSS KiB) = \
             {figures:?}, expected RSS >= {} KiB each",
            base_kib * 9 / 10
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    // Sleeping guests idle on the host: their VMMs use little CPU.
    let cpu0: Vec<Duration> = vms.iter().map(|vm| cpu_time(vm.pid())).collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let wall = t0.elapsed();
    let cpu: Vec<Duration> = vms
        .iter()
        .zip(&cpu0)
        .map(|(vm, c0)| cpu_time(vm.pid()) - *c0)
        .collect();
    for vm in &mut vms {
        assert!(
            vm.child.try_wait().unwrap().is_none(),
            "VM {} ended during its sleep; console: {:?}",
            vm.pid(),
            vm.seen
        );
    }
    drop(vms);

    eprintln!(
        "base mapping (RSS KiB, PSS KiB) per VM: {figures:?}; VMM CPU while sleeping: {cpu:?} \
         in {wall:?}"
    );
    for (i, &(rss, pss)) in figures.iter().enumerate() {
        assert!(
            rss <= base_bytes.len() as u64 / KIB + 64,
            "VM {i}: base RSS {rss} KiB exceeds the base file"
        );
        let ratio = pss as f64 / rss as f64;
        assert!(
            ratio <= 0.6,
            "VM {i}: base PSS {pss} KiB / RSS {rss} KiB = {ratio:.2}: pages not shared"
        );
        assert!(
            ratio >= 0.4,
            "VM {i}: base PSS {pss} KiB / RSS {rss} KiB = {ratio:.2}: more than two sharers?"
        );
    }
    for (i, c) in cpu.iter().enumerate() {
        assert!(
            *c < wall / 4,
            "VM {i}: VMM used {c:?} of CPU in {wall:?} while its guest slept"
        );
    }

    // Reads allocated nothing: the overlays hold no cluster (the files themselves grow by
    // the pre-allocation pool at open), and the base is byte-for-byte unchanged.
    for (top, before) in overlays.iter().zip(&sizes_before) {
        assert_eq!(
            overlay_clusters(top),
            0,
            "{}: guest reads allocated clusters",
            top.display()
        );
        eprintln!(
            "{}: {before} bytes before the run, {} after (pre-allocation pool)",
            top.display(),
            std::fs::metadata(top).unwrap().len()
        );
        common::assert_image_clean(top, "after two VMs were killed while sleeping: ");
    }
    assert!(
        std::fs::read(&base).unwrap() == base_bytes,
        "base file changed"
    );
    common::assert_image_clean(&base, "base after the run: ");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sleep_idles_and_timeout_still_ends_a_sleeping_vm() {
    require_kvm();
    let run = |args: &[&str]| {
        let t0 = Instant::now();
        let out = densevm().arg("run").args(args).output().unwrap();
        (out, t0.elapsed())
    };
    let (out, took) = run(&["--timeout", "60", "--probe", "sleep 350; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    assert!(stdout(&out).contains("sleep 350 ms"), "{}", stdout(&out));
    assert!(took >= Duration::from_millis(350), "slept only {took:?}");

    let (out, took) = run(&["--timeout", "1", "--probe", "sleep 60000; exit 0"]);
    assert_eq!(
        out.status.code(),
        Some(124),
        "--timeout ends a sleeping VM; stderr: {}",
        stderr(&out)
    );
    assert!(
        took < Duration::from_secs(20),
        "a 1 s timeout took {took:?} to end a sleeping VM"
    );
    let bad = densevm()
        .args(["run", "--probe", "sleep 60001"])
        .output()
        .unwrap();
    assert_ne!(bad.status.code(), Some(0));
    assert!(
        stderr(&bad).contains("longer than the 60000 ms"),
        "{}",
        stderr(&bad)
    );
}
