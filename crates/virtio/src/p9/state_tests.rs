//! Quiesce, save and restore of the virtio-9p device (snapshots).

use super::*;
use crate::StateError;

/// Entries of an Rreaddir body: (name, offset).
fn dirents(r: &Reply) -> Vec<(String, u64)> {
    let n = u32::from_le_bytes(r.body[..4].try_into().unwrap()) as usize;
    let mut b = &r.body[4..4 + n];
    let mut out = Vec::new();
    while !b.is_empty() {
        let off = u64::from_le_bytes(b[13..21].try_into().unwrap());
        let len = u16::from_le_bytes([b[22], b[23]]) as usize;
        out.push((String::from_utf8(b[24..24 + len].to_vec()).unwrap(), off));
        b = &b[24 + len..];
    }
    out
}

fn read(fid: u32, offset: u64, count: u32) -> Request<'static> {
    Request::Read { fid, offset, count }
}

fn readdir(fid: u32, offset: u64, count: u32) -> Request<'static> {
    Request::Readdir { fid, offset, count }
}

/// A share with `big` (100 000 bytes), `hello.txt` and a directory `d` of 40 files.
fn share_with_dir() -> (tempfile::TempDir, ShareConfig, Vec<u8>) {
    let (dir, cfg) = share(false);
    std::fs::create_dir(dir.path().join("d")).unwrap();
    for i in 0..40 {
        std::fs::write(dir.path().join(format!("d/file-{i:02}")), [i as u8]).unwrap();
    }
    let big = std::fs::read(dir.path().join("big")).unwrap();
    (dir, cfg, big)
}

fn snapshot(dev: &mut P9) -> serde_json::Value {
    let positions = dev.quiesce().unwrap();
    assert_eq!(positions.len(), 1);
    assert_eq!(
        positions[0].next_avail, positions[0].next_used,
        "every request popped was answered"
    );
    dev.save_state().unwrap()
}

#[test]
fn save_restore_continues_open_files_and_directories() {
    let (_dir, cfg, big) = share_with_dir();
    let mut dev = P9::new(cfg.clone()).unwrap();
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.open(1, "big");
    let r = g.call(4, &read(1, 0, 1000)).ok(kind::TREAD + 1);
    assert_eq!(read_data(&r), &big[..1000]);
    g.call(5, &walk(0, 2, "d")).ok(kind::TWALK + 1);
    g.call(6, &Request::Lopen { fid: 2, flags: 0 })
        .ok(kind::TLOPEN + 1);
    let first = dirents(&g.call(7, &readdir(2, 0, 400)).ok(kind::TREADDIR + 1));
    assert!(first.len() > 3 && first.len() < 42, "a partial listing");
    let resume_at = first.last().unwrap().1;

    let state = snapshot(&mut dev);
    assert_eq!(state["tag"], "share");
    let s = &state["session"];
    assert_eq!(s["msize"], 65536);
    assert_eq!(s["version"], "9P2000.L");
    let fids = s["fids"].as_array().unwrap();
    assert_eq!(fids.len(), 3);
    assert_eq!(fids[0]["path"], serde_json::json!([]));
    assert_eq!(fids[1]["path"], serde_json::json!(["big"]));
    assert_eq!(fids[1]["open"]["kind"], "file");
    assert_eq!(
        fids[1]["open"]["flags"].as_i64().unwrap() as i32 & libc::O_ACCMODE,
        libc::O_RDONLY
    );
    assert_eq!(fids[2]["path"], serde_json::json!(["d"]));
    assert_eq!(fids[2]["open"]["kind"], "dir");

    // A second device over the same directory (a restore or a clone).
    let mut dev2 = P9::new(cfg).unwrap();
    dev2.restore_state(&state).unwrap();
    assert!(!dev2.is_active());
    assert_eq!(
        dev2.save_state().unwrap(),
        state,
        "restored, not yet serving: the same state"
    );
    let mut g2 = Guest::activate(&mut dev2);
    // No Tversion/Tattach: the session goes on.
    let r = g2.call(10, &read(1, 1000, 5000)).ok(kind::TREAD + 1);
    assert_eq!(read_data(&r), &big[1000..6000]);
    let mut names: Vec<String> = first.iter().map(|(n, _)| n.clone()).collect();
    let mut at = resume_at;
    loop {
        let more = dirents(&g2.call(11, &readdir(2, at, 400)).ok(kind::TREADDIR + 1));
        let Some(last) = more.last() else { break };
        at = last.1;
        names.extend(more.into_iter().map(|(n, _)| n));
    }
    let mut expected: Vec<String> = (0..40).map(|i| format!("file-{i:02}")).collect();
    expected.extend([".".to_string(), "..".to_string()]);
    expected.sort();
    names.sort();
    assert_eq!(names, expected, "no entry repeated or lost");
    // Walk from a restored fid, then clunk everything.
    g2.call(12, &walk(2, 20, "file-07")).ok(kind::TWALK + 1);
    g2.call(13, &Request::Lopen { fid: 20, flags: 0 })
        .ok(kind::TLOPEN + 1);
    let r = g2.call(14, &read(20, 0, 10)).ok(kind::TREAD + 1);
    assert_eq!(read_data(&r), &[7]);
    for fid in [20, 2, 1] {
        g2.call(15, &Request::Clunk { fid }).ok(kind::TCLUNK + 1);
    }
    assert_eq!(g2.call(16, &getattr(1)).errno(), Some(libc::EBADF as u32));
    dev2.reset();

    // The source goes on too.
    dev.resume().unwrap();
    let r = g.call(20, &read(1, 1000, 100)).ok(kind::TREAD + 1);
    assert_eq!(read_data(&r), &big[1000..1100]);
    g.call(21, &walk(2, 30, "file-39")).ok(kind::TWALK + 1);
    g.call(22, &Request::Clunk { fid: 1 }).ok(kind::TCLUNK + 1);
    dev.reset();
}

