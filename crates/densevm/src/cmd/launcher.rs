//! The clone launcher: a small process forked by `densevm run --api-sock` before any
//! seccomp filter is installed, which starts clone processes on the VMM's behalf.
//!
//! A seccomp filter survives `fork` and `execve`, so a VMM that started clones itself
//! needed `execve`, `fork` and executable mappings in its control thread's list, and every
//! clone ran under that list on top of its own. With the launcher, no VMM thread can start
//! a program: the control thread sends a request (argv, descriptors) over a
//! `SOCK_SEQPACKET` socket pair and gets the clone's pid back; the launcher, unfiltered,
//! spawns it with `posix_spawn`-like `Command` semantics, reaps it and logs how it ended.
//! It lives in the VMM's jail (forked after `jail::enter`) with the same uid, so it can
//! do nothing the VMM could not do before its filters; it ends when the VMM's end of the
//! socket closes (clones that still run are then reparented, as they were before).
//!
//! It starts nothing but clones: its own executable, as `run --restore … --clone-index
//! …` with the flags a clone is given ([`Allowed`]), so a guest that took over the VMM
//! can make it start densevm clones with arguments of its choosing, not other programs.
//!
//! Request: one message, entries each ending in NUL: `a<bytes>` a literal argument (the
//! first is the program), `f<i>` the number of the i-th descriptor passed with the
//! message (`SCM_RIGHTS`); descriptors 0 and 1 are the child's stdout and stderr. Answer:
//! `ok <pid>` or `error <message>`.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// At most this many descriptors per request (stdout, stderr, ready pipe, RAM file, ...).
const MAX_FDS: usize = 8;
/// The largest request (argv of a clone is well under 4 KiB).
const MAX_REQUEST: usize = 64 << 10;

/// One argument of a request.
pub enum Arg<'a> {
    /// A literal argument.
    Lit(OsString),
    /// A descriptor the child inherits; the argument is its number there.
    Fd(std::os::fd::BorrowedFd<'a>),
}

/// The VMM's end of the launcher's socket, set once by [`start`].
static LAUNCHER: OnceLock<Mutex<OwnedFd>> = OnceLock::new();

/// Whether this process started a launcher (clones then go through it).
pub fn running() -> bool {
    LAUNCHER.get().is_some()
}

/// What the launcher starts: its own executable, as a clone (`run --restore DIR
/// --clone-index N ...`) with only the flags clones are given, and the VMM's own
/// `--seccomp` mode if it is not the default (`off` and `log` are inherited, never chosen).
pub struct Allowed {
    /// This executable (as the VMM names it for its clones), or why it was not found.
    exe: Result<OsString, String>,
    seccomp: Option<&'static str>,
}

/// Flags of a clone's command line that take a value (checked by [`Allowed::check`]).
const CLONE_FLAGS: &[&str] = &[
    "--restore",
    "--api-sock",
    "--id",
    "--clone-index",
    "--console-sock",
    "--ready-fd",
    "--ram-fd",
    "--memory-budget",
    "--net-override",
    "--seccomp",
];

impl Allowed {
    /// Clones of this executable, with `seccomp` the `--seccomp` value they inherit.
    pub fn new(exe: io::Result<OsString>, seccomp: Option<&'static str>) -> Allowed {
        Allowed {
            exe: exe.map_err(|e| e.to_string()),
            seccomp,
        }
    }

