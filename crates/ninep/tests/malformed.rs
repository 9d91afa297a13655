//! Malformed-message corpus and properties: any byte string yields exactly
//! one well-formed response frame (Rlerror for garbage), never a panic; the
//! codec round-trips valid requests.

mod common;

use common::{check_frame, Client, TempDir};
use densevm_9p::message::{decode_request, kind, LockArgs, Request, SetAttr};
use densevm_9p::Config;
use proptest::prelude::*;

/// One valid request of every type.
fn corpus() -> Vec<Request<'static>> {
    let lock = LockArgs {
        lock_type: 1,
        flags: 0,
        start: 0,
        length: 10,
        proc_id: 1,
        client_id: b"host",
    };
    vec![
        Request::Version {
            msize: 1 << 20,
            version: b"9P2000.L",
        },
        Request::Auth {
            afid: 9,
            uname: b"u",
            aname: b"",
            n_uname: 0,
        },
        Request::Attach {
            fid: 50,
            afid: u32::MAX,
            uname: b"u",
            aname: b"",
            n_uname: 0,
        },
        Request::Flush { oldtag: 3 },
        Request::Walk {
            fid: 0,
            newfid: 1,
            names: vec![b"f", b"..", b"."],
        },
        Request::Read {
            fid: 1,
            offset: 0,
            count: 100,
        },
        Request::Write {
            fid: 1,
            offset: 0,
            data: b"abc",
        },
        Request::Clunk { fid: 77 },
        Request::Remove { fid: 77 },
        Request::Statfs { fid: 0 },
        Request::Lopen { fid: 1, flags: 0 },
        Request::Lcreate {
            fid: 2,
            name: b"n",
            flags: 2,
            mode: 0o644,
            gid: 0,
        },
        Request::Symlink {
            fid: 0,
            name: b"s",
            target: b"t",
            gid: 0,
        },
        Request::Mknod {
            dfid: 0,
            name: b"p",
            mode: libc::S_IFIFO | 0o644,
            major: 0,
            minor: 0,
            gid: 0,
        },
        Request::Rename {
            fid: 1,
            dfid: 0,
            name: b"g",
        },
        Request::Readlink { fid: 0 },
        Request::Getattr {
            fid: 0,
            mask: 0x7ff,
        },
        Request::Setattr {
            fid: 1,
            attr: SetAttr {
                valid: 0x8,
                size: 1,
                ..SetAttr::default()
            },
        },
        Request::XattrWalk {
            fid: 0,
            newfid: 5,
            name: b"",
        },
        Request::XattrCreate {
            fid: 6,
            name: b"user.a",
            size: 1,
            flags: 0,
        },
        Request::Readdir {
            fid: 0,
            offset: 0,
            count: 4096,
        },
        Request::Fsync {
            fid: 1,
            datasync: 0,
        },
        Request::Lock { fid: 1, args: lock },
        Request::GetLock { fid: 1, args: lock },
        Request::Link {
            dfid: 0,
            fid: 1,
            name: b"h",
        },
        Request::Mkdir {
            dfid: 0,
            name: b"d",
            mode: 0o755,
            gid: 0,
        },
        Request::RenameAt {
            olddirfid: 0,
            oldname: b"a",
            newdirfid: 0,
            newname: b"b",
        },
        Request::UnlinkAt {
            dirfid: 0,
            name: b"zz",
            flags: 0,
        },
    ]
}

fn client(dir: &TempDir) -> Client {
    std::fs::write(dir.path().join("f"), b"contents").unwrap();
    let mut c = Client::new(dir.path(), Config::default());
    c.walk_n(0, 1, &["f"]).unwrap();
    c
}

#[test]
fn every_request_type_round_trips() {
    for req in corpus() {
        let mut buf = Vec::new();
        req.encode(0x1234, &mut buf);
        let (tag, back) =
            decode_request(&buf, 1 << 20).unwrap_or_else(|e| panic!("{}: {e}", req.name()));
        assert_eq!((tag, &back), (0x1234, &req));
    }
}

#[test]
fn every_truncation_of_every_request_gets_rlerror() {
    let dir = TempDir::new("trunc");
    let mut c = client(&dir);
    for req in corpus() {
        let mut full = Vec::new();
        req.encode(7, &mut full);
        for len in 0..full.len() {
            let mut cut = full[..len].to_vec();
            if len >= 4 {
                cut[..4].copy_from_slice(&(len as u32).to_le_bytes());
            }
            let r = c.raw(&cut);
            assert_eq!(r.kind, kind::RLERROR, "{} cut to {len} bytes", req.name());
        }
        // Trailing garbage is refused as well.
        let mut long = full.clone();
        long.push(0xee);
        let n = long.len() as u32;
        long[..4].copy_from_slice(&n.to_le_bytes());
        assert_eq!(
            c.raw(&long).kind,
            kind::RLERROR,
            "{} with a trailing byte",
            req.name()
        );
    }
}