#[test]
fn fid_of_a_file_deleted_before_restore_is_stale() {
    let (dir, cfg, _big) = share_with_dir();
    let mut dev = P9::new(cfg.clone()).unwrap();
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.open(1, "hello.txt");
    g.call(4, &walk(0, 3, "big")).ok(kind::TWALK + 1);
    let state = snapshot(&mut dev);
    dev.reset();
    std::fs::remove_file(dir.path().join("hello.txt")).unwrap();

    let mut dev2 = P9::new(cfg.clone()).unwrap();
    dev2.restore_state(&state).unwrap();
    let mut g2 = Guest::activate(&mut dev2);
    let estale = Some(libc::ESTALE as u32);
    assert_eq!(g2.call(5, &read(1, 0, 10)).errno(), estale);
    assert_eq!(g2.call(6, &getattr(1)).errno(), estale);
    assert_eq!(g2.call(7, &walk(1, 8, "x")).errno(), estale);
    g2.call(8, &getattr(3)).ok(kind::TGETATTR + 1);
    // Saved again (a snapshot of the restored VM), the fid stays stale.
    let again = snapshot(&mut dev2);
    assert_eq!(again["session"]["fids"][1]["open"]["kind"], "stale");
    dev2.resume().unwrap();
    // Tclunk releases it and the number can be used again.
    g2.call(9, &Request::Clunk { fid: 1 }).ok(kind::TCLUNK + 1);
    g2.call(10, &walk(0, 1, "big")).ok(kind::TWALK + 1);
    dev2.reset();

    // A file replaced by another of the same name is stale too (its qid differs; the old
    // one is kept, moved aside, so that the new one cannot reuse its inode number).
    std::fs::rename(dir.path().join("big"), dir.path().join("big.old")).unwrap();
    std::fs::write(dir.path().join("big"), b"new").unwrap();
    let mut dev3 = P9::new(cfg).unwrap();
    dev3.restore_state(&state).unwrap();
    let mut g3 = Guest::activate(&mut dev3);
    assert_eq!(g3.call(11, &getattr(3)).errno(), estale);
    g3.call(12, &getattr(0)).ok(kind::TGETATTR + 1);
    dev3.reset();
}

