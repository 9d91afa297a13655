//! The protocol client against the real guest agent (lab/guest/agent.c, compiled here with
//! the host's cc) serving a unix socket instead of vsock: the same frames, no VM.

use super::testing::{agent, Agent, HybridSocket};
use super::*;
use std::time::Instant;

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

#[test]
fn collected_through_a_hybrid_socket_with_a_cap() {
    let a = agent("collect");
    let uds =
        std::env::temp_dir().join(format!("densevm-agent-{}-hybrid.sock", std::process::id()));
    let hybrid = HybridSocket::serve(uds, AGENT_PORT, a.sock.clone());
    let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let c = exec_collected(
        &hybrid.path,
        AGENT_PORT,
        &argv(&["sh", "-c", "cat; echo done >&2; exit 7"]),
        &[],
        b"input bytes".to_vec(),
        None,
        1 << 20,
    )
    .unwrap();
    assert_eq!((c.exit.code, c.exit.how_name()), (7, "exited"));
    assert_eq!(c.stdout, b"input bytes");
    assert_eq!(c.stderr, b"done\n");
    assert!(!c.truncated);
    // Output past the cap is dropped, and the command still runs to its end.
    let c = exec_collected(
        &hybrid.path,
        AGENT_PORT,
        &argv(&["sh", "-c", "head -c 300000 /dev/zero; exit 2"]),
        &[],
        Vec::new(),
        None,
        100_000,
    )
    .unwrap();
    assert_eq!(
        (c.exit.code, c.stdout.len(), c.truncated),
        (2, 100_000, true)
    );
    // A port nobody listens on is the no-agent error.
    let e = exec_collected(
        &hybrid.path,
        4444,
        &argv(&["true"]),
        &[],
        Vec::new(),
        None,
        10,
    )
    .unwrap_err();
    assert!(matches!(e, AgentError::Unreachable(_)), "{e}");
    // A bad environment entry is refused before connecting.
    let e = exec_collected(
        &hybrid.path,
        AGENT_PORT,
        &argv(&["true"]),
        &["X".into()],
        Vec::new(),
        None,
        10,
    )
    .unwrap_err();
    assert!(matches!(e, AgentError::Request(_)), "{e}");
    let _: &Agent = &a;
}