    /// Whether `argv` is a clone's command line; the reason if not.
    pub fn check(&self, argv: &[OsString]) -> Result<(), String> {
        let refuse = |why: String| Err(format!("clone launcher: refused: {why}"));
        let exe = match &self.exe {
            Ok(exe) => exe,
            Err(e) => return refuse(format!("it could not find its own executable: {e}")),
        };
        match argv.first() {
            Some(p) if p == exe => {}
            Some(p) => {
                return refuse(format!(
                    "it starts only {} (asked for {})",
                    exe.to_string_lossy(),
                    p.to_string_lossy()
                ))
            }
            None => return Err("clone launcher: empty request".into()),
        }
        if argv.get(1).is_none_or(|a| a != "run") {
            return refuse("it starts only `run` (a clone)".into());
        }
        let (mut restore, mut index) = (false, false);
        let mut rest = argv[2..].iter();
        while let Some(flag) = rest.next() {
            let flag = flag.to_string_lossy();
            if flag == "--trace" {
                continue;
            }
            if !CLONE_FLAGS.contains(&flag.as_ref()) {
                return refuse(format!("{flag} is not a clone's flag"));
            }
            let Some(value) = rest.next() else {
                return refuse(format!("{flag} without a value"));
            };
            match flag.as_ref() {
                "--restore" => restore = true,
                "--clone-index" => index = true,
                "--seccomp" if self.seccomp != Some(&*value.to_string_lossy()) => {
                    return refuse(format!(
                        "--seccomp {}: clones run with this VMM's filters",
                        value.to_string_lossy()
                    ))
                }
                _ => {}
            }
        }
        if !(restore && index) {
            return refuse("a clone needs --restore and --clone-index".into());
        }
        Ok(())
    }
}

/// Forks the launcher, which starts what `allowed` admits. Call it while the process is
/// single-threaded, before seccomp filters are installed.
pub fn start(allowed: Allowed) -> anyhow::Result<()> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two new descriptors into `fds`, owned from here on.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } < 0
    {
        anyhow::bail!(
            "cannot create the clone launcher's socket pair: {}",
            io::Error::last_os_error()
        );
    }
    // SAFETY: both are fresh descriptors nobody else owns.
    let (vmm, launcher) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the caller guarantees a single-threaded process, so the child may run
    // ordinary code (no lock can be held by a thread that does not exist there).
    match unsafe { libc::fork() } {
        -1 => anyhow::bail!(
            "cannot fork the clone launcher: {}",
            io::Error::last_os_error()
        ),
        0 => {
            drop(vmm);
            serve(launcher, &allowed)
        }
        _ => {
            drop(launcher);
            let _ = LAUNCHER.set(Mutex::new(vmm));
            Ok(())
        }
    }
}

/// Asks the launcher to start `args` (the first is the program) with `stdout` and
/// `stderr`; returns the child's pid.
pub fn spawn(args: &[Arg<'_>], stdout: &OwnedFd, stderr: &OwnedFd) -> anyhow::Result<u32> {
    let sock = LAUNCHER
        .get()
        .ok_or_else(|| anyhow::anyhow!("no clone launcher in this process"))?;
    let sock = sock.lock().unwrap_or_else(|p| p.into_inner());
    let mut msg = Vec::new();
    let mut fds: Vec<RawFd> = vec![stdout.as_raw_fd(), stderr.as_raw_fd()];
    for a in args {
        match a {
            Arg::Lit(s) => {
                msg.push(b'a');
                msg.extend_from_slice(s.as_bytes());
            }
            Arg::Fd(fd) => {
                msg.push(b'f');
                msg.extend_from_slice(fds.len().to_string().as_bytes());
                fds.push(fd.as_raw_fd());
            }
        }
        msg.push(0);
    }
    anyhow::ensure!(
        fds.len() <= MAX_FDS && msg.len() <= MAX_REQUEST,
        "clone launcher request too large"
    );
    send(sock.as_raw_fd(), &msg, &fds)
        .map_err(|e| anyhow::anyhow!("cannot reach the clone launcher: {e}"))?;
    let mut buf = [0u8; 4096];
    let (n, _) = recv(sock.as_raw_fd(), &mut buf)
        .map_err(|e| anyhow::anyhow!("no answer from the clone launcher: {e}"))?;
    let answer = String::from_utf8_lossy(&buf[..n]);
    if let Some(pid) = answer.strip_prefix("ok ") {
        return pid
            .parse()
            .map_err(|_| anyhow::anyhow!("clone launcher: bad answer {answer:?}"));
    }
    if n == 0 {
        anyhow::bail!("the clone launcher has ended (see the VMM's stderr)");
    }
    anyhow::bail!("{}", answer.strip_prefix("error ").unwrap_or(&answer))
}

/// The launcher's loop; never returns.
fn serve(sock: OwnedFd, allowed: &Allowed) -> ! {
    // SAFETY: PR_SET_NAME copies at most 16 bytes from a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"densevm-launch".as_ptr()) };
    // Only stdin, stdout, stderr and the socket stay open (the VMM's other descriptors
    // at fork time are not the launcher's business).
    let sock = sock.as_raw_fd();
    // SAFETY: close_range closes descriptors of this process only; `sock` is kept.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3, (sock - 1).max(2) as u32, 0);
        libc::syscall(libc::SYS_close_range, sock + 1, u32::MAX, 0);
    }
    let sigfd = match child_signals() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("densevm: clone launcher: {e}");
            // SAFETY: _exit ends this process; nothing of it is needed any more.
            unsafe { libc::_exit(1) }
        }
    };
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let mut pfds = [
            libc::pollfd {
                fd: sock,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll reads and writes two valid pollfds.
        if unsafe { libc::poll(pfds.as_mut_ptr(), 2, -1) } < 0 {
            continue;
        }
        if pfds[1].revents != 0 {
            reap(&sigfd);
        }
        if pfds[0].revents == 0 {
            continue;
        }
        let answer = match recv(sock, &mut buf) {
            Ok((0, _)) => {
                // The VMM is gone: so is the launcher (clones go on, reparented).
                // SAFETY: as above.
                unsafe { libc::_exit(0) }
            }
            Ok((n, fds)) => launch(&buf[..n], fds, &|argv| allowed.check(argv)),
            Err(e) if e.kind() == io::ErrorKind::Other => Err(format!("clone launcher: {e}")),
            Err(_) => {
                // SAFETY: as above.
                unsafe { libc::_exit(0) }
            }
        };
        let answer = match answer {
            Ok(pid) => format!("ok {pid}"),
            Err(e) => format!("error {e}"),
        };
        let _ = send(sock, answer.as_bytes(), &[]);
    }
}

