//! Protocol semantics against a real directory: partial walks, xattrs
//! applied at clunk, locks, the jail, read-only exports, id mapping, msize
//! and Tflush through the worker-pool driver.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use common::{check_frame, Client, TempDir};
use densevm_9p::message::{kind, LockArgs, Request};
use densevm_9p::transport::{
    serve_connection, DriverOptions, FrameWriter, StreamReader, StreamWriter,
};
use densevm_9p::{Config, IdMap};

const RDWR: u32 = 2;

#[test]
fn version_negotiates_large_msize_and_rejects_tiny() {
    let dir = TempDir::new("version");
    let mut c = Client::new(dir.path(), Config::default());
    let r = c.call(&Request::Version {
        msize: 8 << 20,
        version: b"9P2000.L.Google.3",
    });
    let mut rd = r.reader();
    assert_eq!(
        rd.u32("msize").unwrap(),
        1 << 20,
        "msize is capped at the server maximum (1 MiB)"
    );
    assert_eq!(rd.string("version").unwrap(), b"9P2000.L");
    let r = c.call(&Request::Version {
        msize: 600 << 10,
        version: b"9P2000.L",
    });
    assert_eq!(r.reader().u32("msize").unwrap(), 600 << 10);
    let r = c.call(&Request::Version {
        msize: 1 << 20,
        version: b"9P2000.u",
    });
    let mut rd = r.reader();
    rd.u32("msize").unwrap();
    assert_eq!(rd.string("version").unwrap(), b"unknown");
    assert_eq!(
        c.call(&Request::Version {
            msize: 100,
            version: b"9P2000.L"
        })
        .errno(),
        Some(libc::EINVAL)
    );
    // Tversion reset the session: the root fid is gone.
    assert_eq!(c.clunk(0).errno(), Some(libc::EBADF));
}

#[test]
fn partial_walk_returns_fewer_qids_and_leaves_newfid_unused() {
    let dir = TempDir::new("walk");
    std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
    let mut c = Client::new(dir.path(), Config::default());
    assert_eq!(c.walk_n(0, 1, &["a", "b", "nope", "x"]), Ok(2));
    assert_eq!(
        c.clunk(1).errno(),
        Some(libc::EBADF),
        "newfid must not exist after a partial walk"
    );
    assert_eq!(c.walk_n(0, 1, &["nope"]), Err(libc::ENOENT));
    assert_eq!(c.walk_n(0, 1, &["a", "b"]), Ok(2));
    assert_eq!(c.walk_n(0, 1, &[]), Err(libc::EBADF), "newfid in use");
    // fid == newfid: walk in place.
    assert_eq!(c.walk_n(1, 1, &[".."]), Ok(1));
    let (qa, _, _) = c.getattr_qid(1).unwrap();
    assert_eq!(c.walk_n(0, 2, &["a"]), Ok(1));
    assert_eq!(c.getattr_qid(2).unwrap().0, qa);
    let names: Vec<&str> = vec!["a"; 17];
    assert_eq!(c.walk_n(0, 3, &names), Err(libc::EPROTO));
    assert_eq!(c.walk_n(0, 3, &["a/b"]), Err(libc::EINVAL));
}

#[test]
fn jail_holds_against_dotdot_and_symlinks() {
    let outer = TempDir::new("jail");
    let root = outer.path().join("export");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(outer.path().join("secret"), b"s").unwrap();
    std::os::unix::fs::symlink("/etc", root.join("abs")).unwrap();
    std::os::unix::fs::symlink("../../secret", root.join("d/rel")).unwrap();
    let mut c = Client::new(&root, Config::default());
    let (root_qid, _, _) = c.getattr_qid(0).unwrap();
    assert_eq!(c.walk_n(0, 1, &["..", "..", "d", "..", ".."]), Ok(5));
    assert_eq!(c.getattr_qid(1).unwrap().0, root_qid);
    assert_eq!(
        c.walk_n(0, 2, &["abs", "passwd"]),
        Ok(1),
        "walk stops at the symlink"
    );
    assert_eq!(c.walk_n(0, 2, &["abs"]), Ok(1));
    assert_eq!(c.open(2, 0).errno(), Some(libc::ELOOP));
    assert_eq!(c.walk_n(0, 3, &["d", "rel"]), Ok(2));
    assert_eq!(c.open(3, 0).errno(), Some(libc::ELOOP));
    // Creating through a symlink is refused too.
    assert_eq!(c.walk_n(0, 4, &["abs"]), Ok(1));
    let r = c.call(&Request::Lcreate {
        fid: 4,
        name: b"x",
        flags: RDWR,
        mode: 0o644,
        gid: 0,
    });
    assert_eq!(r.errno(), Some(libc::ENOTDIR));
}

