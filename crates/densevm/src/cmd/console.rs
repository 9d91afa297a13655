//! Console input over a unix socket: the VMM side (`serve_console_socket`, one `console`
//! thread that passes every byte a client sends to the guest's UART) and the client verb
//! `densevm console --sock PATH [--send TEXT] [--wait-for TEXT --console-file FILE]`, which
//! types into a VM's serial console and waits for its answer in the console output file.
//! (The lab uses the verb: busybox in L1 has no unix-socket client.)

use anyhow::Context;
use clap::Args;
use std::fs;
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Stack of the `console` thread.
pub const CONSOLE_THREAD_STACK: usize = 64 * 1024;
/// How long the thread waits before offering bytes the input refused again.
const RETRY: Duration = Duration::from_millis(2);

/// The served socket; dropping it stops the thread at once, even mid-client, joins it and
/// unlinks the socket path if it is still this server's.
#[derive(Debug)]
pub struct ConsoleSocketHandle {
    thread: Option<JoinHandle<()>>,
    wake: OwnedFd,
    path: PathBuf,
    ino: (u64, u64),
}

impl Drop for ConsoleSocketHandle {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd this handle owns.
            let n = unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
            if n != 8 || thread.join().is_err() {
                tracing::error!("console: cannot stop the console thread cleanly");
            }
        }
        unlink_if_ours(&self.path, self.ino);
    }
}

/// Serves console input on a unix socket at `path` (mode 0600) on a new thread named
/// `console` (64 KiB stack), one client at a time (others wait in the backlog until it
/// disconnects). Every byte a client sends is passed to `input`, in order; `input` must
/// take all of them (see [`serve_console_socket_paced`] for a sink that can refuse bytes,
/// such as the UART's 64-byte FIFO). A socket at `path` that nobody answers (left by a
/// VMM that died) is replaced; one that answers, or a path that is not a socket, is an
/// error.
#[allow(dead_code)] // the paced form is what `densevm run` wires to the UART
pub fn serve_console_socket(
    path: &Path,
    input: impl Fn(&[u8]) + Send + 'static,
) -> io::Result<ConsoleSocketHandle> {
    serve_console_socket_paced(path, move |bytes: &[u8]| {
        input(bytes);
        bytes.len()
    })
}

/// Like [`serve_console_socket`], but `input` returns how many leading bytes it took
/// (`Serial::enqueue_input` does: at most what its FIFO has room for); the rest is offered
/// again every 2 ms until taken, so no byte is lost while the guest is slow to read. The
/// client is not read meanwhile: it waits on the socket's buffer.
pub fn serve_console_socket_paced(
    path: &Path,
    input: impl FnMut(&[u8]) -> usize + Send + 'static,
) -> io::Result<ConsoleSocketHandle> {
    let listener = bind(path)?;
    let set_up = fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .and_then(|()| fs::symlink_metadata(path))
        .and_then(|m| Ok(((m.dev(), m.ino()), eventfd()?)))
        .and_then(|(ino, wake)| Ok((ino, wake.try_clone()?, wake)));
    let (ino, thread_wake, wake) = match set_up {
        Ok(v) => v,
        Err(e) => {
            let _ = fs::remove_file(path);
            return Err(e);
        }
    };
    // If the thread cannot start, the handle is dropped, which unlinks the socket.
    let mut handle = ConsoleSocketHandle {
        thread: None,
        wake,
        path: path.to_path_buf(),
        ino,
    };
    handle.thread = Some(
        std::thread::Builder::new()
            .name("console".into())
            .stack_size(CONSOLE_THREAD_STACK)
            .spawn(move || {
                densevm_seccomp::enter(densevm_seccomp::ThreadKind::Console);
                serve(&listener, thread_wake.as_fd(), input)
            })?,
    );
    Ok(handle)
}

/// Binds `path`, replacing a stale socket (the same rules as the API socket's).
fn bind(path: &Path) -> io::Result<UnixListener> {
    let shown = path.display();
    let err = |kind, msg: String| io::Error::new(kind, format!("console socket {shown}: {msg}"));
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(err(e.kind(), e.to_string())),
        Ok(m) if !m.file_type().is_socket() => {
            let msg = "exists and is not a socket; densevm leaves it alone: pick another path";
            return Err(err(ErrorKind::AlreadyExists, msg.into()));
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(err(
                    ErrorKind::AddrInUse,
                    "another process serves it".into(),
                ))
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                tracing::info!("removing the stale console socket {shown}");
                fs::remove_file(path).map_err(|e| err(e.kind(), e.to_string()))?;
            }
            Err(e) => return Err(err(e.kind(), e.to_string())),
        },
    }
    UnixListener::bind(path).map_err(|e| err(e.kind(), e.to_string()))
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; the result is checked before use.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh eventfd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn unlink_if_ours(path: &Path, ino: (u64, u64)) {
    match fs::symlink_metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == ino => {
            if let Err(e) = fs::remove_file(path) {
                tracing::warn!("console: cannot remove {}: {e}", path.display());
            }
        }
        _ => {}
    }
}

