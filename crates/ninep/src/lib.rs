//! `densevm-9p`: a 9P2000.L file server that knows no transport.
//!
//! - [`message`] / [`wire`]: strict, bounds-checked codec; malformed frames
//!   become `Rlerror`, never a panic.
//! - [`server`]: the export ([`Server`]) and per-connection [`Session`]s; a
//!   session turns one request frame into one response frame.
//! - [`fid`]: the O(1) fid table and inode → qid map.
//! - [`transport`]: frame reader/writer traits, a connection driver whose
//!   reader serves cached requests itself ([`Session::handle_nowait`]) and
//!   batches their replies, with a worker pool for requests that may wait
//!   (Tflush lives there), and unix/TCP listeners.
//!
//! The export root is a jail: every lookup is one component resolved with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to a held
//! descriptor, and every operation is descriptor-relative.

mod dircache;
pub mod fid;
pub mod fuzz;
pub mod idmap;
mod io;
pub mod message;
mod ops;
pub mod server;
pub mod snapshot;
pub mod sys;
pub mod transport;
pub mod wire;

pub use idmap::{IdMap, IdMapError};
pub use message::{decode_request, Qid, Request};
pub use server::{Config, Server, ServerError, Session};
pub use snapshot::{FidOpen, FidSnapshot, RestoreReport, SessionSnapshot, SnapshotError};
pub use transport::{serve_connection, DriverOptions, ListenAddr, Listener};
