//! densevm's per-VM API: HTTP/1.1 and JSON on a unix socket (`densevm run --api-sock
//! PATH`), with Firecracker's names and shapes where it has the same resource so scripts
//! written for Firecracker carry over.
//!
//! | method  | path               | body                 | answer                     |
//! |---------|--------------------|----------------------|----------------------------|
//! | `GET`   | `/`                | —                    | 200 [`InstanceInfo`]       |
//! | `PATCH` | `/vm`              | [`VmStateChange`]    | 204                        |
//! | `PUT`   | `/snapshot/create` | [`SnapshotCreate`]   | 204                        |
//! | `POST`  | `/clones`          | [`CloneRequest`]     | 200 [`CloneList`]          |
//! | `PUT`   | `/balloon`         | [`Balloon`]          | 204                        |
//! | `PATCH` | `/balloon`         | [`BalloonUpdate`]    | 204                        |
//! | `GET`   | `/balloon`         | —                    | 200 [`BalloonInfo`]        |
//! | `GET`   | `/balloon/statistics` | —                 | 200 [`BalloonStats`]       |
//! | `PATCH` | `/balloon/statistics` | [`BalloonStatsUpdate`] | 204                   |
//! | `GET`   | `/memory-tier`     | —                    | 200 [`MemoryTierInfo`]     |
//! | `PATCH` | `/memory-tier`     | [`MemoryTierUpdate`] | 204                        |
//! | `GET`   | `/vsock`           | —                    | 200 [`VsockInfo`]          |
//!
//! (The balloon routes act on a VM started with `densevm run --balloon`; a VM without one
//! answers them 400, and `PUT /balloon` is 400 at run time: the device is created at
//! start; likewise `/memory-tier` needs `densevm run --memory-budget` and `/vsock`
//! `--vsock`.) docs/api/openapi.yaml
//! documents every route.
//!
//! Errors carry Firecracker's body, `{"fault_message": "..."}` ([`ApiError`]), saying what
//! to do. Differences from Firecracker: `snapshot_path` is a directory (it holds `state`
//! and `memory`), so `mem_file_path` is refused; there are no diff snapshots, but there are
//! template snapshots and `POST /clones`.
//!
//! The pieces:
//! - [`types`]: the JSON bodies.
//! - [`request`]: the route table, a pure function [`parse_route`] (fuzzed).
//! - [`http`]: HTTP/1.1 framing with `httparse` (8 KiB header block, 64 KiB body,
//!   keep-alive, pipelining); no chunked bodies.
//! - [`server`]: [`ApiServer`], one thread named `api` with a 128 KiB stack, one connection
//!   at a time, each request due within an idle timeout; no async runtime, so the VMM
//!   stays small. [`ApiServer::spawn_router`] serves another route table (the fleet
//!   daemon's) on the same HTTP code.
//! - [`client`]: [`ApiClient`], one connection per request, with typed helpers.

pub mod client;
#[doc(hidden)]
pub mod fuzz;
pub mod http;
pub mod request;
pub mod server;
pub mod types;

pub use client::{ApiClient, ClientError};
pub use request::{parse_route, ApiErrorResponse, ApiRequest};
pub use server::{
    ApiHandler, ApiResponse, ApiServer, ApiServerError, ApiServerHandle, HttpHandler, LaterReply,
    Reply, MAX_LATER,
};
pub use types::{
    ApiError, Balloon, BalloonInfo, BalloonStats, BalloonStatsUpdate, BalloonUpdate, CloneInfo,
    CloneList, CloneRequest, InstanceInfo, InstanceState, MemoryTierInfo, MemoryTierUpdate,
    NetworkOverride, SnapshotCreate, SnapshotType, VmState, VmStateChange, VsockInfo, MAX_CLONES,
};