#[test]
fn xattr_create_is_applied_at_clunk_and_walk_reads_it() {
    let dir = TempDir::new("xattr");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let mut c = Client::new(dir.path(), Config::default());
    c.walk_n(0, 1, &["f"]).unwrap();
    c.call(&Request::XattrCreate {
        fid: 1,
        name: b"user.k",
        size: 5,
        flags: 0,
    })
    .ok("xattrcreate");
    c.call(&Request::Write {
        fid: 1,
        offset: 0,
        data: b"hel",
    })
    .ok("write 1");
    let path = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        densevm_9p::sys::getxattr(&path, c"user.k", &mut buf).is_err(),
        "not applied before clunk"
    );
    c.call(&Request::Write {
        fid: 1,
        offset: 3,
        data: b"lo",
    })
    .ok("write 2");
    assert_eq!(
        c.call(&Request::Write {
            fid: 1,
            offset: 5,
            data: b"!"
        })
        .errno(),
        Some(libc::ENOSPC)
    );
    c.clunk(1).ok("clunk applies");
    let n = densevm_9p::sys::getxattr(&path, c"user.k", &mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello");

    // Read back through xattrwalk, and list.
    c.walk_n(0, 2, &["f"]).unwrap();
    let r = c
        .call(&Request::XattrWalk {
            fid: 2,
            newfid: 3,
            name: b"user.k",
        })
        .ok("xattrwalk");
    assert_eq!(r.reader().u64("size").unwrap(), 5);
    assert_eq!(c.read(3, 0, 100).unwrap(), b"hello");
    assert_eq!(c.read(3, 3, 100).unwrap(), b"lo");
    c.clunk(3).ok("clunk");
    c.call(&Request::XattrWalk {
        fid: 2,
        newfid: 3,
        name: b"",
    })
    .ok("list");
    assert!(c
        .read(3, 0, 1000)
        .unwrap()
        .windows(7)
        .any(|w| w == b"user.k\0"));
    c.clunk(3).ok("clunk");
    assert_eq!(
        c.call(&Request::XattrWalk {
            fid: 2,
            newfid: 3,
            name: b"user.none"
        })
        .errno(),
        Some(libc::ENODATA)
    );

    // A short value is not applied: clunk reports EINVAL.
    c.call(&Request::XattrCreate {
        fid: 2,
        name: b"user.short",
        size: 4,
        flags: 0,
    })
    .ok("xattrcreate");
    c.call(&Request::Write {
        fid: 2,
        offset: 0,
        data: b"ab",
    })
    .ok("write");
    assert_eq!(c.clunk(2).errno(), Some(libc::EINVAL));
    assert!(densevm_9p::sys::getxattr(&path, c"user.short", &mut buf).is_err());

    // Size 0 removes.
    c.walk_n(0, 4, &["f"]).unwrap();
    c.call(&Request::XattrCreate {
        fid: 4,
        name: b"user.k",
        size: 0,
        flags: 0,
    })
    .ok("remove");
    c.clunk(4).ok("clunk removes");
    assert!(densevm_9p::sys::getxattr(&path, c"user.k", &mut buf).is_err());
}

fn lock(c: &mut Client, fid: u32, lock_type: u8, start: u64, length: u64) -> u8 {
    let args = LockArgs {
        lock_type,
        flags: 0,
        start,
        length,
        proc_id: fid,
        client_id: b"t",
    };
    let r = c.call(&Request::Lock { fid, args }).ok("lock");
    r.reader().u8("status").unwrap()
}

#[test]
fn locks_conflict_across_fids_and_getlock_reports_holder() {
    let dir = TempDir::new("lock");
    std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
    let mut c = Client::new(dir.path(), Config::default());
    for fid in [1, 2] {
        c.walk_n(0, fid, &["f"]).unwrap();
        c.open(fid, RDWR).ok("open");
    }
    assert_eq!(lock(&mut c, 1, 1, 0, 5), 0, "write lock granted");
    assert_eq!(
        lock(&mut c, 2, 1, 2, 2),
        1,
        "overlapping lock from another fid is blocked"
    );
    let args = LockArgs {
        lock_type: 1,
        flags: 0,
        start: 0,
        length: 10,
        proc_id: 9,
        client_id: b"t",
    };
    let r = c.call(&Request::GetLock { fid: 2, args }).ok("getlock");
    let mut rd = r.reader();
    assert_eq!(
        rd.u8("type").unwrap(),
        1,
        "getlock reports the conflicting write lock"
    );
    assert_eq!(rd.u64("start").unwrap(), 0);
    assert_eq!(rd.u64("length").unwrap(), 5);
    assert_eq!(lock(&mut c, 2, 1, 5, 5), 0, "disjoint range is free");
    assert_eq!(lock(&mut c, 1, 2, 0, 5), 0, "unlock");
    assert_eq!(lock(&mut c, 2, 0, 0, 5), 0, "free after unlock");
    c.walk_n(0, 3, &["f"]).unwrap();
    let args = LockArgs {
        lock_type: 1,
        flags: 0,
        start: 0,
        length: 1,
        proc_id: 1,
        client_id: b"t",
    };
    assert_eq!(
        c.call(&Request::Lock { fid: 3, args }).errno(),
        Some(libc::EBADF),
        "lock needs an open fid"
    );
}

