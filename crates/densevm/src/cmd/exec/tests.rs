//! The exec client against the real guest agent (lab/guest/agent.c, compiled here with the
//! host's cc) serving a unix socket instead of vsock: the same frames, no VM.

use super::*;
use std::process::{Child, Command};
use std::sync::OnceLock;

/// Builds the agent once per test process, named by a hash of its source: runs of the same
/// source reuse one binary instead of leaving one per run in the temp directory.
fn agent_binary() -> &'static Path {
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

struct Agent {
    child: Child,
    sock: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.sock);
    }
}

fn agent(name: &str) -> Agent {
    let sock =
        std::env::temp_dir().join(format!("densevm-agent-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let child = Command::new(agent_binary())
        .arg("--unix")
        .arg(&sock)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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

fn exec(
    a: &Agent,
    argv: &[&str],
    env: &[&str],
    stdin: Option<Vec<u8>>,
    timeout: Option<Duration>,
) -> (ExitReport, Vec<u8>, Vec<u8>) {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let env: Vec<String> = env.iter().map(|s| s.to_string()).collect();
    let req = request(&argv, &env, timeout).unwrap();
    let conn = UnixStream::connect(&a.sock).unwrap();
    let stdin = stdin.map(|v| Box::new(std::io::Cursor::new(v)) as Box<dyn Read + Send>);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = run(conn, &req, stdin, &mut out, &mut err).unwrap();
    (r, out, err)
}

#[test]
fn output_exit_codes_and_environment() {
    let a = agent("basic");
    let (r, out, err) = exec(
        &a,
        &["sh", "-c", "echo out; echo err >&2; exit 3"],
        &[],
        None,
        None,
    );
    assert_eq!((r.code, r.how), (3, 0));
    assert_eq!(
        (out.as_slice(), err.as_slice()),
        (&b"out\n"[..], &b"err\n"[..])
    );
    let (r, out, _) = exec(
        &a,
        &["sh", "-c", "echo \"$FOO\""],
        &["FOO=bar baz", "PATH=/bin:/usr/bin"],
        None,
        None,
    );
    assert_eq!(r.code, 0);
    assert_eq!(out, b"bar baz\n");
    let (r, out, _) = exec(&a, &["printf", "%s|", "a b", "", "c"], &[], None, None);
    assert_eq!(r.code, 0);
    assert_eq!(out, b"a b||c|", "argv passes through unsplit");
}

#[test]
fn stdin_is_forwarded_and_large_output_arrives_whole() {
    let a = agent("io");
    let input: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let (r, out, _) = exec(&a, &["cat"], &[], Some(input.clone()), None);
    assert_eq!(r.code, 0);
    assert!(
        out == input,
        "cat returned {} bytes, not the 1 MiB sent",
        out.len()
    );
    let (r, out, _) = exec(
        &a,
        &["head", "-c", "10485760", "/dev/zero"],
        &[],
        None,
        None,
    );
    assert_eq!(r.code, 0);
    assert_eq!(out.len(), 10 << 20);
    // A command that does not read its stdin still ends.
    let (r, _, _) = exec(&a, &["true"], &[], Some(vec![1u8; 4 << 20]), None);
    assert_eq!(r.code, 0);
}

#[test]
fn timeouts_signals_and_missing_commands() {
    let a = agent("ends");
    let t = Instant::now();
    let (r, _, _) = exec(
        &a,
        &["sh", "-c", "sleep 30"],
        &[],
        None,
        Some(Duration::from_millis(300)),
    );
    assert_eq!((r.code, r.how), (124, 2), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the process group was killed"
    );
    let (r, _, _) = exec(&a, &["sh", "-c", "kill -TERM $$"], &[], None, None);
    assert_eq!((r.code, r.how), (128 + 15, 1), "{r:?}");
    let (r, _, _) = exec(&a, &["/nonexistent/cmd"], &[], None, None);
    assert_eq!((r.code, r.how), (127, 3));
    assert!(
        r.message.contains("cannot execute /nonexistent/cmd"),
        "{}",
        r.message
    );
}

#[test]
fn requests_are_checked() {
    assert!(request(&[], &[], None).is_err());
    assert!(request(&["a\0b".into()], &[], None).is_err());
    let r = request(
        &["ls".into()],
        &["A=1".into()],
        Some(Duration::from_secs(2)),
    )
    .unwrap();
    assert_eq!(r[0], b'R');
    assert_eq!(&r[5..9], &2000u32.to_le_bytes());
    assert_eq!(&r[17..], b"ls\0A=1\0");
    // A malformed request is answered, not hung on.
    let a = agent("bad");
    let mut conn = UnixStream::connect(&a.sock).unwrap();
    conn.write_all(&frame(b'R', &[0u8; 12])).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = run(conn, &[], None, &mut out, &mut err).unwrap();
    assert_eq!((r.code, r.how), (126, 3));
}

#[test]
fn no_agent_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("densevm-exec-none-{}", std::process::id()));
    let e = connect(&dir.join("missing.sock"), 52)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--vsock"), "{e}");
    // A socket that closes without OK (the device when the guest refuses).
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("refuse.sock");
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut line = [0u8; 11];
        s.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"CONNECT 52\n");
    });
    let e = connect(&path, 52).unwrap_err().to_string();
    assert!(e.contains("no agent answered"), "{e}");
    t.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
