//! Pause, snapshot, restore and clones of a running probe guest on /dev/kvm, through the
//! API socket and the `densevm vm` verbs (issue #11).

mod common;

use common::{densevm, require_kvm, stderr, stdout, vm, wait_for, wait_for_line, TempDir};
use densevm_probe::probe_checksum;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

/// Starts a probe VM with an API socket, its console in `console`.
fn start(dir: &Path, script: &str, console: &Path) -> (Child, PathBuf) {
    require_kvm();
    let sock = dir.join("api.sock");
    let out = std::fs::File::create(console).unwrap();
    let child = densevm()
        .args([
            "run",
            "--memory",
            "64M",
            "--timeout",
            "600",
            "--probe",
            script,
        ])
        .arg("--api-sock")
        .arg(&sock)
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, sock)
}

fn sum_line(offset: &str, len: &str, byte: u8, bytes: usize) -> String {
    format!(
        "sum ram {offset} {len} = {:016x}",
        probe_checksum(&vec![byte; bytes])
    )
}

fn file_hash(path: &Path) -> u64 {
    probe_checksum(&std::fs::read(path).unwrap())
}

/// A probe paused in the middle of its `sleep`, snapshotted, resumed; then restored
/// twice from the snapshot: the parent and both restored VMs finish the script (their
/// sums prove the memory written before the snapshot came back), the restored VMs do not
/// run the commands from before the snapshot again, and the memory file is unchanged.
#[test]
fn a_paused_probe_snapshot_restores_twice_and_continues_its_script() {
    let tmp = TempDir::new("snap-probe");
    let console = tmp.0.join("parent.console");
    let script = "write ram 8M 1M 0x11; sleep 1500; sum ram 8M 1M; write ram 9M 1M 0x22; sum ram 9M 1M; exit 7";
    let (mut parent, sock) = start(&tmp.0, script, &console);
    wait_for(&console, "sleep 1500 ms");
    vm(&["pause"], &sock);
    let info = vm(&["info", "--json"], &sock);
    assert!(info.contains("\"Paused\""), "{info}");
    let snap = tmp.0.join("snap");
    vm(&["snapshot", "--dir", snap.to_str().unwrap()], &sock);
    // A second snapshot into the same directory is refused (it is not empty).
    let again = densevm()
        .args([
            "vm",
            "snapshot",
            "--dir",
            snap.to_str().unwrap(),
            "--api-sock",
        ])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(stderr(&again).contains("not empty"), "{}", stderr(&again));
    vm(&["resume"], &sock);
    let status = parent.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(7),
        "parent: {}",
        std::fs::read_to_string(&console).unwrap()
    );
    let parent_out = std::fs::read_to_string(&console).unwrap();
    let first = sum_line("8M", "1M", 0x11, 1 << 20);
    let second = sum_line("9M", "1M", 0x22, 1 << 20);
    assert!(
        parent_out.contains(&first) && parent_out.contains(&second),
        "{parent_out}"
    );

    let before = file_hash(&snap.join("memory"));
    // Each restore also writes its report (`--report-json`, which a restore ignored until
    // 2026-12-06).
    let reports: Vec<_> = (0..2)
        .map(|i| snap.with_file_name(format!("restore-{i}.json")))
        .collect();
    let restored: Vec<Child> = reports
        .iter()
        .map(|report| {
            densevm()
                .args(["run", "--timeout", "60", "--restore"])
                .arg(&snap)
                .arg("--report-json")
                .arg(report)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in restored {
        let out = child.wait_with_output().unwrap();
        let text = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(7),
            "restored: {text}{}",
            stderr(&out)
        );
        assert!(
            text.contains(&first) && text.contains(&second),
            "restored: {text}"
        );
        assert!(
            !text.contains("write ram 8M"),
            "the restored VM ran the script from its start: {text}"
        );
    }
    for report in &reports {
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
        assert_eq!(doc["exit_code"], 7, "{doc}");
        assert_eq!(doc["restored_from"], snap.display().to_string(), "{doc}");
        for point in [
            "state_read",
            "memory_mapped",
            "vm_ready",
            "vcpu0_first_entry",
        ] {
            assert!(doc["trace_ms"][point].as_f64().is_some(), "{point}: {doc}");
        }
        assert!(doc["uss_kib"].as_u64().is_some_and(|k| k > 0), "{doc}");
    }
    // Two more from the snapshot with the CLI verb (detached processes, consoles in the
    // snapshot directory).
    let out = densevm()
        .args(["vm", "clone-from", "--count", "2", "--json", "--snapshot"])
        .arg(&snap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "clone-from: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let clones = doc["clones"].as_array().unwrap();
    assert_eq!(clones.len(), 2, "{doc}");
    for c in clones {
        let console = PathBuf::from(c["console"].as_str().unwrap());
        wait_for(&console, &second);
        let text = std::fs::read_to_string(&console).unwrap();
        assert!(text.contains(&first), "clone-from: {text}");
        assert!(
            !text.contains("write ram 8M"),
            "clone-from reran the script: {text}"
        );
    }
    assert_eq!(
        file_hash(&snap.join("memory")),
        before,
        "restoring changed the memory file"
    );
}

/// A VM restored from a snapshot on tmpfs writes 16 MiB where its snapshot had nothing (a
/// hole in the memory file): the memory file does not grow, since the writes land in
/// anonymous memory mapped over the holes, not in the file and then in a private copy
/// (crate::snapshot::holes in densevm-vmm); the guest reads back what it wrote.
#[test]
fn a_restored_vm_writing_into_holes_does_not_grow_the_memory_file() {
    require_kvm();
    use std::os::unix::fs::MetadataExt;
    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "this test needs a tmpfs at /dev/shm (a shmem memory file, where a private fault \
         would fill holes)"
    );
    let tmp = TempDir(shm.join(format!("densevm-holes-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let console = tmp.0.join("parent.console");
    let script =
        "write ram 1M 1M 0x11; sleep 1500; write ram 32M 16M 0x22; sum ram 32M 16M; exit 5";
    let (mut parent, sock) = start(&tmp.0, script, &console);
    wait_for(&console, "sleep 1500 ms");
    vm(&["pause"], &sock);
    let snap = tmp.0.join("snap");
    vm(&["snapshot", "--dir", snap.to_str().unwrap()], &sock);
    parent.kill().unwrap();
    parent.wait().unwrap();
    let memory = snap.join("memory");
    let before = std::fs::metadata(&memory).unwrap().blocks() * 512;
    let out = densevm()
        .args(["run", "--timeout", "600", "--restore"])
        .arg(&snap)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(5),
        "restored: {text}{}",
        stderr(&out)
    );
    let sum = sum_line("32M", "16M", 0x22, 16 << 20);
    assert!(text.contains(&sum), "restored: {text}");
    let after = std::fs::metadata(&memory).unwrap().blocks() * 512;
    assert!(
        after < before + (1 << 20),
        "the memory file grew from {before} to {after} bytes while the restored VM wrote \
         16 MiB into its holes"
    );
}

/// Clones of a running probe (POST /clones): each clone finishes the script with the
/// parent's memory, the parent keeps running, and the pages nobody wrote after the
/// freeze exist once: a clone's guest-RAM PSS is well below its RSS. After the shared
/// 16 MiB are summed, every VM fills 1 MiB inside them with its own byte (`fill-id`):
/// each VM's checksum shows its own byte only, so no VM sees another's writes.
#[test]
fn clones_of_a_running_probe_share_unwritten_memory() {
    let tmp = TempDir::new("clone-probe");
    let console = tmp.0.join("parent.console");
    let script = "write ram 8M 16M 0x33; sleep 2000; sum ram 8M 16M; \
                  fill-id ram 9M 1M; sum ram 9M 1M; sleep 3000; exit 3";
    let (mut parent, sock) = start(&tmp.0, script, &console);
    wait_for(&console, "sleep 2000 ms");
    let tpl = tmp.0.join("tpl");
    let out = vm(
        &[
            "clone",
            "--count",
            "2",
            "--json",
            "--dir",
            tpl.to_str().unwrap(),
        ],
        &sock,
    );
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let clones = doc["clones"].as_array().unwrap();
    assert_eq!(clones.len(), 2, "{out}");
    // The clones ran before the answer came (the parent froze its RAM after they started).
    let (running, total) = (doc["running_ms"].as_f64(), doc["ms"].as_f64());
    assert!(
        matches!((running, total), (Some(r), Some(t)) if r > 0.0 && r <= t),
        "running_ms within ms: {out}"
    );
    // Every VM sums the shared 16 MiB before it writes into them: the same sum in all.
    let expect = sum_line("8M", "16M", 0x33, 16 << 20);
    // (name, console, the byte its `fill-id` writes). The instance number the probe reads
    // from port 0x505 comes from `densevm run --clone-index`: clone K (its `index` in the
    // clone list) runs with instance K + 1, so it fills with K + 2; the parent keeps
    // instance 0 and fills with 0x01.
    let mut vms = vec![("parent".to_string(), console.clone(), 0x01u8)];
    for c in clones {
        let index = c["index"].as_u64().unwrap();
        let instance = index + 1;
        vms.push((
            format!("clone {index} (instance {instance})"),
            PathBuf::from(c["console"].as_str().unwrap()),
            (instance + 1) as u8,
        ));
    }
    // Once every clone has read the 16 MiB and filled its own 1 MiB (its sums are
    // printed; it sleeps again), each maps the rest from the template: three processes
    // (parent too) share each of those pages. The parent's console is checked once it
    // has exited.
    let own_sum = |name: &str, console: &Path, byte: u8| -> String {
        let text = std::fs::read_to_string(console).unwrap();
        assert!(text.contains(&expect), "{name}: {text}");
        let own = sum_line("9M", "1M", byte, 1 << 20);
        assert!(
            text.contains(&format!("fill-id ram 9M 1M 0x{byte:02x}: ")) && text.contains(&own),
            "{name} did not write its own byte {byte:#04x} (expected `{own}`; does \
             `densevm run --clone-index K` give the debug port instance K + 1?):\n{text}"
        );
        own
    };
    let mut own_sums = Vec::new();
    for (name, console, byte) in &vms[1..] {
        wait_for_line(console, "sum ram 9M 1M = ");
        own_sums.push(own_sum(name, console, *byte));
    }
    let mut ratios = Vec::new();
    for c in clones {
        let pid = c["pid"].as_u64().unwrap();
        let (rss, pss) = ram_rss_pss(pid);
        assert!(
            rss >= 16 << 10,
            "clone {pid}: guest RAM RSS {rss} KiB, expected the 16 MiB it read"
        );
        ratios.push(pss as f64 / rss as f64);
    }
    for ratio in &ratios {
        assert!(*ratio < 0.6, "guest RAM PSS/RSS of the clones: {ratios:?}");
    }
    // The clones were started by the parent's clone launcher (forked before the filters,
    // so no VMM thread can exec): each is the launcher's child and runs under its own
    // control thread's seccomp program only, none inherited from the parent's.
    let parent_pid = parent.id().to_string();
    for c in clones {
        let pid = c["pid"].as_u64().unwrap();
        let launcher = status_field(pid, "PPid");
        assert_eq!(
            status_field_of(&launcher, "PPid"),
            parent_pid,
            "clone {pid}'s parent"
        );
        assert_eq!(
            std::fs::read_to_string(format!("/proc/{launcher}/comm"))
                .unwrap()
                .trim(),
            "densevm-launch"
        );
        assert_eq!(status_field_of(&launcher, "Seccomp_filters"), "0");
        assert_eq!(status_field(pid, "Seccomp_filters"), "1", "clone {pid}");
    }
    assert_eq!(status_field_of(&parent_pid, "Seccomp_filters"), "1");
    // A clone kicks its own vCPUs to pause them (the lab's pmem clones, when they still ran
    // under their parent's filter too, died of SIGSYS: its `tgkill` named the parent's pid).
    for c in clones {
        let api = PathBuf::from(c["api_sock"].as_str().unwrap());
        vm(&["pause"], &api);
        vm(&["resume"], &api);
        let info = vm(&["info", "--json"], &api);
        assert!(
            info.contains("Running"),
            "clone after pause and resume: {info}"
        );
    }
    assert_eq!(parent.wait().unwrap().code(), Some(3));
    let (name, console, byte) = &vms[0];
    own_sums.push(own_sum(name, console, *byte));
    for (i, sum) in own_sums.iter().enumerate() {
        assert!(!own_sums[..i].contains(sum), "equal sums: {own_sums:?}");
    }
}

/// A field of /proc/PID/status.
/// The inode of the RAM file (`memfd:densevm-ram`) process `pid` maps: the template it
/// was cloned from.
fn ram_file_inode(pid: u64) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find(|l| l.contains("memfd:densevm-ram"))
        .and_then(|l| l.split_whitespace().nth(4))
        .unwrap_or_else(|| panic!("process {pid} maps no RAM file:\n{maps}"))
        .to_string()
}

/// Cloning the same parent again, under the control thread's seccomp filter: while it
/// wrote nothing since the last clone, the new clone maps the same template (the page
/// scan found no page of the parent's own); after it wrote, a new template with its
/// current memory. Every VM finishes the script with the same memory.
#[test]
fn a_parent_cloned_again_reuses_its_template_until_it_writes() {
    let tmp = TempDir::new("clone-again");
    let console = tmp.0.join("parent.console");
    let script = "write ram 8M 4M 0x33; sleep 2000; write ram 12M 1M 0x44; sleep 2500; \
                  sum ram 8M 4M; sum ram 12M 1M; exit 3";
    let (mut parent, sock) = start(&tmp.0, script, &console);
    let clone = |name: &str| -> (u64, PathBuf) {
        let dir = tmp.0.join(name);
        let out = vm(
            &[
                "clone",
                "--count",
                "1",
                "--json",
                "--dir",
                dir.to_str().unwrap(),
            ],
            &sock,
        );
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        let c = &doc["clones"][0];
        let pid = c["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("clone {name}: {out}"));
        (pid, PathBuf::from(c["console"].as_str().unwrap()))
    };
    wait_for(&console, "sleep 2000 ms");
    let (a, a_console) = clone("a");
    let (b, b_console) = clone("b");
    let (a_ram, b_ram) = (ram_file_inode(a), ram_file_inode(b));
    assert_eq!(
        a_ram, b_ram,
        "an unchanged parent's second clone got a new template"
    );
    wait_for(&console, "sleep 2500 ms");
    let (c, c_console) = clone("c");
    let c_ram = ram_file_inode(c);
    assert_ne!(
        c_ram, a_ram,
        "a parent that wrote was cloned from its old template"
    );
    let sums = [
        sum_line("8M", "4M", 0x33, 4 << 20),
        sum_line("12M", "1M", 0x44, 1 << 20),
    ];
    assert_eq!(parent.wait().unwrap().code(), Some(3));
    for (name, path) in [
        ("parent", &console),
        ("clone a", &a_console),
        ("clone b", &b_console),
        ("clone c", &c_console),
    ] {
        wait_for_line(path, "sum ram 12M 1M = ");
        let text = std::fs::read_to_string(path).unwrap();
        for sum in &sums {
            assert!(text.contains(sum), "{name}: no `{sum}` in\n{text}");
        }
    }
}

fn status_field(pid: u64, name: &str) -> String {
    status_field_of(&pid.to_string(), name)
}

fn status_field_of(pid: &str, name: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// RSS and PSS (KiB) of the clone's guest-RAM mapping (the RAM file, mapped private).
fn ram_rss_pss(pid: u64) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut rss, mut pss, mut inside) = (0, 0, false);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = line.contains("/memory") || line.contains("memfd:densevm-ram");
            continue;
        }
        let value = || {
            line.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if inside && line.starts_with("Rss:") {
            rss += value();
        }
        if inside && line.starts_with("Pss:") {
            pss += value();
        }
    }
    (rss, pss)
}

