//! 9P2000.L request messages: strict decoding (and encoding, for clients,
//! tests and fuzzing).
//!
//! A request is decoded from one complete frame (`size[4] type[1] tag[2] body`).
//! Names and data are borrowed from the frame.

use crate::wire::{DecodeError, Reader, Writer, HEADER_LEN};

/// Maximum number of names in one Twalk (protocol limit).
pub const MAX_WALK_ELEMENTS: usize = 16;
/// The tag value meaning "no tag" (used by Tversion).
pub const NOTAG: u16 = 0xffff;
/// The fid value meaning "no fid".
pub const NOFID: u32 = 0xffff_ffff;

/// Message type numbers (T = request, R = response = T + 1).
#[allow(missing_docs)]
pub mod kind {
    pub const RLERROR: u8 = 7;
    pub const TSTATFS: u8 = 8;
    pub const TLOPEN: u8 = 12;
    pub const TLCREATE: u8 = 14;
    pub const TSYMLINK: u8 = 16;
    pub const TMKNOD: u8 = 18;
    pub const TRENAME: u8 = 20;
    pub const TREADLINK: u8 = 22;
    pub const TGETATTR: u8 = 24;
    pub const TSETATTR: u8 = 26;
    pub const TXATTRWALK: u8 = 30;
    pub const TXATTRCREATE: u8 = 32;
    pub const TREADDIR: u8 = 40;
    pub const TFSYNC: u8 = 50;
    pub const TLOCK: u8 = 52;
    pub const TGETLOCK: u8 = 54;
    pub const TLINK: u8 = 70;
    pub const TMKDIR: u8 = 72;
    pub const TRENAMEAT: u8 = 74;
    pub const TUNLINKAT: u8 = 76;
    pub const TVERSION: u8 = 100;
    pub const TAUTH: u8 = 102;
    pub const TATTACH: u8 = 104;
    pub const TFLUSH: u8 = 108;
    pub const TWALK: u8 = 110;
    pub const TREAD: u8 = 116;
    pub const TWRITE: u8 = 118;
    pub const TCLUNK: u8 = 120;
    pub const TREMOVE: u8 = 122;
}

/// A server-unique file identity: type, version and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Qid {
    /// QTDIR (0x80), QTSYMLINK (0x02) or QTFILE (0).
    pub kind: u8,
    /// Version (0: not tracked).
    pub version: u32,
    /// Unique path (derived from the inode).
    pub path: u64,
}

impl Qid {
    /// Encoded size in bytes.
    pub const LEN: usize = 13;

    /// Appends the 13-byte encoding.
    pub fn encode(&self, w: &mut Writer<'_>) {
        w.u8(self.kind).u32(self.version).u64(self.path);
    }

    /// Reads a qid.
    pub fn decode(r: &mut Reader<'_>) -> Result<Qid, DecodeError> {
        Ok(Qid {
            kind: r.u8("qid.type")?,
            version: r.u32("qid.version")?,
            path: r.u64("qid.path")?,
        })
    }
}

/// Fields of Tsetattr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct SetAttr {
    pub valid: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_sec: u64,
    pub atime_nsec: u64,
    pub mtime_sec: u64,
    pub mtime_nsec: u64,
}

/// Fields shared by Tlock and Tgetlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LockArgs<'a> {
    pub lock_type: u8,
    pub flags: u32,
    pub start: u64,
    pub length: u64,
    pub proc_id: u32,
    pub client_id: &'a [u8],
}

