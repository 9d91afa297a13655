//! Saving and restoring a virtio-9p device (snapshots, restore, clones).
//!
//! **Quiesce:** the dispatcher (the queue's worker) is parked between two chains, so no new
//! request is taken; then the quiesce waits until every request the pool holds has been
//! answered (used ring written, interrupt raised), at most [`QUIESCE_TIMEOUT`] (a request
//! can block on a slow host filesystem). Past the bound the dispatcher runs again, nothing
//! is lost, and the quiesce fails: the snapshot can be retried.
//!
//! **State** ([`P9State`]): the mount tag (checked on restore: the VMM opens the same
//! `--share`, whose directory, read-only flag and id maps come from its configuration, not
//! from the state), the accepted features and the 9P session: msize, version and every fid
//! as its path from the export root, uid, qid and how it is open. See
//! [`densevm_9p::snapshot`] for how fids are saved and rebuilt: xattr fids in progress make
//! the save fail (retry), and a fid whose file is gone on the host comes back *stale*
//! (every operation but Tclunk fails with ESTALE), never failing the restore.
//!
//! ```json
//! {"tag": "share", "acked_features": 4294967297,
//!  "session": {"msize": 65536, "version": "9P2000.L",
//!    "fids": [{"fid": 0, "path": [], "uid": 0,
//!              "qid": {"type": 128, "version": 0, "path": 1234}, "open": {"kind": "path"}},
//!             {"fid": 1, "path": ["dir", "big"], "uid": 0,
//!              "qid": {"type": 0, "version": 0, "path": 1240},
//!              "open": {"kind": "file", "flags": 32768}},
//!             {"fid": 2, "path": ["dir"], "uid": 0, "qid": {...},
//!              "open": {"kind": "dir", "offset": 9223372036854775807}}]}}
//! ```
//! A name that is not UTF-8 is saved as an array of bytes instead of a string. `session` is
//! `null` when the device is not active.

use super::P9;
use crate::state::{decode, encode};
use crate::{device_type, QueuePosition, StateError, VirtioDevice};
use densevm_9p::{FidOpen, FidSnapshot, Qid, SessionSnapshot};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const P9_TYPE: u32 = device_type::P9;

/// How long a quiesce waits for the requests in flight by default.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a snapshot holds of a virtio-9p device (its queue is saved by the transport).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P9State {
    /// The mount tag (must match on restore).
    pub tag: String,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// The 9P session; `None` when the device was not active.
    pub session: Option<SessionState>,
}

/// A saved 9P session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionState {
    /// Negotiated msize.
    pub msize: u32,
    /// Rversion's answer; `None` before any Tversion.
    pub version: Option<String>,
    /// The fids, in ascending order.
    pub fids: Vec<FidState>,
}

/// One saved fid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FidState {
    /// The guest's fid number.
    pub fid: u32,
    /// Names from the export root (empty: the root).
    pub path: Vec<Name>,
    /// Guest uid.
    pub uid: u32,
    /// The node's qid.
    pub qid: QidState,
    /// How it is open.
    pub open: OpenState,
}

/// A directory entry name: a string, or its bytes when it is not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Name {
    /// UTF-8 name.
    Text(String),
    /// Any other name.
    Bytes(Vec<u8>),
}

/// A qid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QidState {
    /// QTDIR, QTSYMLINK or QTFILE.
    #[serde(rename = "type")]
    pub kind: u8,
    /// Version.
    pub version: u32,
    /// Path (inode-derived).
    pub path: u64,
}

/// How a fid is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OpenState {
    /// Walked only.
    Path,
    /// An open file, with its host open flags.
    File {
        /// `F_GETFL` minus `O_CREAT|O_EXCL|O_TRUNC`.
        flags: i32,
    },
    /// An open directory and its position.
    Dir {
        /// `lseek(fd, 0, SEEK_CUR)`.
        offset: u64,
    },
    /// A fid already stale (its file was gone at an earlier restore).
    Stale {
        /// The error its operations answer.
        errno: i32,
    },
}

impl From<&SessionSnapshot> for SessionState {
    fn from(s: &SessionSnapshot) -> Self {
        SessionState {
            msize: s.msize,
            version: s.version.clone(),
            fids: s
                .fids
                .iter()
                .map(|f| FidState {
                    fid: f.fid,
                    path: f
                        .path
                        .iter()
                        .map(|n| match String::from_utf8(n.clone()) {
                            Ok(s) => Name::Text(s),
                            Err(e) => Name::Bytes(e.into_bytes()),
                        })
                        .collect(),
                    uid: f.uid,
                    qid: QidState {
                        kind: f.qid.kind,
                        version: f.qid.version,
                        path: f.qid.path,
                    },
                    open: match f.open {
                        FidOpen::Path => OpenState::Path,
                        FidOpen::File { flags } => OpenState::File { flags },
                        FidOpen::Dir { offset } => OpenState::Dir { offset },
                        FidOpen::Stale { errno } => OpenState::Stale { errno },
                    },
                })
                .collect(),
        }
    }
}