#[test]
fn unlinked_while_open_keeps_working() {
    let dir = TempDir::new("unlink");
    let mut c = Client::new(dir.path(), Config::default());
    c.walk_n(0, 1, &[]).unwrap();
    c.call(&Request::Lcreate {
        fid: 1,
        name: b"v",
        flags: RDWR,
        mode: 0o600,
        gid: u32::MAX,
    })
    .ok("create");
    c.call(&Request::Write {
        fid: 1,
        offset: 0,
        data: b"abc",
    })
    .ok("write");
    c.call(&Request::UnlinkAt {
        dirfid: 0,
        name: b"v",
        flags: 0,
    })
    .ok("unlink");
    assert!(!dir.path().join("v").exists());
    let r = c
        .call(&Request::Getattr {
            fid: 1,
            mask: 0x7ff,
        })
        .ok("getattr");
    let mut rd = r.reader();
    rd.bytes(8 + 13 + 12, "skip").unwrap();
    assert_eq!(rd.u64("nlink").unwrap(), 0);
    assert_eq!(c.read(1, 0, 10).unwrap(), b"abc");
    // Remove of the root is refused; remove of a path works and clunks.
    assert_eq!(
        c.call(&Request::Remove { fid: 0 }).errno(),
        Some(libc::EBUSY)
    );
}

#[test]
fn readonly_export_refuses_changes() {
    let dir = TempDir::new("ro");
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    let cfg = Config {
        readonly: true,
        ..Config::default()
    };
    let mut c = Client::new(dir.path(), cfg);
    c.walk_n(0, 1, &["f"]).unwrap();
    assert_eq!(c.open(1, RDWR).errno(), Some(libc::EROFS));
    assert_eq!(c.open(1, 0o1000).errno(), Some(libc::EROFS), "O_TRUNC");
    c.open(1, 0).ok("read-only open");
    assert_eq!(c.read(1, 0, 10).unwrap(), b"data");
    let reqs = [
        Request::Mkdir {
            dfid: 0,
            name: b"d",
            mode: 0o755,
            gid: 0,
        },
        Request::UnlinkAt {
            dirfid: 0,
            name: b"f",
            flags: 0,
        },
        Request::RenameAt {
            olddirfid: 0,
            oldname: b"f",
            newdirfid: 0,
            newname: b"g",
        },
        Request::XattrCreate {
            fid: 0,
            name: b"user.x",
            size: 1,
            flags: 0,
        },
        Request::Symlink {
            fid: 0,
            name: b"s",
            target: b"f",
            gid: 0,
        },
    ];
    for r in &reqs {
        assert_eq!(
            c.call(r).errno(),
            Some(libc::EROFS),
            "{} on a read-only export",
            r.name()
        );
    }
}

#[test]
fn uid_and_gid_maps_apply_both_ways() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root to chown files (run the suite as root)");
    }
    let dir = TempDir::new("idmap");
    let mut uid_map = IdMap::identity();
    uid_map.add("0:1000:10").unwrap();
    let mut gid_map = IdMap::identity();
    gid_map.add("0:2000:10").unwrap();
    let cfg = Config {
        uid_map,
        gid_map,
        ..Config::default()
    };
    let mut c = Client::new(dir.path(), cfg);
    c.call(&Request::Mkdir {
        dfid: 0,
        name: b"d",
        mode: 0o755,
        gid: 3,
    })
    .ok("mkdir");
    let md = std::fs::metadata(dir.path().join("d")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (md.uid(), md.gid()),
        (1000, 2003),
        "guest 0/3 stored as host 1000/2003"
    );
    c.walk_n(0, 1, &["d"]).unwrap();
    assert_eq!(c.getattr_qid(1).map(|(_, u, g)| (u, g)), Ok((0, 3)));
    std::os::unix::fs::chown(dir.path().join("d"), Some(5), Some(5)).unwrap();
    assert_eq!(
        c.getattr_qid(1).map(|(_, u, g)| (u, g)),
        Ok((65534, 65534)),
        "unmapped host ids"
    );
}

