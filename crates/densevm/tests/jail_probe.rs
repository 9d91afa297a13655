//! `densevm run --jail` on /dev/kvm with the probe guest: while the jailed VM sleeps, the
//! test looks at it from the host through /proc/PID/root (only the listed files), its
//! status (unprivileged uid/gid, no capabilities, no new privileges), its namespaces and
//! its cgroup; then the VM must end with the guest's code, its pmem writes in the image,
//! and the cgroup gone. Needs root and /dev/kvm; fails (never skips) without them.

mod common;

use common::{densevm, require_kvm, stderr, stdout, TempDir};
use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A uid and gid of their own (no passwd entry).
const UID: u32 = 64_123;
const GID: u32 = 64_124;

fn require_root() {
    // SAFETY: geteuid has no arguments.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the jail tests need root (namespaces, mounts, device nodes); run them as root"
    );
}

fn chown(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(
        unsafe { libc::chown(c.as_ptr(), UID, GID) },
        0,
        "chown {p:?}"
    );
}

fn image_create(path: &Path, size: &str, backing: Option<&str>) {
    let mut cmd = densevm();
    cmd.args(["image", "create", path.to_str().unwrap(), size]);
    if let Some(b) = backing {
        cmd.args(["-b", b]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "image create: {}", stderr(&out));
}

/// The jailed process: the outer process's only child.
fn jailed_pid(outer: &mut Child) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let path = format!("/proc/{0}/task/{0}/children", outer.id());
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().next() {
            return pid.parse().unwrap();
        }
        if let Some(st) = outer.try_wait().unwrap() {
            panic!("the jailed densevm ended early: {st:?}");
        }
        assert!(Instant::now() < deadline, "no jailed child after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.exists() {
        assert!(
            Instant::now() < deadline,
            "{p:?} did not appear within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every path under `root` (relative, as absolute paths of the jail), not entering /proc.
fn walk(root: &Path, rel: &Path, out: &mut BTreeSet<PathBuf>) {
    for e in std::fs::read_dir(root.join(rel.strip_prefix("/").unwrap())).unwrap() {
        let e = e.unwrap();
        let p = rel.join(e.file_name());
        out.insert(p.clone());
        if p != Path::new("/proc") && e.file_type().unwrap().is_dir() {
            walk(root, &p, out);
        }
    }
}

fn with_ancestors(paths: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut set = BTreeSet::new();
    for p in paths {
        for a in p.ancestors() {
            if a != Path::new("/") {
                set.insert(a.to_path_buf());
            }
        }
    }
    set
}

fn status_field(pid: u32, name: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn jail_args(root: &Path, id: &str) -> Vec<String> {
    [
        "--jail",
        root.to_str().unwrap(),
        "--uid",
        &UID.to_string(),
        "--gid",
        &GID.to_string(),
        "--jail-id",
        id,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The cgroup directories `pid` is in (v1 memory/cpu/pids, or v2).
fn cgroup_dirs(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let mut dirs = Vec::new();
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let ctrl = ctrls
            .split(',')
            .find(|c| ["memory", "cpu", "pids"].contains(c));
        match (v2, ctrl) {
            (true, _) if ctrls.is_empty() => {
                dirs.push(Path::new("/sys/fs/cgroup").join(&path[1..]))
            }
            (false, Some(c)) => dirs.push(Path::new("/sys/fs/cgroup").join(c).join(&path[1..])),
            _ => {}
        }
    }
    dirs
}

#[test]
fn jailed_probe_vm_reaches_only_its_files_as_an_unprivileged_uid() {
    require_kvm();
    require_root();
    let t = TempDir::new("jail-probe");
    let root = t.0.join("root");
    let api = t.0.join("api");
    let imgs = t.0.join("img");
    for d in [&root, &api, &imgs] {
        std::fs::create_dir_all(d).unwrap();
    }
    chown(&api);
    let base = imgs.join("base.pcow");
    let top = imgs.join("top.pcow");
    image_create(&base, "16M", None);
    image_create(&top, "16M", Some("base.pcow"));
    chown(&top);
    let id = format!("jt-{}", std::process::id());
    let sock = api.join("vm.sock");
    let console_sock = api.join("console.sock");
    let mut args: Vec<String> = [
        "run",
        "--timeout",
        "120",
        "--json",
        "--merge",
        "all",
        "--probe",
        "write pmem0 0 64K 0xab; sum pmem0 0 64K; sleep 3000; exit 7",
        "--pmem",
        top.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
        "--console-sock",
        console_sock.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(jail_args(&root, &id));

    // The list the jail promises.
    let list = densevm().args(&args).arg("--jail-list").output().unwrap();
    assert!(list.status.success(), "--jail-list: {}", stderr(&list));
    let listed: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let listed: BTreeSet<PathBuf> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| PathBuf::from(e["path"].as_str().unwrap()))
        .collect();

    let mut outer = densevm()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = jailed_pid(&mut outer);
    wait_for(&sock);

    // From the host: exactly the listed files, plus what the bound directory holds.
    let mut found = BTreeSet::new();
    walk(
        Path::new(&format!("/proc/{pid}/root")),
        Path::new("/"),
        &mut found,
    );
    wait_for(&console_sock);
    let mut expected = listed.clone();
    expected.insert(sock.clone());
    expected.insert(console_sock.clone());
    assert_eq!(found, expected, "the jail's files differ from --jail-list");
    // And, independently of --jail-list: the devices, /proc, the images, the socket's
    // directory, and the binary with its ELF interpreter and libraries (for clones).
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_densevm"));
    let mut own: Vec<PathBuf> = ["/dev/kvm", "/dev/userfaultfd", "/dev/null", "/proc"]
        .iter()
        .map(PathBuf::from)
        .collect();
    own.extend([
        top.clone(),
        base.clone(),
        sock.clone(),
        console_sock.clone(),
        exe.clone(),
    ]);
    let own = with_ancestors(&own);
    for p in &found {
        let lib = p.to_str().unwrap().contains(".so") || p.starts_with("/lib64");
        let lib_dir = found
            .iter()
            .any(|q| q.starts_with(p) && q.to_str().unwrap().contains(".so"));
        assert!(
            own.contains(p) || lib || lib_dir,
            "{p:?} is in the jail but the VM does not need it"
        );
    }
    for p in &own {
        assert!(found.contains(p), "{p:?} is missing from the jail");
    }
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let opts = |p: &Path| {
        mounts
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
            .unwrap_or_else(|| panic!("{p:?} not mounted: {mounts}"))
            .split(' ')
            .nth(5)
            .unwrap()
            .to_string()
    };
    assert!(
        opts(&base).starts_with("ro,"),
        "base image: {}",
        opts(&base)
    );
    assert!(opts(&top).starts_with("rw,"), "top image: {}", opts(&top));
    assert!(
        opts(Path::new("/")).starts_with("ro,"),
        "the jail's own tmpfs"
    );

    // Unprivileged, without capabilities or a way to get new ones.
    assert_eq!(status_field(pid, "Uid"), format!("{UID} {UID} {UID} {UID}"));
    assert_eq!(status_field(pid, "Gid"), format!("{GID} {GID} {GID} {GID}"));
    assert_eq!(status_field(pid, "Groups"), "");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, cap), "0000000000000000", "{cap}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "NSpid"), format!("{pid} 1"));

    // Its own namespaces (the user namespace is the host's: no user namespace is used).
    let ns = |p: &str, n: &str| std::fs::read_link(format!("/proc/{p}/ns/{n}")).unwrap();
    for n in ["mnt", "pid", "ipc", "net"] {
        assert_ne!(ns(&pid.to_string(), n), ns("self", n), "{n} namespace");
    }
    assert_eq!(ns(&pid.to_string(), "user"), ns("self", "user"));

    // Its own cgroup densevm/ID in every hierarchy.
    let cgs = cgroup_dirs(pid);
    assert!(!cgs.is_empty());
    for d in &cgs {
        assert!(d.ends_with(format!("densevm/{id}")), "{d:?}");
        assert!(d.is_dir(), "{d:?}");
    }

    // The API answers from the host through the bound directory.
    let info = densevm()
        .args(["vm", "info", "--api-sock", sock.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(info.status.success(), "vm info: {}", stderr(&info));
    assert!(
        stdout(&info).contains(&format!("densevm-{}", outer.id())),
        "{}",
        stdout(&info)
    );

    let out = outer.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["exit_code"], 7);
    let sum = stderr(&out)
        .lines()
        .find(|l| l.starts_with("sum pmem0"))
        .unwrap_or_else(|| panic!("no sum line: {}", stderr(&out)))
        .to_string();
    for d in &cgs {
        assert!(!d.exists(), "{d:?} is left after the VM ended");
    }
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        0,
        "DIR on the host"
    );
    // The guest's writes are in the image (read back without a jail).
    let again = common::run_probe(&[
        "--pmem",
        top.to_str().unwrap(),
        "--probe",
        "sum pmem0 0 64K; exit 0",
    ]);
    assert!(stdout(&again).contains(&sum), "{} vs {sum}", stdout(&again));
}

#[test]
fn sigterm_to_the_outer_process_ends_the_jailed_vm() {
    require_kvm();
    require_root();
    let t = TempDir::new("jail-term");
    let root = t.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let id = format!("jterm-{}", std::process::id());
    let mut outer = densevm()
        .args(["run", "--timeout", "120", "--probe", "sleep 60000; exit 0"])
        .args(jail_args(&root, &id))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = jailed_pid(&mut outer);
    // The outer process moves the child into its cgroup right after the fork.
    let deadline = Instant::now() + Duration::from_secs(10);
    let cgs = loop {
        let cgs = cgroup_dirs(pid);
        if !cgs.is_empty() && cgs.iter().all(|d| d.ends_with(format!("densevm/{id}"))) {
            break cgs;
        }
        assert!(Instant::now() < deadline, "not in densevm/{id}: {cgs:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill of our own child.
    unsafe { libc::kill(outer.id() as i32, libc::SIGTERM) };
    let started = Instant::now();
    let st = outer.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the jailed VM lives on"
    );
    for d in &cgs {
        assert!(d.ends_with(format!("densevm/{id}")), "{d:?}");
        assert!(!d.exists(), "{d:?} is left");
    }
}

fn run_err(args: &[&str]) -> String {
    let out = densevm().arg("run").args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
    stderr(&out)
}

#[test]
fn jail_flag_errors_say_what_to_do() {
    require_root();
    let e = run_err(&["--probe", "--uid", "64123"]);
    assert!(
        e.contains("--uid only applies to a jailed launch: add --jail DIR"),
        "{e}"
    );
    let e = run_err(&[
        "--probe",
        "--jail",
        "/nonexistent-densevm-jail",
        "--uid",
        "64123",
        "--gid",
        "64123",
    ]);
    assert!(
        e.contains("create it first (mkdir -p /nonexistent-densevm-jail)"),
        "{e}"
    );
    let e = run_err(&[
        "--probe", "--jail", "rel", "--uid", "64123", "--gid", "64123",
    ]);
    assert!(e.contains("give an absolute path"), "{e}");
    let e = run_err(&["--probe", "--jail", "/tmp", "--uid", "0", "--gid", "64123"]);
    assert!(e.contains("would keep root"), "{e}");
    let e = run_err(&["--probe", "--jail", "/tmp", "--uid", "64123"]);
    assert!(e.contains("--jail needs --uid N and --gid N"), "{e}");
    let t = TempDir::new("jail-err");
    let root = t.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let e = run_err(&[
        "--probe",
        "--pmem",
        "/nonexistent-densevm.pcow",
        "--jail",
        root.to_str().unwrap(),
        "--uid",
        "64123",
        "--gid",
        "64123",
    ]);
    assert!(e.contains("/nonexistent-densevm.pcow"), "{e}");
}

#[test]
fn a_jailed_vm_snapshots_into_its_bound_directory_and_restores_jailed() {
    require_kvm();
    require_root();
    let t = TempDir::new("jail-snap");
    let root = t.0.join("root");
    let api = t.0.join("api");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&api).unwrap();
    chown(&api);
    let sock = api.join("vm.sock");
    let snap = api.join("snap");
    let outer = densevm()
        .args([
            "run",
            "--timeout",
            "120",
            "--api-sock",
            sock.to_str().unwrap(),
        ])
        .args([
            "--probe",
            "write ram 0 1M 0x5a; sleep 2000; sum ram 0 1M; exit 5",
        ])
        .args(jail_args(&root, &format!("js-{}", std::process::id())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&sock);
    // The directory is a path inside the jail (the same path: the socket's directory).
    let out = densevm()
        .args(["vm", "snapshot", "--api-sock", sock.to_str().unwrap()])
        .args(["--dir", snap.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "snapshot: {}", stderr(&out));
    let first = outer.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(5), "{}", stderr(&first));
    let sum = |o: &std::process::Output| {
        stdout(o)
            .lines()
            .find(|l| l.starts_with("sum ram"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no sum: {}{}", stdout(o), stderr(o)))
    };
    let restored = densevm()
        .args([
            "run",
            "--timeout",
            "120",
            "--restore",
            snap.to_str().unwrap(),
        ])
        .args(jail_args(&root, &format!("jr-{}", std::process::id())))
        .output()
        .unwrap();
    assert_eq!(restored.status.code(), Some(5), "{}", stderr(&restored));
    assert_eq!(sum(&restored), sum(&first));
}
