//! `Session::handle_nowait`: the transport's reader serves cached requests
//! itself and hands the rest to workers. A declined request must change
//! nothing, and what is served must equal what `handle` answers.

mod common;

use common::{check_frame, Client, TempDir};
use densevm_9p::message::{kind, Request};
use densevm_9p::Config;

fn frame(req: &Request<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    req.encode(7, &mut b);
    b
}

/// `Some(reply)` when served without waiting, `None` when declined (and then
/// nothing was appended).
fn nowait(c: &Client, req: &Request<'_>) -> Option<common::Reply> {
    let mut out = b"keep".to_vec();
    let served = c.session.handle_nowait(&frame(req), &mut out).is_some();
    assert_eq!(&out[..4], b"keep", "earlier replies are never touched");
    if !served {
        assert_eq!(out.len(), 4, "a declined request appends nothing");
        return None;
    }
    Some(check_frame(&out[4..]))
}

#[test]
fn cached_walk_open_read_clunk_are_served_inline() {
    let dir = TempDir::new("nowait-inline");
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/f"), b"contents").unwrap();
    // A page-multiple size: the short page-cache read must be told from EOF.
    std::fs::write(dir.path().join("d/page"), vec![3u8; 8192]).unwrap();
    let c = Client::new(dir.path(), Config::default());
    let _ = std::fs::read(dir.path().join("d/f")).unwrap();
    let _ = std::fs::read(dir.path().join("d/page")).unwrap();

    let walk = Request::Walk {
        fid: 0,
        newfid: 1,
        names: vec![b"d", b"f"],
    };
    let r = nowait(&c, &walk).expect("walk of cached names is served");
    assert_eq!(r.reader().u16("nwqid").unwrap(), 2);
    nowait(&c, &Request::Lopen { fid: 1, flags: 0 })
        .expect("read-only open is served")
        .ok("lopen");
    let r = nowait(
        &c,
        &Request::Read {
            fid: 1,
            offset: 0,
            count: 4096,
        },
    )
    .expect("cached read is served");
    let mut rd = r.reader();
    let n = rd.u32("count").unwrap() as usize;
    assert_eq!(rd.bytes(n, "data").unwrap(), b"contents");
    let r = nowait(
        &c,
        &Request::Read {
            fid: 1,
            offset: 100,
            count: 4096,
        },
    )
    .expect("read past EOF is served");
    assert_eq!(r.reader().u32("count").unwrap(), 0);
    nowait(
        &c,
        &Request::Getattr {
            fid: 1,
            mask: 0x7ff,
        },
    )
    .expect("getattr is served")
    .ok("getattr");
    nowait(&c, &Request::Clunk { fid: 1 })
        .expect("clunk is served")
        .ok("clunk");
    assert_eq!(c.session.fid_count(), 1);

    // A file of exactly two pages, read with a larger count: all of it, once
    // served (a declined read is fine: the worker's pread answers then).
    let mut c = c;
    c.walk_n(0, 2, &["d", "page"]).unwrap();
    c.open(2, 0).ok("open page");
    let req = Request::Read {
        fid: 2,
        offset: 0,
        count: 65536,
    };
    if let Some(r) = nowait(&c, &req) {
        assert_eq!(r.reader().u32("count").unwrap(), 8192);
    }
    assert_eq!(c.read(2, 4096, 65536).unwrap(), vec![3u8; 4096]);
    assert_eq!(c.read(2, 8192, 65536).unwrap(), b"");
}

#[test]
fn requests_that_may_wait_are_declined_without_effect() {
    let dir = TempDir::new("nowait-declined");
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let mut c = Client::new(dir.path(), Config::default());
    c.walk_n(0, 1, &["f"]).unwrap();

    // Opening for writing, writing, creating: a worker's job.
    assert!(nowait(&c, &Request::Lopen { fid: 1, flags: 2 }).is_none());
    c.nowait = false;
    c.open(1, 2).ok("open rw");
    let write = Request::Write {
        fid: 1,
        offset: 0,
        data: b"y",
    };
    assert!(nowait(&c, &write).is_none());
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"x");
    let mkdir = Request::Mkdir {
        dfid: 0,
        name: b"sub",
        mode: 0o755,
        gid: 0,
    };
    assert!(nowait(&c, &mkdir).is_none());
    assert!(!dir.path().join("sub").exists());

    // A clunk that applies a pending xattr write is declined and keeps the fid.
    c.walk_n(0, 2, &["f"]).unwrap();
    c.call(&Request::XattrCreate {
        fid: 2,
        name: b"user.k",
        size: 0,
        flags: 0,
    })
    .ok("xattrcreate");
    assert!(nowait(&c, &Request::Clunk { fid: 2 }).is_none());
    assert_eq!(c.session.fid_count(), 3);

    // A walk to a name the dentry cache does not know is declined or fails
    // as the blocking walk does; it never creates newfid when declined.
    let walk = Request::Walk {
        fid: 0,
        newfid: 9,
        names: vec![b"never-seen"],
    };
    match nowait(&c, &walk) {
        None => assert_eq!(c.session.fid_count(), 3),
        Some(r) => assert_eq!(r.errno(), Some(libc::ENOENT)),
    }
    assert_eq!(c.walk(0, 9, &["never-seen"]).errno(), Some(libc::ENOENT));

    // Malformed frames are answered inline (Rlerror), never declined.
    let mut out = Vec::new();
    let bad = [9u8, 0, 0, 0, kind::TWALK, 1, 0, 0, 0];
    assert!(c.session.handle_nowait(&bad, &mut out).is_some());
    assert_eq!(check_frame(&out).kind, kind::RLERROR);
}