/// What [`wait`] saw.
#[derive(PartialEq)]
enum Ready {
    Readable,
    Stop,
    Timeout,
}

/// Waits until `fd` is readable or `wake` signalled (which wins), at most `timeout`.
fn wait(fd: BorrowedFd<'_>, wake: BorrowedFd<'_>, timeout: Option<Duration>) -> Ready {
    let poll_in = |fd: BorrowedFd<'_>| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [poll_in(fd), poll_in(wake)];
    let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, 60_000) as libc::c_int);
    loop {
        // SAFETY: `fds` is a live array of two pollfds, its length passed alongside.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        match n {
            0 => return Ready::Timeout,
            _ if n > 0 && fds[1].revents != 0 => return Ready::Stop,
            _ if n > 0 => return Ready::Readable,
            _ if io::Error::last_os_error().kind() == ErrorKind::Interrupted => continue,
            _ => {
                tracing::error!("console: poll failed: {}", io::Error::last_os_error());
                return Ready::Stop;
            }
        }
    }
}

fn serve(listener: &UnixListener, wake: BorrowedFd<'_>, mut input: impl FnMut(&[u8]) -> usize) {
    let mut buf = [0u8; 1024];
    while wait(listener.as_fd(), wake, None) == Ready::Readable {
        let mut client = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("console: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // One client until it disconnects.
        loop {
            if wait(client.as_fd(), wake, None) != Ready::Readable {
                return;
            }
            let n = match client.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("console: client dropped: {e}");
                    break;
                }
            };
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                rest = &rest[input(rest).min(rest.len())..];
                // Sleeps RETRY (`wake` polled twice) unless stopped.
                if !rest.is_empty() && wait(wake, wake, Some(RETRY)) != Ready::Timeout {
                    return;
                }
            }
        }
    }
}

// `densevm console`: types into a VM's serial console and waits for its answer.
#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// The VM's console input socket (`densevm run --console-sock PATH`).
    #[arg(long, value_name = "PATH")]
    sock: PathBuf,
    /// Text to type; `\n`, `\r`, `\t`, `\\` and `\xHH` are unescaped.
    #[arg(long, value_name = "TEXT")]
    send: Option<String>,
    /// Wait until the console output file contains TEXT (only output written after the
    /// --send text was sent, if any; escapes as for --send). Exits 1 on timeout.
    #[arg(long, value_name = "TEXT", requires = "console_file")]
    wait_for: Option<String>,
    /// The VM's console output file (where `densevm run`'s stdout goes).
    #[arg(long, value_name = "FILE")]
    console_file: Option<PathBuf>,
    /// Seconds --wait-for waits.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    timeout: f64,
}

pub fn main(args: ConsoleArgs) -> anyhow::Result<i32> {
    let wait_for = args.wait_for.as_deref().map(unescape).transpose()?;
    // Output that answers --send can only follow it: search from here on.
    let from = match (&args.console_file, &args.send) {
        (Some(file), Some(_)) => fs::metadata(file).map_or(0, |m| m.len()),
        _ => 0,
    };
    if let Some(text) = &args.send {
        send(&args.sock, &unescape(text)?)
            .with_context(|| format!("cannot send to {}", args.sock.display()))?;
    }
    let (Some(needle), Some(file)) = (wait_for, &args.console_file) else {
        return Ok(0);
    };
    let timeout = Duration::try_from_secs_f64(args.timeout).context("--timeout")?;
    if wait_for_text(file, &needle, from, timeout)? {
        return Ok(0);
    }
    eprintln!(
        "densevm console: {} did not show {:?} within {} s",
        file.display(),
        String::from_utf8_lossy(&needle),
        args.timeout
    );
    Ok(1)
}

/// Sends `bytes` to a console socket and closes the connection.
pub fn send(sock: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut stream = UnixStream::connect(sock)?;
    stream.write_all(bytes)?;
    stream.shutdown(std::net::Shutdown::Write)
}

/// Unescapes `\n`, `\r`, `\t`, `\\` and `\xHH`; any other backslash sequence is an error.
pub fn unescape(text: &str) -> anyhow::Result<Vec<u8>> {
    let (bytes, mut out, mut i) = (text.as_bytes(), Vec::with_capacity(text.len()), 0);
    while i < bytes.len() {
        let (value, len) = match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'n')) => (b'\n', 2),
            (b'\\', Some(b'r')) => (b'\r', 2),
            (b'\\', Some(b't')) => (b'\t', 2),
            (b'\\', Some(b'\\')) => (b'\\', 2),
            (b'\\', Some(b'x')) => match text.get(i + 2..i + 4) {
                Some(h) if h.bytes().all(|c| c.is_ascii_hexdigit()) => {
                    (u8::from_str_radix(h, 16)?, 4)
                }
                _ => anyhow::bail!("bad \\x escape in {text:?}: two hex digits expected"),
            },
            (b'\\', _) => anyhow::bail!(
                "unknown escape at byte {i} of {text:?} (\\n, \\r, \\t, \\\\ and \\xHH are known)"
            ),
            (b, _) => (b, 1),
        };
        out.push(value);
        i += len;
    }
    Ok(out)
}

