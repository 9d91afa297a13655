//! The system calls of a jailed launch. [`launch`] must run while the process is
//! single-threaded (`unshare(CLONE_NEWNS)` fails in a multi-threaded process, and the
//! forked child goes on running Rust code). Order:
//!
//! 1. outer process (root): checks (root, DIR, every source, host device nodes), opens the
//!    named network namespace, creates the cgroup, blocks SIGTERM/SIGINT/SIGHUP/SIGQUIT/
//!    SIGCHLD, `unshare(CLONE_NEWPID)` and forks;
//! 2. outer: moves the child into the cgroup, lets it go, waits for it (forwarding a
//!    signal as SIGKILL), removes the cgroup and exits with the child's code or signal;
//! 3. child (PID 1 of the new PID namespace): parent-death signal, `setns`/`unshare`
//!    network, `unshare(CLONE_NEWNS | CLONE_NEWIPC)`, every mount private, a tmpfs at DIR,
//!    the bind mounts, device nodes, `/proc`, the taps' sysfs directories, `pivot_root`,
//!    the old root detached, the tmpfs made read-only;
//! 4. child: privileges dropped (bounding and ambient capabilities, groups, gid, uid, no
//!    new privileges), then it returns [`Launched::Jailed`] and the caller builds the VM.

use crate::cgroup::JailCgroup;
use crate::plan::{BindKind, Netns, Plan};
use crate::{JailError, Result};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Which side of the fork returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Launched {
    /// This is the jailed process: namespaces entered, root pivoted, privileges dropped.
    /// Build and run the VM.
    Jailed,
    /// This is the outer process; the jailed VM exited with this code. (When it was
    /// killed by a signal, or the outer process was asked to stop, the outer process kills
    /// itself with the same signal and never returns.)
    Exited(i32),
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| JailError::Invalid(format!("{}: NUL in a path", p.display())))
}

fn check(r: libc::c_int, what: impl FnOnce() -> String) -> Result<()> {
    if r < 0 {
        Err(JailError::sys(what()))
    } else {
        Ok(())
    }
}

/// `path` inside the jail root `root`.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<()> {
    let src_c = src.map(cstr).transpose()?;
    let target_c = cstr(target)?;
    let fstype_c = fstype.map(|f| CString::new(f).expect("no NUL"));
    let data_c = data.map(|d| CString::new(d).expect("no NUL"));
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is a NUL-terminated string that outlives the call, or null
    // where mount(2) accepts null.
    let r = unsafe {
        libc::mount(
            ptr(&src_c),
            target_c.as_ptr(),
            ptr(&fstype_c),
            flags,
            ptr(&data_c).cast(),
        )
    };
    check(r, || {
        format!(
            "mount {} on {} ({})",
            src.map_or("-".into(), |s| s.display().to_string()),
            target.display(),
            fstype.unwrap_or("bind/remount")
        )
    })
}

/// What the outer process prepares before forking.
struct Prepared {
    devices: Vec<(crate::plan::Device, libc::dev_t)>,
    netns: Option<OwnedFd>,
}

fn prepare(plan: &Plan) -> Result<Prepared> {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(JailError::Invalid(
            "--jail needs root: densevm creates the jail's namespaces, mounts and device nodes \
             as root, then drops to --uid/--gid before the guest runs (run it with sudo)"
                .into(),
        ));
    }
    let root = &plan.spec.root;
    match fs::metadata(root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(JailError::Invalid(format!(
                "--jail {}: not a directory",
                root.display()
            )))
        }
        Err(e) => {
            return Err(JailError::Invalid(format!(
                "--jail {}: {e}; create it first (mkdir -p {}): it stays empty on the host, \
                 the jail mounts a tmpfs over it in its own mount namespace",
                root.display(),
                root.display()
            )))
        }
    }
    for b in &plan.binds {
        let m = fs::metadata(&b.path)
            .map_err(|e| JailError::Invalid(format!("{} ({}): {e}", b.path.display(), b.why)))?;
        if (b.kind == BindKind::Dir) != m.is_dir() {
            return Err(JailError::Invalid(format!(
                "{} ({}): expected a {}",
                b.path.display(),
                b.why,
                if b.kind == BindKind::Dir {
                    "directory"
                } else {
                    "file"
                }
            )));
        }
    }
    let mut devices = Vec::new();
    for d in &plan.devices {
        let m = fs::metadata(d.path()).map_err(|e| {
            JailError::Invalid(format!(
                "{}: {e}; the jail copies this device node from the host",
                d.path()
            ))
        })?;
        if !m.file_type().is_char_device() {
            return Err(JailError::Invalid(format!(
                "{} is not a character device",
                d.path()
            )));
        }
        devices.push((*d, m.rdev() as libc::dev_t));
    }
    let netns = match &plan.spec.netns {
        Netns::Join(p) => Some(OwnedFd::from(File::open(p).map_err(|e| {
            JailError::Invalid(format!(
                "--netns {}: {e} (create it with `ip netns add NAME`)",
                p.display()
            ))
        })?)),
        _ => None,
    };
    Ok(Prepared { devices, netns })
}

fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
    }
    set
}

const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Forks into the jail described by `plan`. Returns [`Launched::Jailed`] in the jailed
/// process and [`Launched::Exited`] in the outer one once the VM has ended. Errors before
/// the fork are returned in the outer process; an error while building the jail is printed
/// by the child, which exits 1 (and so does the outer process).
pub fn launch(plan: &Plan) -> Result<Launched> {
    let prep = prepare(plan)?;
    let own = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| JailError::io("cannot read /proc/self/cgroup", e))?;
    let cgroup = JailCgroup::locate(Path::new("/sys/fs/cgroup"), &own, &plan.spec.id)?;
    cgroup.create()?;
    let result = fork_jail(plan, prep, &cgroup);
    if result.is_err() {
        cgroup.remove();
    }
    result
}

fn fork_jail(plan: &Plan, prep: Prepared, cgroup: &JailCgroup) -> Result<Launched> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    check(
        unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) },
        || "pipe2".into(),
    )?;
    // SAFETY: pipe2 succeeded, so both are open descriptors this process now owns.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut all = FORWARDED.to_vec();
    all.push(libc::SIGCHLD);
    let set = signal_set(&all);
    // SAFETY: sigset_t is plain data, filled by sigprocmask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both sets are valid; the process is single-threaded.
    check(
        unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old) },
        || "sigprocmask".into(),
    )?;
    let restore_mask = |old: &libc::sigset_t| {
        // SAFETY: `old` is the mask sigprocmask returned.
        unsafe { libc::sigprocmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
    };
    // SAFETY: unshare takes flags only; CLONE_NEWPID affects this process's future children.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } < 0 {
        let e = JailError::sys("unshare(CLONE_NEWPID)");
        restore_mask(&old);
        return Err(e);
    }
    // SAFETY: the process is single-threaded (the caller's contract), so the child may go
    // on running ordinary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = JailError::sys("fork");
        restore_mask(&old);
        return Err(e);
    }
    if pid == 0 {
        drop(wr);
        restore_mask(&old);
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
        let mut go = [0u8; 1];
        let mut f = File::from(rd.try_clone().map_err(|e| JailError::io("dup", e))?);
        if f.read(&mut go).ok() != Some(1) {
            // The outer process failed (and said why) or died.
            std::process::exit(1);
        }
        if let Err(e) =
            build_jail(plan, &prep).and_then(|()| drop_privileges(plan.spec.uid, plan.spec.gid))
        {
            // The outer process exits with this code too and removes the cgroup.
            eprintln!("densevm: error: cannot set up the jail: {e}");
            std::process::exit(1);
        }
        let mut p = libc::pollfd {
            fd: rd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) };
        if p.revents & libc::POLLHUP != 0 {
            std::process::exit(1);
        }
        return Ok(Launched::Jailed);
    }
    drop(rd);
    drop(prep);
    let child = pid as u32;
    if let Err(e) = cgroup.join(child) {
        // SAFETY: kill and waitpid of our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        restore_mask(&old);
        return Err(e);
    }
    // SAFETY: writes one byte from a live buffer to our pipe.
    unsafe { libc::write(wr.as_raw_fd(), b"g".as_ptr().cast(), 1) };
    let (status, forwarded) = wait_child(pid, &set);
    drop(wr);
    for (d, e) in cgroup.remove() {
        eprintln!(
            "densevm: warning: cannot remove the cgroup {}: {e}",
            d.display()
        );
    }
    let signal = forwarded.or_else(|| libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)));
    if let Some(sig) = signal {
        // SAFETY: back to the default action, unblocked, then raised on ourselves: the
        // outer process ends the way a plain `densevm run` would have.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            restore_mask(&old);
            let one = signal_set(&[sig]);
            libc::sigprocmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
            libc::raise(sig);
        }
        return Ok(Launched::Exited(128 + sig));
    }
    restore_mask(&old);
    Ok(Launched::Exited(libc::WEXITSTATUS(status)))
}

