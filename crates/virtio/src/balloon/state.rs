//! What a snapshot holds of a balloon (its queues are saved by the transport).
//!
//! The statistics buffer the device holds is a chain popped but not returned (one request
//! in flight on the statistics queue); its head is saved, and the restored device gives it
//! back at its first polling tick, so the guest's statistics continue without a reset.
//! A restored device also raises one configuration interrupt when it starts, so the driver
//! rereads a target set while the snapshot was taken.

use super::{feature, Balloon};
use crate::state::{decode, encode, StateError};
use crate::{device_type, VirtioDevice};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

/// A balloon's own state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonState {
    /// Features the driver accepted.
    pub acked_features: u64,
    /// The target (`num_pages`).
    pub num_pages: u32,
    /// `actual` as the driver last wrote it.
    pub actual: u32,
    /// `poison_val` as the driver last wrote it.
    pub poison_val: u32,
    /// Pages in the balloon by the device's count.
    pub inflated_pages: u64,
    /// The statistics polling interval, seconds.
    pub stats_polling_interval_s: u16,
    /// The statistics chain the device held (its head index), if any.
    pub stats_head: Option<u16>,
}

pub(super) fn save(b: &Balloon) -> Result<serde_json::Value, StateError> {
    let stats_head = match &b.worker {
        crate::worker::Service::Idle => b.restored_stats_head,
        crate::worker::Service::Parked(p) => p.handler.stats_head(),
        crate::worker::Service::Running(_) => {
            return Err(StateError::device_state(
                device_type::BALLOON,
                "the device is still serving: quiesce it first (a densevm bug)",
            ))
        }
    };
    let s = &b.shared;
    encode(
        device_type::BALLOON,
        &BalloonState {
            acked_features: b.acked,
            num_pages: s.num_pages(),
            actual: s.actual(),
            poison_val: s.poison_val(),
            inflated_pages: s.counters.inflated_pages.load(Ordering::Relaxed),
            stats_polling_interval_s: s.stats_interval_s(),
            stats_head,
        },
    )
}

pub(super) fn restore(b: &mut Balloon, state: &serde_json::Value) -> Result<(), StateError> {
    let s: BalloonState = decode(device_type::BALLOON, state)?;
    let bad = |reason: &str| Err(StateError::device_state(device_type::BALLOON, reason));
    if b.is_active() {
        return bad("the device is already serving; restore into a new device");
    }
    if s.acked_features & !b.features() != 0 {
        return Err(StateError::AckedFeatures {
            acked: s.acked_features,
            offered: b.features(),
        });
    }
    if s.stats_head.is_some() && s.acked_features & feature::STATS_VQ == 0 {
        return bad("it holds a statistics buffer but the driver has no statistics queue");
    }
    if s.stats_polling_interval_s > 0 && !b.shared.stats_offered() {
        return bad(
            "it polls statistics but this device has none: restore with a statistics interval",
        );
    }
    b.acked = s.acked_features;
    b.shared.set_num_pages(s.num_pages);
    b.shared.set_actual(s.actual);
    b.shared.set_poison_val(s.poison_val);
    b.shared
        .counters
        .inflated_pages
        .store(s.inflated_pages, Ordering::Relaxed);
    b.shared.set_stats_interval_s(s.stats_polling_interval_s);
    b.restored_stats_head = s.stats_head;
    b.restored = true;
    Ok(())
}
