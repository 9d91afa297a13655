//! Test helpers (feature `testing`): the real agent (`lab/guest/agent.c`, built with the
//! host's `cc`) serving a unix socket instead of vsock, and [`HybridSocket`], a stand-in
//! for the vsock device's host socket in front of it (the `CONNECT`/`OK` handshake, then
//! bytes both ways). Together they run the agent protocol end to end without a VM.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Builds the agent once per test process, named by a hash of its source: runs of the same
/// source reuse one binary instead of leaving one per run in the temp directory. Panics
/// (failing the test) when the host has no C compiler.
pub fn agent_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lab/guest/agent.c");
        let text = std::fs::read(&src).expect("lab/guest/agent.c");
        let hash = text.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let out = std::env::temp_dir().join(format!("densevm-agent-test-{hash:016x}"));
        if out.exists() {
            return out;
        }
        // Built under a private name, then renamed: a parallel run never sees half a file.
        let tmp = std::env::temp_dir().join(format!("densevm-agent-build-{}", std::process::id()));
        let status = Command::new("cc")
            .args(["-O2", "-Wall", "-Werror", "-o"])
            .arg(&tmp)
            .arg(&src)
            .status()
            .expect("the host C compiler (cc) builds lab/guest/agent.c for this test");
        assert!(status.success(), "cc failed on {}", src.display());
        std::fs::rename(&tmp, &out).expect("rename the agent binary into place");
        out
    })
}

/// The agent running on the host, serving a unix socket; killed on drop.
pub struct Agent {
    child: Child,
    /// Its socket (connect and speak frames at once: no handshake).
    pub sock: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// Starts the agent on a fresh socket in the temp directory (`name` tells tests apart).
pub fn agent(name: &str) -> Agent {
    let sock =
        std::env::temp_dir().join(format!("densevm-agent-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let child = Command::new(agent_binary())
        .arg("--unix")
        .arg(&sock)
        .stderr(Stdio::null())
        .spawn()
        .expect("start the agent");
    let t = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the agent did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Agent { child, sock }
}

/// A hybrid vsock socket at `path` in front of `agent`: a connection that sends
/// `CONNECT <port>\n` for `port` gets `OK ...\n` and is joined to a new connection to the
/// agent; any other port is closed at once, as the device does when the guest refuses.
/// Serves until the test process ends; the socket file is removed on drop.
pub struct HybridSocket {
    /// The socket to give as the VM's vsock `uds_path`.
    pub path: PathBuf,
}

impl HybridSocket {
    /// Listens at `path` for connections to `port` and joins them to `agent_sock`.
    pub fn serve(path: PathBuf, port: u32, agent_sock: PathBuf) -> Self {
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind the hybrid socket");
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let agent_sock = agent_sock.clone();
                std::thread::spawn(move || join(conn, port, &agent_sock));
            }
        });
        Self { path }
    }
}

impl Drop for HybridSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn join(conn: UnixStream, port: u32, agent_sock: &Path) {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line != format!("CONNECT {port}\n") {
        return;
    }
    let Ok(agent) = UnixStream::connect(agent_sock) else {
        return;
    };
    let mut host = reader.into_inner();
    if host.write_all(b"OK 1073741824\n").is_err() {
        return;
    }
    let (Ok(mut host_r), Ok(mut agent_w)) = (host.try_clone(), agent.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut host_r, &mut agent_w);
        let _ = agent_w.shutdown(std::net::Shutdown::Write);
    });
    let mut agent_r = agent;
    let _ = std::io::copy(&mut agent_r, &mut host);
    let _ = host.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}