/// Waits until `file` contains `needle` at or after byte `from` (a missing file counts as
/// empty; the file is read whole every 50 ms, fine for console logs); false after
/// `timeout`.
pub fn wait_for_text(file: &Path, needle: &[u8], from: u64, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let data = match fs::read(file) {
            Ok(data) => data,
            Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let new = data.get(from as usize..).unwrap_or_default();
        if needle.is_empty() || new.windows(needle.len()).any(|w| w == needle) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc, Mutex};

    fn temp_path(name: &str) -> PathBuf {
        let pid = std::process::id();
        std::env::temp_dir().join(format!("densevm-console-{pid}-{name}"))
    }

    /// A server passing what it gets to a channel; `collect(len)` waits for `len` bytes.
    fn server(path: &Path) -> (ConsoleSocketHandle, impl Fn(usize) -> Vec<u8>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let handle = serve_console_socket(path, move |b: &[u8]| {
            tx.lock().unwrap().send(b.to_vec()).unwrap()
        })
        .unwrap();
        let collect = move |len| {
            let mut got = Vec::new();
            while got.len() < len {
                got.extend(
                    rx.recv_timeout(Duration::from_secs(5))
                        .expect("bytes in time"),
                );
            }
            got
        };
        (handle, collect)
    }

    #[test]
    fn bytes_arrive_in_order_clients_take_turns_drop_unlinks() {
        let path = temp_path("order");
        let (handle, collect) = server(&path);
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut first = UnixStream::connect(&path).unwrap();
        let mut want = Vec::new();
        for i in 0..200 {
            let piece = format!("line {i}\n");
            first.write_all(piece.as_bytes()).unwrap();
            want.extend_from_slice(piece.as_bytes());
        }
        send(&path, b"second\n").unwrap(); // waits in the backlog
        assert_eq!(collect(want.len()), want);
        drop(first);
        assert_eq!(collect(7), b"second\n");
        let _third = UnixStream::connect(&path).unwrap(); // connected, silent
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        drop(handle);
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert!(!path.exists(), "drop unlinks the socket");
    }

    #[test]
    fn a_slow_input_loses_nothing() {
        let path = temp_path("paced");
        let got = Arc::new(Mutex::new(Vec::new()));
        let (sink, mut calls) = (Arc::clone(&got), 0);
        // Takes at most 3 bytes, and nothing every other call (a full FIFO).
        let _server = serve_console_socket_paced(&path, move |b: &[u8]| {
            calls += 1;
            let n = if calls % 2 == 0 { 0 } else { b.len().min(3) };
            sink.lock().unwrap().extend_from_slice(&b[..n]);
            n
        })
        .unwrap();
        let text: Vec<u8> = (0..600u32).map(|i| b'a' + (i % 26) as u8).collect();
        send(&path, &text).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.lock().unwrap().len() < text.len() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(*got.lock().unwrap(), text);
    }

    #[test]
    fn stale_sockets_are_replaced_live_ones_and_files_refused() {
        let path = temp_path("stale");
        drop(UnixListener::bind(&path).unwrap()); // a dead VMM's socket
        let (handle, collect) = server(&path);
        send(&path, b"ok").unwrap();
        assert_eq!(collect(2), b"ok");
        let err = serve_console_socket(&path, |_: &[u8]| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AddrInUse, "{err}");
        drop(handle);
        fs::write(&path, b"not a socket").unwrap();
        let err = serve_console_socket(&path, |_: &[u8]| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
        assert_eq!(fs::read(&path).unwrap(), b"not a socket");
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn unescapes() {
        assert_eq!(unescape(r"echo a\\n\n").unwrap(), b"echo a\\n\n");
        assert_eq!(unescape(r"\t\r\x03\x7e").unwrap(), b"\t\r\x03~");
        for bad in [r"\q", r"\x4", r"\xzz", r"trailing\"] {
            assert!(unescape(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn waits_for_text_written_later() {
        let file = temp_path("out");
        fs::write(&file, b"old ANSWER\n").unwrap();
        let from = fs::metadata(&file).unwrap().len();
        assert!(!wait_for_text(&file, b"ANSWER", from, Duration::from_millis(100)).unwrap());
        assert!(wait_for_text(&file, b"ANSWER", 0, Duration::ZERO).unwrap());
        let path = file.clone();
        let writer = std::thread::spawn(move || {
            for piece in [&b"AN"[..], b"SW", b"ER=42\n"] {
                std::thread::sleep(Duration::from_millis(80));
                let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
                f.write_all(piece).unwrap();
            }
        });
        assert!(wait_for_text(&file, b"ANSWER=42", from, Duration::from_secs(5)).unwrap());
        writer.join().unwrap();
        fs::remove_file(&file).unwrap();
        assert!(!wait_for_text(&file, b"x", 0, Duration::from_millis(60)).unwrap());
    }
}
