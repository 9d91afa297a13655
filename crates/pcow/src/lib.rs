//! pcow: a copy-on-write image format for regions whose clusters are mapped into guest
//! memory (thin provisioning, snapshots, base-image chains, 4 KiB copy-on-write).
//!
//! The on-disk format and the write order of every operation are specified in
//! `docs/pcow.md`. This crate knows nothing about KVM or userfaultfd: it opens chains,
//! builds the logical→physical map, and offers both byte-granular access (tools, tests)
//! and the cluster-level API a mapping service needs ([`SharedChain`]).

pub mod bulk;
pub mod chain;
pub mod check;
pub mod dax;
pub mod error;
pub mod format;
pub mod fuzz;
pub mod image;
pub mod map;
mod merge;
pub mod ops;
pub mod shared;
pub mod storage;

pub use bulk::{import_raw, ImportStats};
pub use chain::{
    AllocInit, Allocation, Chain, ClusterLocation, LayerFile, OpenOptions, UnitSource,
};
pub use check::{check_path, CheckReport, RepairSummary};
pub use error::{PcowError, Result};
pub use format::{EntryKind, Geometry, UNIT_SIZE};
pub use image::{Image, Problem, SnapshotInfo};
pub use ops::{create_file, new_header, CreateOptions};
pub use shared::SharedChain;
pub use storage::{FileStorage, MemStorage, Op, Recorder, RecordingStorage, Storage};