/// One decoded 9P2000.L request body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Request<'a> {
    Version {
        msize: u32,
        version: &'a [u8],
    },
    Auth {
        afid: u32,
        uname: &'a [u8],
        aname: &'a [u8],
        n_uname: u32,
    },
    Attach {
        fid: u32,
        afid: u32,
        uname: &'a [u8],
        aname: &'a [u8],
        n_uname: u32,
    },
    Flush {
        oldtag: u16,
    },
    Walk {
        fid: u32,
        newfid: u32,
        names: Vec<&'a [u8]>,
    },
    Read {
        fid: u32,
        offset: u64,
        count: u32,
    },
    Write {
        fid: u32,
        offset: u64,
        data: &'a [u8],
    },
    Clunk {
        fid: u32,
    },
    Remove {
        fid: u32,
    },
    Statfs {
        fid: u32,
    },
    Lopen {
        fid: u32,
        flags: u32,
    },
    Lcreate {
        fid: u32,
        name: &'a [u8],
        flags: u32,
        mode: u32,
        gid: u32,
    },
    Symlink {
        fid: u32,
        name: &'a [u8],
        target: &'a [u8],
        gid: u32,
    },
    Mknod {
        dfid: u32,
        name: &'a [u8],
        mode: u32,
        major: u32,
        minor: u32,
        gid: u32,
    },
    Rename {
        fid: u32,
        dfid: u32,
        name: &'a [u8],
    },
    Readlink {
        fid: u32,
    },
    Getattr {
        fid: u32,
        mask: u64,
    },
    Setattr {
        fid: u32,
        attr: SetAttr,
    },
    XattrWalk {
        fid: u32,
        newfid: u32,
        name: &'a [u8],
    },
    XattrCreate {
        fid: u32,
        name: &'a [u8],
        size: u64,
        flags: u32,
    },
    Readdir {
        fid: u32,
        offset: u64,
        count: u32,
    },
    Fsync {
        fid: u32,
        datasync: u32,
    },
    Lock {
        fid: u32,
        args: LockArgs<'a>,
    },
    GetLock {
        fid: u32,
        args: LockArgs<'a>,
    },
    Link {
        dfid: u32,
        fid: u32,
        name: &'a [u8],
    },
    Mkdir {
        dfid: u32,
        name: &'a [u8],
        mode: u32,
        gid: u32,
    },
    RenameAt {
        olddirfid: u32,
        oldname: &'a [u8],
        newdirfid: u32,
        newname: &'a [u8],
    },
    UnlinkAt {
        dirfid: u32,
        name: &'a [u8],
        flags: u32,
    },
}

/// A frame's header: declared size, type and tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Declared total size.
    pub size: u32,
    /// Message type.
    pub kind: u8,
    /// Request tag.
    pub tag: u16,
}

/// Parses the 7-byte header; fails when the buffer is shorter.
pub fn parse_header(frame: &[u8]) -> Result<Header, DecodeError> {
    let mut r = Reader::new(frame);
    Ok(Header {
        size: r.u32("size")?,
        kind: r.u8("type")?,
        tag: r.u16("tag")?,
    })
}

/// Decodes one complete frame whose size must equal `frame.len()` and be at
/// most `max_size`. Returns the tag and the request.
pub fn decode_request(frame: &[u8], max_size: usize) -> Result<(u16, Request<'_>), DecodeError> {
    let h = parse_header(frame)?;
    if h.size as usize != frame.len() || frame.len() > max_size || frame.len() < HEADER_LEN {
        return Err(DecodeError::BadSize {
            size: h.size,
            len: frame.len(),
            limit: max_size,
        });
    }
    let mut r = Reader::new(&frame[HEADER_LEN..]);
    let req = decode_body(h.kind, &mut r)?;
    r.finish(req.name())?;
    Ok((h.tag, req))
}

fn lock_args<'a>(r: &mut Reader<'a>, with_flags: bool) -> Result<LockArgs<'a>, DecodeError> {
    let lock_type = r.u8("lock.type")?;
    let flags = if with_flags { r.u32("lock.flags")? } else { 0 };
    Ok(LockArgs {
        lock_type,
        flags,
        start: r.u64("lock.start")?,
        length: r.u64("lock.length")?,
        proc_id: r.u32("lock.proc_id")?,
        client_id: r.string("lock.client_id")?,
    })
}