fn read_frame(s: &mut UnixStream) -> Vec<u8> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size).unwrap();
    let n = u32::from_le_bytes(size) as usize;
    let mut f = size.to_vec();
    f.resize(n, 0);
    s.read_exact(&mut f[4..]).unwrap();
    f
}

#[test]
fn stream_driver_serves_concurrently_and_answers_flush_and_oversize() {
    let dir = TempDir::new("driver");
    std::fs::write(dir.path().join("f"), vec![7u8; 300_000]).unwrap();
    let server = densevm_9p::Server::new(dir.path(), Config::default()).unwrap();
    let (mut client, srv) = UnixStream::pair().unwrap();
    let w: Arc<dyn FrameWriter> = Arc::new(StreamWriter(Mutex::new(srv.try_clone().unwrap())));
    let session = Arc::new(server.session());
    let t = std::thread::spawn(move || {
        serve_connection(session, StreamReader::new(srv), w, DriverOptions::default())
    });
    let mut client2 = client.try_clone().unwrap();
    // Setup requests depend on each other (walk needs the attached fid), so each waits
    // for its reply, as a real client does; the server may serve queued requests in any order.
    let mut send = |req: Request<'_>, tag: u16| {
        let mut b = Vec::new();
        req.encode(tag, &mut b);
        client.write_all(&b).unwrap();
        check_frame(&read_frame(&mut client2)).ok("setup");
    };
    send(
        Request::Version {
            msize: 512 << 10,
            version: b"9P2000.L",
        },
        0xffff,
    );
    send(
        Request::Attach {
            fid: 0,
            afid: u32::MAX,
            uname: b"",
            aname: b"",
            n_uname: 0,
        },
        1,
    );
    send(
        Request::Walk {
            fid: 0,
            newfid: 1,
            names: vec![b"f"],
        },
        2,
    );
    send(Request::Lopen { fid: 1, flags: 0 }, 3);
    // Pipelined large reads plus a flush of one of them, written from their own thread:
    // the replies (3 MB) exceed the socket buffer, so the client must read while it writes
    // or both ends block on full buffers.
    let mut writer = client2.try_clone().unwrap();
    let writer_thread = std::thread::spawn(move || {
        for tag in 10..20u16 {
            let mut b = Vec::new();
            Request::Read {
                fid: 1,
                offset: 0,
                count: 300_000,
            }
            .encode(tag, &mut b);
            writer.write_all(&b).unwrap();
        }
        let mut b = Vec::new();
        Request::Flush { oldtag: 15 }.encode(30, &mut b);
        writer.write_all(&b).unwrap();
        // An oversized frame (declares 512 KiB + 1 > msize) is discarded with EMSGSIZE.
        let big = (512u32 << 10) + 1;
        let mut hdr = big.to_le_bytes().to_vec();
        hdr.extend_from_slice(&[kind::TREAD, 40, 0]);
        hdr.resize(big as usize, 0);
        writer.write_all(&hdr).unwrap();
    });
    let mut seen = std::collections::HashMap::new();
    let mut flush_after_15 = None;
    let done = |seen: &std::collections::HashMap<u16, common::Reply>, flushed: Option<bool>| {
        seen.contains_key(&30)
            && seen.contains_key(&40)
            && (10..20u16).all(|t| seen.contains_key(&t) || (t == 15 && flushed == Some(false)))
    };
    while !done(&seen, flush_after_15) {
        let f = read_frame(&mut client2);
        let tag = u16::from_le_bytes([f[5], f[6]]);
        let r = check_frame(&f);
        if tag == 30 {
            assert_eq!(r.kind, kind::TFLUSH + 1);
            flush_after_15 = Some(seen.contains_key(&15));
        }
        assert!(seen.insert(tag, r).is_none(), "one reply per tag ({tag})");
    }
    writer_thread.join().unwrap();
    assert_eq!(seen.get(&40).and_then(|r| r.errno()), Some(libc::EMSGSIZE));
    for tag in 10..20u16 {
        if tag == 15 && !seen.contains_key(&15) {
            continue; // flushed before it started: no reply
        }
        let r = &seen[&tag];
        assert_eq!(r.reader().u32("count").unwrap(), 300_000, "tag {tag}");
    }
    assert!(flush_after_15.is_some(), "Rflush arrived");
    if seen.contains_key(&15) {
        assert_eq!(
            flush_after_15,
            Some(true),
            "Rflush must follow the flushed request's reply"
        );
    }
    drop(client);
    drop(client2);
    t.join().unwrap().unwrap();
}