impl From<&SessionState> for SessionSnapshot {
    fn from(s: &SessionState) -> Self {
        SessionSnapshot {
            msize: s.msize,
            version: s.version.clone(),
            fids: s
                .fids
                .iter()
                .map(|f| FidSnapshot {
                    fid: f.fid,
                    path: f
                        .path
                        .iter()
                        .map(|n| match n {
                            Name::Text(s) => s.as_bytes().to_vec(),
                            Name::Bytes(b) => b.clone(),
                        })
                        .collect(),
                    uid: f.uid,
                    qid: Qid {
                        kind: f.qid.kind,
                        version: f.qid.version,
                        path: f.qid.path,
                    },
                    open: match f.open {
                        OpenState::Path => FidOpen::Path,
                        OpenState::File { flags } => FidOpen::File { flags },
                        OpenState::Dir { offset } => FidOpen::Dir { offset },
                        OpenState::Stale { errno } => FidOpen::Stale { errno },
                    },
                })
                .collect(),
        }
    }
}

impl P9 {
    /// Parks the dispatcher, then waits (at most the quiesce timeout) for the pool to answer
    /// every request it holds. On timeout the dispatcher runs again and the quiesce fails.
    pub(super) fn quiesce_device(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        let timeout = self.quiesce_timeout;
        let Some(active) = &mut self.active else {
            return Ok(Vec::new());
        };
        match active.dispatcher.quiesce() {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return Err(StateError::worker_lost(P9_TYPE)),
        }
        match active.pool.wait_drained(timeout) {
            Some((next_avail, next_used)) => Ok(vec![QueuePosition {
                next_avail,
                next_used,
            }]),
            None => {
                tracing::warn!(
                    "virtio-9p: a request still runs after {timeout:?}; the snapshot is refused"
                );
                self.resume_device()?;
                Err(StateError::Host {
                    device: "virtio-9p",
                    op: "finish the requests in flight before the snapshot",
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "a 9p request was still being served after {timeout:?} (a slow or \
                             hung host filesystem under the share?); the device goes on \
                             serving: retry the snapshot"
                        ),
                    ),
                })
            }
        }
    }

    pub(super) fn resume_device(&mut self) -> Result<(), StateError> {
        let Some(active) = &mut self.active else {
            return Ok(());
        };
        active
            .dispatcher
            .resume()
            .map_err(|source| StateError::Host {
                device: "virtio-9p",
                op: "restart the worker thread",
                source,
            })
    }

    pub(super) fn state(&self) -> Result<serde_json::Value, StateError> {
        let session = match &self.active {
            Some(active) => {
                if active.dispatcher.parked().is_none() {
                    return Err(StateError::Host {
                        device: "virtio-9p",
                        op: "save the 9p session",
                        source: std::io::Error::other("the device is serving: quiesce it first"),
                    });
                }
                Some(active.pool.session())
            }
            // Restored and not activated yet: the restored session.
            None => self.restored.as_ref(),
        };
        let session = match session {
            Some(s) => Some(SessionState::from(&s.snapshot().map_err(|e| {
                StateError::Host {
                    device: "virtio-9p",
                    op: "save the 9p session",
                    source: std::io::Error::other(e.to_string()),
                }
            })?)),
            None => None,
        };
        encode(
            P9_TYPE,
            &P9State {
                tag: self.tag.clone(),
                acked_features: self.acked,
                session,
            },
        )
    }

    pub(super) fn apply_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        let s: P9State = decode(P9_TYPE, state)?;
        let refuse = |reason: String| Err(StateError::device_state(P9_TYPE, reason));
        if self.is_active() {
            return refuse("the device is already serving; restore into a new device".into());
        }
        if s.tag != self.tag {
            return refuse(format!(
                "the snapshot's share has mount tag {:?}, this one {:?}: restore with the \
                 snapshot's --share options",
                s.tag, self.tag
            ));
        }
        if s.acked_features & !self.features() != 0 {
            return Err(StateError::AckedFeatures {
                acked: s.acked_features,
                offered: self.features(),
            });
        }
        let session = match &s.session {
            Some(saved) => {
                let (session, report) = self
                    .server
                    .restore_session(&SessionSnapshot::from(saved))
                    .map_err(|e| {
                        StateError::device_state(
                            P9_TYPE,
                            format!("{e} (the snapshot's state file is damaged)"),
                        )
                    })?;
                if !report.stale.is_empty() {
                    tracing::warn!(
                        share = %self.tag,
                        stale = report.stale.len(),
                        "virtio-9p: fids whose files are gone on the host answer ESTALE"
                    );
                }
                Some(session)
            }
            None => None,
        };
        self.acked = s.acked_features;
        self.restored = session;
        Ok(())
    }
}
