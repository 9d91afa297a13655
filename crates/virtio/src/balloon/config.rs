//! The balloon's configuration and the API-shaped request bodies. Field names follow
//! Firecracker's API (`PUT /balloon`, `PATCH /balloon`, `PATCH /balloon/statistics`), so
//! the API layer can deserialize requests straight into these types.

use serde::{Deserialize, Serialize};

/// How a balloon device is created (`PUT /balloon`; `GET /balloon` answers the same shape).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonConfig {
    /// The initial target: MiB the guest should give back.
    pub amount_mib: u32,
    /// Offer `VIRTIO_BALLOON_F_DEFLATE_ON_OOM`: the guest deflates rather than OOM-kill.
    pub deflate_on_oom: bool,
    /// Seconds between statistics updates; 0 creates the device without the statistics
    /// queue (it cannot be turned on later, as in Firecracker).
    #[serde(default)]
    pub stats_polling_interval_s: u16,
    /// Offer `VIRTIO_BALLOON_F_REPORTING`: pages the guest frees go back to the host.
    #[serde(default)]
    pub free_page_reporting: bool,
}

/// `PATCH /balloon`: a new target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    /// MiB the guest should give back.
    pub amount_mib: u32,
}

/// `PATCH /balloon/statistics`: a new polling interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    /// Seconds between statistics updates; 0 stops polling.
    pub stats_polling_interval_s: u16,
}