/// Writes a state file with `payload` in the container (for the refusal tests).
fn write_container(path: &Path, version: u32, payload: &[u8]) {
    let mut data = Vec::new();
    data.extend_from_slice(b"DENSEVM-SNAPSHOT");
    data.extend_from_slice(&version.to_le_bytes());
    data.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    data.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    data.extend_from_slice(payload);
    std::fs::write(path, data).unwrap();
}

/// Corrupt, truncated, wrong-version and foreign-CPU snapshots, and a truncated memory
/// file, are refused with a message naming the problem.
#[test]
fn damaged_snapshots_are_refused_with_a_clear_error() {
    let tmp = TempDir::new("snap-refuse");
    let console = tmp.0.join("parent.console");
    let (mut parent, sock) = start(
        &tmp.0,
        "write ram 8M 64K 0x5a; sleep 1000; exit 0",
        &console,
    );
    wait_for(&console, "sleep 1000 ms");
    let snap = tmp.0.join("good");
    vm(&["snapshot", "--dir", snap.to_str().unwrap()], &sock);
    assert_eq!(parent.wait().unwrap().code(), Some(0));
    let state = std::fs::read(snap.join("state")).unwrap();
    let payload = &state[32..];

    let variant = |name: &str, make: &dyn Fn(&Path)| -> String {
        let dir = tmp.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(snap.join("memory"), dir.join("memory")).unwrap();
        std::fs::write(dir.join("state"), &state).unwrap();
        make(&dir);
        let out = densevm()
            .args(["run", "--timeout", "20", "--restore"])
            .arg(&dir)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        stderr(&out).to_lowercase()
    };
    let corrupt = variant("corrupt", &|d| {
        let mut s = state.clone();
        let last = s.len() - 10;
        s[last] ^= 0x40;
        std::fs::write(d.join("state"), s).unwrap();
    });
    assert!(
        corrupt.contains("corrupt") || corrupt.contains("checksum"),
        "{corrupt}"
    );
    let truncated = variant("truncated", &|d| {
        std::fs::write(d.join("state"), &state[..state.len() / 2]).unwrap();
    });
    assert!(truncated.contains("truncated"), "{truncated}");
    let version = variant("version", &|d| {
        write_container(&d.join("state"), 99, payload)
    });
    assert!(version.contains("version"), "{version}");
    let foreign = variant("foreign", &|d| {
        let mut doc: serde_json::Value = serde_json::from_slice(payload).unwrap();
        doc["host_cpu"]["model"] =
            serde_json::json!(doc["host_cpu"]["model"].as_u64().unwrap() + 1);
        write_container(&d.join("state"), 1, &serde_json::to_vec(&doc).unwrap());
    });
    assert!(foreign.contains("cpu"), "{foreign}");
    let short_memory = variant("short-memory", &|d| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.join("memory"))
            .unwrap();
        f.set_len(4096).unwrap();
    });
    assert!(short_memory.contains("truncated"), "{short_memory}");
    let not_snapshot = variant("not-a-snapshot", &|d| {
        std::fs::write(
            d.join("state"),
            b"hello, this is not a snapshot at all.............",
        )
        .unwrap();
    });
    assert!(
        not_snapshot.contains("not a densevm snapshot") || not_snapshot.contains("magic"),
        "{not_snapshot}"
    );
}