#[test]
fn hostile_fields_are_rejected_cleanly() {
    let dir = TempDir::new("hostile");
    let mut c = client(&dir);
    let mut frames: Vec<Vec<u8>> = Vec::new();
    // size field larger than the buffer / smaller than the header / zero.
    for size in [0u32, 3, 7, 1000, u32::MAX] {
        let mut f = size.to_le_bytes().to_vec();
        f.extend_from_slice(&[kind::TCLUNK, 1, 0, 1, 0, 0, 0]);
        frames.push(f);
    }
    // Unknown and R-message types.
    for t in [0u8, 7, 101, 125, 255] {
        let mut f = 11u32.to_le_bytes().to_vec();
        f.extend_from_slice(&[t, 1, 0, 0, 0, 0, 0]);
        frames.push(f);
    }
    // Twrite whose count claims more than the frame holds; string length overflow.
    let mut w = Vec::new();
    Request::Write {
        fid: 1,
        offset: 0,
        data: b"abcd",
    }
    .encode(1, &mut w);
    w[15..19].copy_from_slice(&u32::MAX.to_le_bytes());
    frames.push(w);
    let mut s = Vec::new();
    Request::Mkdir {
        dfid: 0,
        name: b"abc",
        mode: 0,
        gid: 0,
    }
    .encode(1, &mut s);
    s[11..13].copy_from_slice(&u16::MAX.to_le_bytes());
    frames.push(s);
    // Names that try to escape.
    for name in [&b"../x"[..], b"a/b", b"", b"a\0b", b".", b".."] {
        let mut f = Vec::new();
        Request::Mkdir {
            dfid: 0,
            name,
            mode: 0o755,
            gid: 0,
        }
        .encode(1, &mut f);
        frames.push(f);
    }
    for f in &frames {
        let r = c.raw(f);
        assert_eq!(r.kind, kind::RLERROR, "frame {f:?} must be refused");
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() == 1,
        "nothing was created"
    );
    // The session still works.
    assert_eq!(
        c.read(1, 0, 0).err(),
        Some(libc::EBADF),
        "fid 1 is not open"
    );
    c.open(1, 0).ok("open");
    assert_eq!(c.read(1, 0, 100).unwrap(), b"contents");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random bytes: exactly one well-formed reply, never a panic.
    #[test]
    fn random_bytes_get_one_wellformed_reply(body in proptest::collection::vec(any::<u8>(), 0..200), t in any::<u8>(), fix_size in any::<bool>()) {
        let dir = TempDir::new("prop-random");
        let c = client(&dir);
        let mut f = vec![0u8; 4];
        f.push(t);
        f.extend_from_slice(&body);
        if fix_size {
            let n = f.len() as u32;
            f[..4].copy_from_slice(&n.to_le_bytes());
        }
        let mut out = Vec::new();
        c.session.handle(&f, &mut out);
        check_frame(&out);
    }

    /// Valid requests with random byte flips: one well-formed reply each.
    #[test]
    fn mutated_requests_get_one_wellformed_reply(which in 0usize..28, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let dir = TempDir::new("prop-mutate");
        let c = client(&dir);
        let reqs = corpus();
        let mut f = Vec::new();
        reqs[which % reqs.len()].encode(5, &mut f);
        for (at, v) in flips {
            let i = at % f.len();
            f[i] = v;
        }
        let mut out = Vec::new();
        c.session.handle(&f, &mut out);
        check_frame(&out);
    }

    /// Walk names and write payloads round-trip through the codec.
    #[test]
    fn walk_and_write_round_trip(names in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..16), data in proptest::collection::vec(any::<u8>(), 0..3000), off in any::<u64>()) {
        let names: Vec<&[u8]> = names.iter().map(|n| n.as_slice()).collect();
        for req in [Request::Walk { fid: 1, newfid: 2, names: names.clone() }, Request::Write { fid: 3, offset: off, data: &data }] {
            let mut buf = Vec::new();
            req.encode(9, &mut buf);
            let (_, back) = decode_request(&buf, 1 << 20).unwrap();
            prop_assert_eq!(back, req);
        }
    }
}