/// Waits for `pid`, turning SIGTERM/SIGINT/SIGHUP/SIGQUIT into its SIGKILL (PID 1 of a
/// namespace ignores signals it has no handler for). Returns its wait status and the
/// signal that asked the outer process to stop, if any.
fn wait_child(pid: libc::pid_t, set: &libc::sigset_t) -> (libc::c_int, Option<libc::c_int>) {
    let mut forwarded = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid
            || (r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
        {
            return (status, forwarded);
        }
        // SAFETY: `set` is a valid signal set; a null info pointer is allowed.
        let sig = unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) };
        if FORWARDED.contains(&sig) {
            forwarded.get_or_insert(sig);
            // SAFETY: kill of our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn mkdirs(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| JailError::io(format!("mkdir {}", p.display()), e))
}

fn build_jail(plan: &Plan, prep: &Prepared) -> Result<()> {
    let root = &plan.spec.root;
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
    match (&plan.spec.netns, &prep.netns) {
        (Netns::Join(p), Some(fd)) => {
            // SAFETY: setns on a descriptor we own.
            check(
                unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
                || format!("setns {}", p.display()),
            )?
        }
        (Netns::New, _) => flags |= libc::CLONE_NEWNET,
        _ => {}
    }
    // SAFETY: unshare takes flags only; the process is single-threaded.
    check(unsafe { libc::unshare(flags) }, || {
        "unshare(CLONE_NEWNS | CLONE_NEWIPC [| CLONE_NEWNET])".into()
    })?;
    // Nothing mounted from here on propagates back to the host.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    mount(
        Some(Path::new("tmpfs")),
        root,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=1m,nr_inodes=4096"),
    )?;
    for b in &plan.binds {
        let target = inside(root, &b.path);
        if fs::symlink_metadata(&target).is_err() {
            if let Some(p) = target.parent() {
                mkdirs(p)?;
            }
            match b.kind {
                BindKind::Dir => mkdirs(&target)?,
                BindKind::File => {
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&target)
                        .map_err(|e| JailError::io(format!("create {}", target.display()), e))?;
                }
            }
        }
        mount(
            Some(&b.path),
            &target,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
        let is_dev = fs::metadata(&b.path).is_ok_and(|m| m.file_type().is_block_device());
        let mut f = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID;
        if !is_dev {
            f |= libc::MS_NODEV;
        }
        if b.readonly {
            f |= libc::MS_RDONLY;
        }
        mount(None, &target, None, f, None)?;
    }
    for (d, rdev) in &prep.devices {
        let target = inside(root, Path::new(d.path()));
        if let Some(p) = target.parent() {
            mkdirs(p)?;
        }
        let c = cstr(&target)?;
        // SAFETY: a NUL-terminated path; mknod/chown/chmod take no other pointers.
        unsafe {
            check(
                libc::mknod(c.as_ptr(), libc::S_IFCHR | d.mode(), *rdev),
                || format!("mknod {}", target.display()),
            )?;
            check(
                libc::chown(c.as_ptr(), plan.spec.uid, plan.spec.gid),
                || format!("chown {}", target.display()),
            )?;
            check(libc::chmod(c.as_ptr(), d.mode()), || {
                format!("chmod {}", target.display())
            })?;
        }
    }
    let proc_dir = root.join("proc");
    mkdirs(&proc_dir)?;
    let pflags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // `subset=pid` (Linux 5.8): only the jail's processes, no /proc/sys, /proc/kcore, ...
    if mount(
        Some(Path::new("proc")),
        &proc_dir,
        Some("proc"),
        pflags,
        Some("subset=pid"),
    )
    .is_err()
    {
        mount(
            Some(Path::new("proc")),
            &proc_dir,
            Some("proc"),
            pflags,
            None,
        )?;
    }
    if !plan.taps.is_empty() {
        bind_taps(plan)?;
    }
    pivot(root)
}

/// Binds `/sys/class/net/NAME` of each tap, read from a sysfs mounted in the jail's network
/// namespace (and unmounted again), read-only.
fn bind_taps(plan: &Plan) -> Result<()> {
    let root = &plan.spec.root;
    let tmp = root.join(".sysfs");
    mkdirs(&tmp)?;
    let ro = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount(Some(Path::new("sysfs")), &tmp, Some("sysfs"), ro, None)?;
    let mut result = Ok(());
    for t in &plan.taps {
        let src = tmp.join("class/net").join(t);
        let Ok(real) = fs::canonicalize(&src) else {
            result = Err(JailError::Invalid(format!(
                "tap {t} is not in the jail's network namespace ({:?}): create it there, \
                 owned by the VM's uid: ip tuntap add {t} mode tap user {}",
                plan.spec.netns, plan.spec.uid
            )));
            break;
        };
        let target = root.join("sys/class/net").join(t);
        result = mkdirs(&target)
            .and_then(|()| mount(Some(&real), &target, None, libc::MS_BIND, None))
            .and_then(|()| {
                mount(
                    None,
                    &target,
                    None,
                    libc::MS_BIND | libc::MS_REMOUNT | ro,
                    None,
                )
            });
        if result.is_err() {
            break;
        }
    }
    let c = cstr(&tmp)?;
    // SAFETY: a NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    let _ = fs::remove_dir(&tmp);
    result
}