fn decode_body<'a>(kind: u8, r: &mut Reader<'a>) -> Result<Request<'a>, DecodeError> {
    use kind::*;
    Ok(match kind {
        TVERSION => Request::Version {
            msize: r.u32("msize")?,
            version: r.string("version")?,
        },
        TAUTH => Request::Auth {
            afid: r.u32("afid")?,
            uname: r.string("uname")?,
            aname: r.string("aname")?,
            n_uname: r.u32("n_uname")?,
        },
        TATTACH => Request::Attach {
            fid: r.u32("fid")?,
            afid: r.u32("afid")?,
            uname: r.string("uname")?,
            aname: r.string("aname")?,
            n_uname: r.u32("n_uname")?,
        },
        TFLUSH => Request::Flush {
            oldtag: r.u16("oldtag")?,
        },
        TWALK => {
            let fid = r.u32("fid")?;
            let newfid = r.u32("newfid")?;
            let n = r.u16("nwname")? as usize;
            if n > MAX_WALK_ELEMENTS {
                return Err(DecodeError::Invalid {
                    field: "nwname",
                    why: "more than 16 names",
                });
            }
            let mut names = Vec::with_capacity(n);
            for _ in 0..n {
                names.push(r.string("wname")?);
            }
            Request::Walk { fid, newfid, names }
        }
        TREAD => Request::Read {
            fid: r.u32("fid")?,
            offset: r.u64("offset")?,
            count: r.u32("count")?,
        },
        TWRITE => {
            let fid = r.u32("fid")?;
            let offset = r.u64("offset")?;
            let count = r.u32("count")? as usize;
            Request::Write {
                fid,
                offset,
                data: r.bytes(count, "data")?,
            }
        }
        TCLUNK => Request::Clunk { fid: r.u32("fid")? },
        TREMOVE => Request::Remove { fid: r.u32("fid")? },
        TSTATFS => Request::Statfs { fid: r.u32("fid")? },
        TLOPEN => Request::Lopen {
            fid: r.u32("fid")?,
            flags: r.u32("flags")?,
        },
        TLCREATE => Request::Lcreate {
            fid: r.u32("fid")?,
            name: r.string("name")?,
            flags: r.u32("flags")?,
            mode: r.u32("mode")?,
            gid: r.u32("gid")?,
        },
        TSYMLINK => Request::Symlink {
            fid: r.u32("fid")?,
            name: r.string("name")?,
            target: r.string("symtgt")?,
            gid: r.u32("gid")?,
        },
        TMKNOD => Request::Mknod {
            dfid: r.u32("dfid")?,
            name: r.string("name")?,
            mode: r.u32("mode")?,
            major: r.u32("major")?,
            minor: r.u32("minor")?,
            gid: r.u32("gid")?,
        },
        TRENAME => Request::Rename {
            fid: r.u32("fid")?,
            dfid: r.u32("dfid")?,
            name: r.string("name")?,
        },
        TREADLINK => Request::Readlink { fid: r.u32("fid")? },
        TGETATTR => Request::Getattr {
            fid: r.u32("fid")?,
            mask: r.u64("request_mask")?,
        },
        TSETATTR => Request::Setattr {
            fid: r.u32("fid")?,
            attr: SetAttr {
                valid: r.u32("valid")?,
                mode: r.u32("mode")?,
                uid: r.u32("uid")?,
                gid: r.u32("gid")?,
                size: r.u64("size")?,
                atime_sec: r.u64("atime_sec")?,
                atime_nsec: r.u64("atime_nsec")?,
                mtime_sec: r.u64("mtime_sec")?,
                mtime_nsec: r.u64("mtime_nsec")?,
            },
        },
        TXATTRWALK => Request::XattrWalk {
            fid: r.u32("fid")?,
            newfid: r.u32("newfid")?,
            name: r.string("name")?,
        },
        TXATTRCREATE => Request::XattrCreate {
            fid: r.u32("fid")?,
            name: r.string("name")?,
            size: r.u64("attr_size")?,
            flags: r.u32("flags")?,
        },
        TREADDIR => Request::Readdir {
            fid: r.u32("fid")?,
            offset: r.u64("offset")?,
            count: r.u32("count")?,
        },
        TFSYNC => Request::Fsync {
            fid: r.u32("fid")?,
            datasync: r.u32("datasync")?,
        },
        TLOCK => Request::Lock {
            fid: r.u32("fid")?,
            args: lock_args(r, true)?,
        },
        TGETLOCK => Request::GetLock {
            fid: r.u32("fid")?,
            args: lock_args(r, false)?,
        },
        TLINK => Request::Link {
            dfid: r.u32("dfid")?,
            fid: r.u32("fid")?,
            name: r.string("name")?,
        },
        TMKDIR => Request::Mkdir {
            dfid: r.u32("dfid")?,
            name: r.string("name")?,
            mode: r.u32("mode")?,
            gid: r.u32("gid")?,
        },
        TRENAMEAT => Request::RenameAt {
            olddirfid: r.u32("olddirfid")?,
            oldname: r.string("oldname")?,
            newdirfid: r.u32("newdirfid")?,
            newname: r.string("newname")?,
        },
        TUNLINKAT => Request::UnlinkAt {
            dirfid: r.u32("dirfid")?,
            name: r.string("name")?,
            flags: r.u32("flags")?,
        },
        other => return Err(DecodeError::UnknownType(other)),
    })
}

