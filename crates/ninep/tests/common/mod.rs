//! A minimal in-process 9P client over a [`Session`], for protocol tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use densevm_9p::message::{kind, Request};
use densevm_9p::wire::{Reader, HEADER_LEN};
use densevm_9p::{Config, Qid, Server, Session};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "ninep-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A session plus request helpers. Fid 0 is attached to the root.
pub struct Client {
    pub session: Session,
    pub server: Arc<Server>,
    tag: u16,
    /// Try [`Session::handle_nowait`] first, as the stream transport does
    /// (default); false: [`Session::handle`] only.
    pub nowait: bool,
}

/// A decoded response: its type and body.
#[derive(Debug)]
pub struct Reply {
    pub kind: u8,
    pub body: Vec<u8>,
}

impl Reply {
    /// The errno of an Rlerror (panics otherwise, this is test code).
    pub fn errno(&self) -> Option<i32> {
        (self.kind == kind::RLERROR).then(|| i32::from_le_bytes(self.body[..4].try_into().unwrap()))
    }
    pub fn reader(&self) -> Reader<'_> {
        Reader::new(&self.body)
    }
    pub fn ok(self, what: &str) -> Reply {
        assert!(
            self.errno().is_none(),
            "{what} failed: errno {:?}",
            self.errno()
        );
        self
    }
}

impl Client {
    pub fn new(root: &Path, cfg: Config) -> Client {
        let server = Server::new(root, cfg).unwrap();
        let session = server.session();
        let mut c = Client {
            session,
            server,
            tag: 0,
            nowait: true,
        };
        let r = c.call(&Request::Version {
            msize: 1 << 20,
            version: b"9P2000.L",
        });
        assert_eq!(r.kind, kind::TVERSION + 1);
        c.call(&Request::Attach {
            fid: 0,
            afid: u32::MAX,
            uname: b"root",
            aname: b"",
            n_uname: 0,
        })
        .ok("attach");
        c
    }

    /// Sends raw frame bytes and parses the single response frame.
    pub fn raw(&mut self, frame: &[u8]) -> Reply {
        let mut out = Vec::new();
        if !(self.nowait && self.session.handle_nowait(frame, &mut out).is_some()) {
            assert!(out.is_empty(), "a declined request appends nothing");
            self.session.handle(frame, &mut out);
        }
        check_frame(&out)
    }

    pub fn call(&mut self, req: &Request<'_>) -> Reply {
        self.tag = self.tag.wrapping_add(1) % 0xfffe;
        let mut buf = Vec::new();
        req.encode(self.tag, &mut buf);
        self.raw(&buf)
    }

    pub fn walk(&mut self, fid: u32, newfid: u32, names: &[&str]) -> Reply {
        let names = names.iter().map(|n| n.as_bytes()).collect();
        self.call(&Request::Walk { fid, newfid, names })
    }

    /// Walks and returns the number of qids.
    pub fn walk_n(&mut self, fid: u32, newfid: u32, names: &[&str]) -> Result<usize, i32> {
        let r = self.walk(fid, newfid, names);
        match r.errno() {
            Some(e) => Err(e),
            None => Ok(r.reader().u16("nwqid").unwrap() as usize),
        }
    }

    pub fn clunk(&mut self, fid: u32) -> Reply {
        self.call(&Request::Clunk { fid })
    }

    pub fn open(&mut self, fid: u32, flags: u32) -> Reply {
        self.call(&Request::Lopen { fid, flags })
    }

    pub fn read(&mut self, fid: u32, offset: u64, count: u32) -> Result<Vec<u8>, i32> {
        let r = self.call(&Request::Read { fid, offset, count });
        if let Some(e) = r.errno() {
            return Err(e);
        }
        let mut rd = r.reader();
        let n = rd.u32("count").unwrap() as usize;
        Ok(rd.bytes(n, "data").unwrap().to_vec())
    }

    pub fn getattr_qid(&mut self, fid: u32) -> Result<(Qid, u32, u32), i32> {
        let r = self.call(&Request::Getattr { fid, mask: 0x7ff });
        if let Some(e) = r.errno() {
            return Err(e);
        }
        let mut rd = r.reader();
        rd.u64("valid").unwrap();
        let q = Qid::decode(&mut rd).unwrap();
        let _mode = rd.u32("mode").unwrap();
        let uid = rd.u32("uid").unwrap();
        let gid = rd.u32("gid").unwrap();
        Ok((q, uid, gid))
    }
}

/// Asserts `out` is exactly one well-formed frame and parses it.
pub fn check_frame(out: &[u8]) -> Reply {
    assert!(out.len() >= HEADER_LEN, "response shorter than a header");
    let size = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
    assert_eq!(size, out.len(), "response size field must match its length");
    let k = out[4];
    assert!(k % 2 == 1, "response type {k} must be an R-message");
    if k == kind::RLERROR {
        assert_eq!(size, HEADER_LEN + 4, "Rlerror carries exactly ecode[4]");
    }
    Reply {
        kind: k,
        body: out[HEADER_LEN..].to_vec(),
    }
}