/// Starts one request's program, if `check` admits its argv.
fn launch(
    req: &[u8],
    fds: Vec<OwnedFd>,
    check: &dyn Fn(&[OsString]) -> Result<(), String>,
) -> Result<u32, String> {
    if fds.len() < 2 {
        return Err("clone launcher: a request needs stdout and stderr".into());
    }
    let mut argv: Vec<OsString> = Vec::new();
    let mut keep: Vec<RawFd> = Vec::new();
    for entry in req.split(|&b| b == 0).filter(|e| !e.is_empty()) {
        match entry[0] {
            b'a' => argv.push(OsString::from_vec(entry[1..].to_vec())),
            b'f' => {
                let i: usize = std::str::from_utf8(&entry[1..])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .filter(|&i| i >= 2 && i < fds.len())
                    .ok_or("clone launcher: bad descriptor reference")?;
                let fd = fds[i].as_raw_fd();
                keep.push(fd);
                argv.push(fd.to_string().into());
            }
            _ => return Err("clone launcher: bad request".into()),
        }
    }
    check(&argv)?;
    let mut fds = fds.into_iter();
    let (out, err) = (fds.next().unwrap(), fds.next().unwrap());
    let child = start_process(&argv, out, err, keep)?;
    // The child is reaped through SIGCHLD (`reap`), not through this handle. The
    // launcher's copies of the descriptors (the ready pipe, the RAM file, ...) close on
    // return: the child holds its own, so the ready pipe reports the child's end.
    drop(fds);
    Ok(child.id())
}

/// Starts `argv` (the first is the program) in its own process group (a terminal's
/// signals to the VMM spare the clones), stdin `/dev/null`, with `out` and `err`, and
/// `keep` (close-on-exec descriptors of this process) inherited at their numbers.
pub fn start_process(
    argv: &[OsString],
    out: OwnedFd,
    err: OwnedFd,
    keep: Vec<RawFd>,
) -> Result<std::process::Child, String> {
    let (program, args) = argv.split_first().ok_or("clone launcher: empty request")?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // SAFETY: the closure runs in the forked child before exec and only calls fcntl,
    // which is async-signal-safe, on descriptors the child inherited.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &keep {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.to_string_lossy()))
}