impl Request<'_> {
    /// The message name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Version { .. } => "Tversion",
            Request::Auth { .. } => "Tauth",
            Request::Attach { .. } => "Tattach",
            Request::Flush { .. } => "Tflush",
            Request::Walk { .. } => "Twalk",
            Request::Read { .. } => "Tread",
            Request::Write { .. } => "Twrite",
            Request::Clunk { .. } => "Tclunk",
            Request::Remove { .. } => "Tremove",
            Request::Statfs { .. } => "Tstatfs",
            Request::Lopen { .. } => "Tlopen",
            Request::Lcreate { .. } => "Tlcreate",
            Request::Symlink { .. } => "Tsymlink",
            Request::Mknod { .. } => "Tmknod",
            Request::Rename { .. } => "Trename",
            Request::Readlink { .. } => "Treadlink",
            Request::Getattr { .. } => "Tgetattr",
            Request::Setattr { .. } => "Tsetattr",
            Request::XattrWalk { .. } => "Txattrwalk",
            Request::XattrCreate { .. } => "Txattrcreate",
            Request::Readdir { .. } => "Treaddir",
            Request::Fsync { .. } => "Tfsync",
            Request::Lock { .. } => "Tlock",
            Request::GetLock { .. } => "Tgetlock",
            Request::Link { .. } => "Tlink",
            Request::Mkdir { .. } => "Tmkdir",
            Request::RenameAt { .. } => "Trenameat",
            Request::UnlinkAt { .. } => "Tunlinkat",
        }
    }

    /// The message type number.
    pub fn kind(&self) -> u8 {
        use kind::*;
        match self {
            Request::Version { .. } => TVERSION,
            Request::Auth { .. } => TAUTH,
            Request::Attach { .. } => TATTACH,
            Request::Flush { .. } => TFLUSH,
            Request::Walk { .. } => TWALK,
            Request::Read { .. } => TREAD,
            Request::Write { .. } => TWRITE,
            Request::Clunk { .. } => TCLUNK,
            Request::Remove { .. } => TREMOVE,
            Request::Statfs { .. } => TSTATFS,
            Request::Lopen { .. } => TLOPEN,
            Request::Lcreate { .. } => TLCREATE,
            Request::Symlink { .. } => TSYMLINK,
            Request::Mknod { .. } => TMKNOD,
            Request::Rename { .. } => TRENAME,
            Request::Readlink { .. } => TREADLINK,
            Request::Getattr { .. } => TGETATTR,
            Request::Setattr { .. } => TSETATTR,
            Request::XattrWalk { .. } => TXATTRWALK,
            Request::XattrCreate { .. } => TXATTRCREATE,
            Request::Readdir { .. } => TREADDIR,
            Request::Fsync { .. } => TFSYNC,
            Request::Lock { .. } => TLOCK,
            Request::GetLock { .. } => TGETLOCK,
            Request::Link { .. } => TLINK,
            Request::Mkdir { .. } => TMKDIR,
            Request::RenameAt { .. } => TRENAMEAT,
            Request::UnlinkAt { .. } => TUNLINKAT,
        }
    }

    /// Appends this request as a complete frame with `tag` (client side).
    pub fn encode(&self, tag: u16, out: &mut Vec<u8>) {
        let mut w = Writer::begin(out, self.kind(), tag);
        match self {
            Request::Version { msize, version } => {
                w.u32(*msize).string(version);
            }
            Request::Auth {
                afid,
                uname,
                aname,
                n_uname,
            } => {
                w.u32(*afid).string(uname).string(aname).u32(*n_uname);
            }
            Request::Attach {
                fid,
                afid,
                uname,
                aname,
                n_uname,
            } => {
                w.u32(*fid)
                    .u32(*afid)
                    .string(uname)
                    .string(aname)
                    .u32(*n_uname);
            }
            Request::Flush { oldtag } => {
                w.u16(*oldtag);
            }
            Request::Walk { fid, newfid, names } => {
                w.u32(*fid).u32(*newfid).u16(names.len() as u16);
                for n in names {
                    w.string(n);
                }
            }
            Request::Read { fid, offset, count } | Request::Readdir { fid, offset, count } => {
                w.u32(*fid).u64(*offset).u32(*count);
            }
            Request::Write { fid, offset, data } => {
                w.u32(*fid).u64(*offset).u32(data.len() as u32).raw(data);
            }
            Request::Clunk { fid }
            | Request::Remove { fid }
            | Request::Statfs { fid }
            | Request::Readlink { fid } => {
                w.u32(*fid);
            }
            Request::Lopen { fid, flags } => {
                w.u32(*fid).u32(*flags);
            }
            Request::Lcreate {
                fid,
                name,
                flags,
                mode,
                gid,
            } => {
                w.u32(*fid).string(name).u32(*flags).u32(*mode).u32(*gid);
            }
            Request::Symlink {
                fid,
                name,
                target,
                gid,
            } => {
                w.u32(*fid).string(name).string(target).u32(*gid);
            }
            Request::Mknod {
                dfid,
                name,
                mode,
                major,
                minor,
                gid,
            } => {
                w.u32(*dfid)
                    .string(name)
                    .u32(*mode)
                    .u32(*major)
                    .u32(*minor)
                    .u32(*gid);
            }
            Request::Rename { fid, dfid, name } => {
                w.u32(*fid).u32(*dfid).string(name);
            }
            Request::Getattr { fid, mask } => {
                w.u32(*fid).u64(*mask);
            }
            Request::Setattr { fid, attr: a } => {
                w.u32(*fid)
                    .u32(a.valid)
                    .u32(a.mode)
                    .u32(a.uid)
                    .u32(a.gid)
                    .u64(a.size);
                w.u64(a.atime_sec)
                    .u64(a.atime_nsec)
                    .u64(a.mtime_sec)
                    .u64(a.mtime_nsec);
            }
            Request::XattrWalk { fid, newfid, name } => {
                w.u32(*fid).u32(*newfid).string(name);
            }
            Request::XattrCreate {
                fid,
                name,
                size,
                flags,
            } => {
                w.u32(*fid).string(name).u64(*size).u32(*flags);
            }
            Request::Fsync { fid, datasync } => {
                w.u32(*fid).u32(*datasync);
            }
            Request::Lock { fid, args } => {
                w.u32(*fid)
                    .u8(args.lock_type)
                    .u32(args.flags)
                    .u64(args.start)
                    .u64(args.length);
                w.u32(args.proc_id).string(args.client_id);
            }
            Request::GetLock { fid, args } => {
                w.u32(*fid)
                    .u8(args.lock_type)
                    .u64(args.start)
                    .u64(args.length);
                w.u32(args.proc_id).string(args.client_id);
            }
            Request::Link { dfid, fid, name } => {
                w.u32(*dfid).u32(*fid).string(name);
            }
            Request::Mkdir {
                dfid,
                name,
                mode,
                gid,
            } => {
                w.u32(*dfid).string(name).u32(*mode).u32(*gid);
            }
            Request::RenameAt {
                olddirfid,
                oldname,
                newdirfid,
                newname,
            } => {
                w.u32(*olddirfid)
                    .string(oldname)
                    .u32(*newdirfid)
                    .string(newname);
            }
            Request::UnlinkAt {
                dirfid,
                name,
                flags,
            } => {
                w.u32(*dirfid).string(name).u32(*flags);
            }
        }
        w.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_with_too_many_names_is_rejected() {
        let names: Vec<&[u8]> = vec![b"a"; 17];
        let mut buf = Vec::new();
        Request::Walk {
            fid: 1,
            newfid: 2,
            names,
        }
        .encode(1, &mut buf);
        assert!(matches!(
            decode_request(&buf, 1 << 20),
            Err(DecodeError::Invalid {
                field: "nwname",
                ..
            })
        ));
    }

    #[test]
    fn size_mismatch_and_trailing_bytes_are_rejected() {
        let mut buf = Vec::new();
        Request::Clunk { fid: 3 }.encode(9, &mut buf);
        assert_eq!(
            decode_request(&buf, 1 << 20).unwrap(),
            (9, Request::Clunk { fid: 3 })
        );
        buf.push(0);
        assert!(matches!(
            decode_request(&buf, 1 << 20),
            Err(DecodeError::BadSize { .. })
        ));
        let n = buf.len() as u32;
        buf[0..4].copy_from_slice(&n.to_le_bytes());
        assert!(matches!(
            decode_request(&buf, 1 << 20),
            Err(DecodeError::Trailing { .. })
        ));
        assert!(matches!(
            decode_request(&buf, 8),
            Err(DecodeError::BadSize { .. })
        ));
    }

    #[test]
    fn write_count_beyond_frame_is_truncation() {
        let mut buf = Vec::new();
        Request::Write {
            fid: 1,
            offset: 0,
            data: b"abcd",
        }
        .encode(2, &mut buf);
        // Claim 100 bytes of data while only 4 are present.
        let at = HEADER_LEN + 4 + 8;
        buf[at..at + 4].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(
            decode_request(&buf, 1 << 20),
            Err(DecodeError::Truncated { .. })
        ));
    }
}