/// `pivot_root` into `root`, the old root detached, the new root's own tmpfs read-only.
/// When the current root is the initramfs (rootfs), where `pivot_root` fails with EINVAL,
/// every other mount not above `root` is detached and `root` is moved over `/` and
/// chrooted into (what `switch_root` does); without capabilities the process cannot leave
/// a chroot.
fn pivot(root: &Path) -> Result<()> {
    let c = cstr(root)?;
    let dot = c".";
    // SAFETY: NUL-terminated paths; pivot_root(".", ".") stacks the old root on top of the
    // new one, and the umount2 of "." then detaches it (no put_old directory needed).
    unsafe {
        check(libc::chdir(c.as_ptr()), || {
            format!("chdir {}", root.display())
        })?;
        if libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) == 0 {
            check(libc::umount2(dot.as_ptr(), libc::MNT_DETACH), || {
                "umount the old root".into()
            })?;
        } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
            && on_rootfs()
        {
            detach_others(root);
            let r = libc::mount(
                c.as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_MOVE,
                std::ptr::null(),
            );
            check(r, || format!("mount --move {} /", root.display()))?;
            check(libc::chroot(dot.as_ptr()), || {
                format!("chroot {}", root.display())
            })?;
        } else {
            return Err(JailError::sys(format!("pivot_root {}", root.display())));
        }
        check(libc::chdir(c"/".as_ptr()), || "chdir /".into())?;
    }
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
        None,
    )
}

/// True when `/` is the initramfs (`rootfs`), which `pivot_root` cannot leave.
fn on_rootfs() -> bool {
    fs::read_to_string("/proc/self/mountinfo").is_ok_and(|t| {
        t.lines().any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let fstype = f.iter().skip_while(|x| **x != "-").nth(1);
            f.get(4) == Some(&"/") && matches!(fstype, Some(&"rootfs") | Some(&"ramfs"))
        })
    })
}

/// Detaches every mount of this (private) namespace that is neither `/`, nor `root` or
/// below it, nor above it: after the move they would stay in the mount table.
fn detach_others(root: &Path) {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p != Path::new("/") && !p.starts_with(root) && !root.starts_with(p))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points.dedup();
    for p in points {
        if let Ok(c) = cstr(&p) {
            // SAFETY: a NUL-terminated path; failures (already gone with a parent) are fine.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every privilege: capability bounding set and ambient set emptied, supplementary
/// groups cleared, gid then uid changed (real, effective, saved: this clears the permitted
/// and effective capabilities), no new privileges; then checks it worked.
pub fn drop_privileges(uid: u32, gid: u32) -> Result<()> {
    // SAFETY: prctl/setgroups/setresgid/setresuid take integers (setgroups a null list of
    // length 0); the process is single-threaded, so the credential change covers it all.
    unsafe {
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 {
                break; // EINVAL past the last capability
            }
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        check(libc::setgroups(0, std::ptr::null()), || {
            "setgroups([])".into()
        })?;
        check(libc::setresgid(gid, gid, gid), || {
            format!("setresgid {gid}")
        })?;
        check(libc::setresuid(uid, uid, uid), || {
            format!("setresuid {uid}")
        })?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), || {
            "PR_SET_NO_NEW_PRIVS".into()
        })?;
        // A credential change clears these two; the VMM needs them back.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // Dumpable again, so the VMM can read its own /proc/self/pagemap (snapshots): a
        // non-dumpable process's /proc files belong to root. Another process of the same
        // uid could then ptrace it: give every VM a uid of its own.
        libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
    }
    let mut hdr = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData entries for version 3.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    check(r as libc::c_int, || "capget".into())?;
    let caps = data
        .iter()
        .any(|d| d.effective | d.permitted | d.inheritable != 0);
    // SAFETY: setuid(0) must fail now; if it does not, the drop did not happen.
    let regained = unsafe { libc::setuid(0) } == 0;
    // SAFETY: getuid/getgid have no arguments.
    let (ruid, rgid) = unsafe { (libc::getuid(), libc::getgid()) };
    if caps || regained || ruid != uid || rgid != gid {
        return Err(JailError::Invalid(format!(
            "privileges not dropped (uid {ruid}, gid {rgid}, capabilities left: {caps}, \
             setuid(0) worked: {regained})"
        )));
    }
    Ok(())
}