/// Blocks SIGCHLD and returns a signalfd that reports it.
fn child_signals() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset/sigaddset; sigprocmask and
    // signalfd read it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Reaps every ended child and logs the ones that did not exit with 0.
fn reap(sigfd: &OwnedFd) {
    let mut info = [0u8; 128];
    // SAFETY: drains the signalfd into a buffer of one signalfd_siginfo (128 bytes).
    while unsafe { libc::read(sigfd.as_raw_fd(), info.as_mut_ptr().cast(), info.len()) } > 0 {}
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status of one ended child, if any.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            continue;
        }
        let how = if libc::WIFSIGNALED(status) {
            format!("signal {}", libc::WTERMSIG(status))
        } else {
            format!("exit code {}", libc::WEXITSTATUS(status))
        };
        tracing::warn!("clone {pid} ended: {how} (its console file has its log)");
    }
}

/// Sends `data` with `fds` (SCM_RIGHTS) as one message.
fn send(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cmsg = [0u64; 16];
    // SAFETY: msghdr is plain data; the fields used are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE/CMSG_LEN compute sizes; `cmsg` (128 bytes) holds the header
        // and up to MAX_FDS descriptors, which callers respect; CMSG_FIRSTHDR points into
        // it once msg_control is set.
        unsafe {
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(bytes as u32) as usize;
            let h = libc::CMSG_FIRSTHDR(&msg);
            (*h).cmsg_level = libc::SOL_SOCKET;
            (*h).cmsg_type = libc::SCM_RIGHTS;
            (*h).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(h).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: msg points at valid buffers for the duration of the call.
        if unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) } >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf` and the descriptors that came with it (close-on-exec).
fn recv(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cmsg = [0u64; 16];
    // SAFETY: msghdr is plain data; the fields used are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg);
    let n = loop {
        // SAFETY: msg points at valid buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control; CMSG_FIRSTHDR/NXTHDR walk it within
    // msg_controllen, and each SCM_RIGHTS payload holds descriptors now owned here.
    unsafe {
        let mut h = libc::CMSG_FIRSTHDR(&msg);
        while !h.is_null() {
            if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(h) as *const RawFd;
                let count = ((*h).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            h = libc::CMSG_NXTHDR(&msg, h);
        }
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        // (`fds` close here.)
        return Err(io::Error::other(
            "request truncated (too long or too many descriptors)",
        ));
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two new descriptors, owned from here on.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn null() -> OwnedFd {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap()
            .into()
    }

    /// A request carried over a real socket pair (message and SCM_RIGHTS), then started:
    /// the child writes into the descriptor its argv names and ends.
    #[test]
    fn a_request_starts_the_program_with_the_descriptors_it_names() {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two new descriptors, owned from here on.
        assert_eq!(
            unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                    0,
                    fds.as_mut_ptr(),
                )
            },
            0
        );
        // SAFETY: fresh descriptors.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (rx, tx) = pipe();
        let (out, err) = (null(), null());
        let mut req = Vec::new();
        for e in [
            "a/bin/sh",
            "a-c",
            "aecho hello-$1 > /proc/self/fd/$0",
            "f2",
            "alauncher",
        ] {
            req.extend_from_slice(e.as_bytes());
            req.push(0);
        }
        send(
            a.as_raw_fd(),
            &req,
            &[out.as_raw_fd(), err.as_raw_fd(), tx.as_raw_fd()],
        )
        .unwrap();
        drop(tx);
        let mut buf = vec![0u8; MAX_REQUEST];
        let (n, got) = recv(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((n, got.len()), (req.len(), 3));
        let pid = launch(&buf[..n], got, &|_| Ok(())).unwrap();
        assert!(pid > 0);
        let mut text = String::new();
        // EOF once the child ends: the launcher closed its copy of the pipe.
        std::fs::File::from(rx).read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello-launcher\n");
        let mut status = 0;
        // SAFETY: reaps the child started above.
        assert_eq!(
            unsafe { libc::waitpid(pid as i32, &mut status, 0) },
            pid as i32
        );
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let two = || vec![null(), null()];
        let launch = |req: &[u8], fds| launch(req, fds, &|_| Ok(()));
        let e = launch(b"", two()).unwrap_err();
        assert!(e.contains("empty request"), "{e}");
        let e = launch(b"x/bin/true\0", two()).unwrap_err();
        assert!(e.contains("bad request"), "{e}");
        let e = launch(b"a/bin/true\0f2\0", two()).unwrap_err();
        assert!(e.contains("bad descriptor reference"), "{e}");
        let e = launch(b"a/bin/true\0f1\0", two()).unwrap_err();
        assert!(e.contains("bad descriptor reference"), "{e}");
        let e = launch(b"a/bin/true\0", vec![null()]).unwrap_err();
        assert!(e.contains("stdout and stderr"), "{e}");
        let e = launch(b"a/nonexistent/densevm\0", two()).unwrap_err();
        assert!(e.contains("cannot start /nonexistent/densevm"), "{e}");
    }

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// A clone's command line as `clones.rs` builds it.
    const CLONE: &[&str] = &[
        "/usr/bin/densevm",
        "run",
        "--trace",
        "--restore",
        "/run/d",
        "--api-sock",
        "/run/d/c.sock",
        "--id",
        "clone-0",
        "--clone-index",
        "0",
        "--console-sock",
        "/run/d/c.console.sock",
        "--ready-fd",
        "5",
        "--ram-fd",
        "6",
        "--memory-budget",
        "64M",
        "--net-override",
        "eth0=tap1",
    ];

    #[test]
    fn the_launcher_starts_clones_of_its_own_executable_only() {
        let allowed = Allowed::new(Ok("/usr/bin/densevm".into()), None);
        allowed.check(&argv(CLONE)).unwrap();
        let refused = |args: &[&str], why: &str| {
            let e = allowed.check(&argv(args)).unwrap_err();
            assert!(e.contains("refused") && e.contains(why), "{args:?}: {e}");
        };
        let mut other = CLONE.to_vec();
        other[0] = "/bin/sh";
        refused(&other, "starts only /usr/bin/densevm");
        refused(&["/usr/bin/densevm", "vm", "clone"], "only `run`");
        refused(&["/usr/bin/densevm"], "only `run`");
        refused(
            &[CLONE, &["--kernel", "/tmp/x"]].concat(),
            "--kernel is not a clone's flag",
        );
        refused(
            &[CLONE, &["--jail"]].concat(),
            "--jail is not a clone's flag",
        );
        refused(&[CLONE, &["--id"]].concat(), "--id without a value");
        refused(&CLONE[..9], "needs --restore and --clone-index");
        // A filtered VMM's clones are filtered: no `--seccomp off` or `log` for them.
        refused(&[CLONE, &["--seccomp", "off"]].concat(), "--seccomp off");
        refused(&[CLONE, &["--seccomp", "log"]].concat(), "--seccomp log");
        // An unfiltered one's clones inherit exactly its mode.
        let off = Allowed::new(Ok("/usr/bin/densevm".into()), Some("off"));
        off.check(&argv(&[CLONE, &["--seccomp", "off"]].concat()))
            .unwrap();
        let e = off
            .check(&argv(&[CLONE, &["--seccomp", "log"]].concat()))
            .unwrap_err();
        assert!(e.contains("--seccomp log"), "{e}");
        assert!(allowed.check(&[]).unwrap_err().contains("empty request"));
        let lost = Allowed::new(Err(io::Error::other("no /proc")), None);
        let e = lost.check(&argv(CLONE)).unwrap_err();
        assert!(
            e.contains("could not find its own executable: no /proc"),
            "{e}"
        );
    }

    /// A refused request starts nothing and says why.
    #[test]
    fn a_refused_request_starts_nothing() {
        let allowed = Allowed::new(Ok("/usr/bin/densevm".into()), None);
        let e = launch(b"a/bin/true\0", vec![null(), null()], &|a| allowed.check(a)).unwrap_err();
        assert!(e.contains("starts only /usr/bin/densevm"), "{e}");
    }
}