#[test]
fn garbage_state_and_another_tag_are_refused() {
    let (_dir, cfg, _big) = share_with_dir();
    let mut dev = P9::new(cfg.clone()).unwrap();
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.call(2, &walk(0, 1, "d")).ok(kind::TWALK + 1);
    let state = snapshot(&mut dev);
    dev.reset();

    let refused = |s: &serde_json::Value| {
        let mut d = P9::new(cfg.clone()).unwrap();
        let e = d.restore_state(s).unwrap_err();
        assert!(matches!(e, StateError::DeviceState { .. }), "{e}");
        assert!(!d.is_active());
        e.to_string()
    };
    refused(&serde_json::json!({"tag": "share"}));
    refused(&serde_json::json!("garbage"));
    let mut extra = state.clone();
    extra["unknown"] = serde_json::json!(1);
    refused(&extra);
    let mut other = state.clone();
    other["tag"] = serde_json::json!("other");
    assert!(refused(&other).contains("mount tag"));
    let mut dotdot = state.clone();
    dotdot["session"]["fids"][1]["path"] = serde_json::json!(["..", "etc"]);
    assert!(refused(&dotdot).contains("invalid path component"));
    let mut slash = state.clone();
    slash["session"]["fids"][1]["path"] = serde_json::json!(["d/../.."]);
    refused(&slash);
    let mut twice = state.clone();
    twice["session"]["fids"][1]["fid"] = serde_json::json!(0);
    assert!(refused(&twice).contains("twice"));
    let mut msize = state.clone();
    msize["session"]["msize"] = serde_json::json!(100);
    refused(&msize);
    let mut version = state.clone();
    version["session"]["version"] = serde_json::json!("9P2000.u");
    refused(&version);
    // The untouched state still restores.
    let mut d = P9::new(cfg).unwrap();
    d.restore_state(&state).unwrap();
}

#[test]
fn quiesce_gives_up_on_a_blocked_request_and_the_device_keeps_serving() {
    let (_dir, mut dev) = device(false);
    dev.set_quiesce_timeout(Duration::from_millis(200));
    let gate = gated(&mut dev);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.call(2, &walk(0, 1, "hello.txt")).ok(kind::TWALK + 1);
    gate.hold(100);
    let held = g.post(100, &getattr(1), ROOM);
    g.notify();
    gate.wait_started(100);
    let t = Instant::now();
    let e = dev.quiesce().unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(
        matches!(&e, StateError::Host { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
        "{e}"
    );
    assert!(e.to_string().contains("retry the snapshot"), "{e}");
    // Serving goes on: a new request is answered while the held one still runs.
    g.call(3, &getattr(0)).ok(kind::TGETATTR + 1);
    gate.release(100);
    g.wait_heads(&[held]);
    g.reply(held).ok(kind::TGETATTR + 1);
    // Nothing in flight now: the quiesce succeeds, and the device resumes.
    snapshot(&mut dev);
    dev.resume().unwrap();
    g.call(4, &getattr(1)).ok(kind::TGETATTR + 1);
    dev.reset();
}

#[test]
fn quiesce_waits_for_a_request_that_finishes_in_time() {
    let (_dir, mut dev) = device(false);
    let gate = gated(&mut dev);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    gate.hold(100);
    let held = g.post(100, &getattr(0), ROOM);
    g.notify();
    gate.wait_started(100);
    let releaser = {
        let gate = gate.0.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            gate.release(100);
        })
    };
    let positions = dev.quiesce().unwrap();
    assert_eq!(
        g.used_len(held).map(|l| l > 0),
        Some(true),
        "answered first"
    );
    assert_eq!(positions[0].next_used, positions[0].next_avail);
    releaser.join().unwrap();
    // Requests posted while quiesced wait, and are served on resume.
    let later = g.post(101, &getattr(0), ROOM);
    g.notify();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(g.used_len(later), None, "quiesced: nothing taken");
    dev.resume().unwrap();
    g.wait_heads(&[later]);
    dev.reset();
}

#[test]
fn save_is_refused_while_an_xattr_fid_is_open() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    let r = g.call(
        2,
        &Request::XattrWalk {
            fid: 0,
            newfid: 7,
            name: b"",
        },
    );
    assert_eq!(r.kind, kind::TXATTRWALK + 1, "{r:?}");
    dev.quiesce().unwrap();
    let e = dev.save_state().unwrap_err();
    assert!(e.to_string().contains("extended-attribute"), "{e}");
    dev.resume().unwrap();
    g.call(3, &Request::Clunk { fid: 7 }).ok(kind::TCLUNK + 1);
    snapshot(&mut dev);
    dev.resume().unwrap();
    dev.reset();
}

#[test]
fn save_while_serving_is_refused_and_inactive_device_saves_no_session() {
    let (_dir, mut dev) = device(false);
    assert!(dev.quiesce().unwrap().is_empty());
    let s = dev.save_state().unwrap();
    assert_eq!(s["session"], serde_json::Value::Null);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    assert!(dev.save_state().is_err(), "not quiesced");
    dev.reset();
}
