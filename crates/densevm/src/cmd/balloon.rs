//! The balloon on densevm's surfaces: `densevm run --balloon`'s option string, and the
//! per-VM API's `/balloon` routes answered with the VM's balloon handle.

use anyhow::bail;
use densevm_api::request::ApiRequest;
use densevm_api::server::ApiResponse;
use densevm_api::types::BalloonInfo;
use densevm_virtio::balloon::{BalloonConfig, BalloonHandle, PAGES_PER_MIB};

/// The statistics interval when `--balloon` does not give one: the fleet daemon reads
/// each VM's statistics every second.
pub const DEFAULT_STATS_INTERVAL_S: u16 = 1;

/// What `--balloon` takes.
pub const USAGE: &str = "--balloon amount_mib=N[,deflate_on_oom[=on|off]][,stats_interval_s=S][,free_page_reporting=on|off]";

fn on_off(key: &str, value: Option<&str>, spec: &str) -> anyhow::Result<bool> {
    match value {
        None | Some("on" | "true" | "yes" | "1") => Ok(true),
        Some("off" | "false" | "no" | "0") => Ok(false),
        Some(v) => bail!("--balloon {spec}: {key}={v}: give on or off"),
    }
}

/// Parses `--balloon`: `amount_mib` (the initial target, default 0), `deflate_on_oom`
/// (default off), `stats_interval_s` (default 1; 0 creates the device without statistics),
/// `free_page_reporting` (default on).
pub fn parse_balloon(spec: &str) -> anyhow::Result<BalloonConfig> {
    let mut c = BalloonConfig {
        amount_mib: 0,
        deflate_on_oom: false,
        stats_polling_interval_s: DEFAULT_STATS_INTERVAL_S,
        free_page_reporting: true,
    };
    let opts: Vec<&str> = spec.split(',').filter(|o| !o.is_empty()).collect();
    if opts.is_empty() {
        bail!("--balloon needs its options, e.g. --balloon amount_mib=0 ({USAGE})");
    }
    for o in opts {
        let (key, value) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o, None),
        };
        match key {
            "amount_mib" => {
                let v = value.unwrap_or("");
                c.amount_mib = v.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "--balloon {spec}: amount_mib={v} is not a number of MiB (0 to the guest's RAM)"
                    )
                })?;
            }
            "stats_interval_s" | "stats_polling_interval_s" => {
                let v = value.unwrap_or("");
                c.stats_polling_interval_s = v.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "--balloon {spec}: {key}={v} is not a number of seconds (0 to 65535; 0: no statistics)"
                    )
                })?;
            }
            "deflate_on_oom" => c.deflate_on_oom = on_off(key, value, spec)?,
            "free_page_reporting" => c.free_page_reporting = on_off(key, value, spec)?,
            _ => bail!("--balloon {spec}: unknown option '{o}' ({USAGE})"),
        }
    }
    Ok(c)
}

/// Checks `--balloon` against the guest's RAM.
pub fn check_balloon(c: &BalloonConfig, memory_bytes: u64) -> anyhow::Result<()> {
    let ram_mib = memory_bytes >> 20;
    if u64::from(c.amount_mib) > ram_mib {
        bail!(
            "--balloon amount_mib={} is more than the guest's RAM ({ram_mib} MiB): give 0 to {ram_mib}",
            c.amount_mib
        );
    }
    Ok(())
}

/// A VM's balloon as its API serves it.
#[derive(Clone)]
pub struct BalloonApi {
    /// The device's handle.
    pub handle: BalloonHandle,
    /// How the device was created (whether it has statistics at all).
    pub created: BalloonConfig,
    /// Guest RAM in bytes: the largest target.
    pub memory_bytes: u64,
}

const NO_BALLOON: &str = "no balloon device: this VM was started without one; start it with \
     `densevm run --balloon amount_mib=0` (options: amount_mib, deflate_on_oom, \
     stats_interval_s, free_page_reporting) to use the /balloon routes";

/// Answers one of the `/balloon` routes (anything else is a 500: a densevm bug).
pub fn answer(balloon: Option<&BalloonApi>, request: ApiRequest) -> ApiResponse {
    let Some(b) = balloon else {
        return ApiResponse::error(400, NO_BALLOON);
    };
    match request {
        ApiRequest::PutBalloon(_) => ApiResponse::error(
            400,
            "the balloon is created when the VM starts (densevm run --balloon amount_mib=N,...) \
             and cannot be set up again while it runs: change its target with PATCH /balloon \
             {\"amount_mib\": N} and its statistics interval with PATCH /balloon/statistics",
        ),
        ApiRequest::PatchBalloon(update) => {
            let ram_mib = b.memory_bytes >> 20;
            if u64::from(update.amount_mib) > ram_mib {
                return ApiResponse::error(
                    400,
                    format!(
                        "amount_mib {} is more than the guest's RAM ({ram_mib} MiB): give 0 to {ram_mib}",
                        update.amount_mib
                    ),
                );
            }
            match b.handle.set_target_mib(update.amount_mib) {
                Ok(()) => ApiResponse::no_content(),
                Err(e) => ApiResponse::error(400, e.to_string()),
            }
        }
        ApiRequest::GetBalloon => {
            let c = b.handle.config();
            let actual_pages = b.handle.actual_pages();
            ApiResponse::ok(&BalloonInfo {
                amount_mib: c.amount_mib,
                deflate_on_oom: c.deflate_on_oom,
                stats_polling_interval_s: u32::from(c.stats_polling_interval_s),
                free_page_reporting: c.free_page_reporting,
                target_pages: b.handle.target_pages(),
                actual_pages,
                actual_mib: actual_pages / PAGES_PER_MIB,
            })
        }
        ApiRequest::GetBalloonStats => {
            if b.created.stats_polling_interval_s == 0 {
                return ApiResponse::error(
                    400,
                    "this balloon has no statistics: it was created with stats_interval_s=0 \
                     (start the VM with --balloon ...,stats_interval_s=1 to get them)",
                );
            }
            match b.handle.stats() {
                Some(report) => ApiResponse::ok(&report.stats),
                // Not reported yet (the driver sends its first buffer when it starts): the
                // sizes alone, the guest's fields absent.
                None => ApiResponse::ok(&densevm_virtio::balloon::BalloonStats::new(
                    b.handle.target_pages(),
                    b.handle.actual_pages(),
                    Default::default(),
                )),
            }
        }
        ApiRequest::PatchBalloonStats(update) => {
            let Ok(seconds) = u16::try_from(update.stats_polling_interval_s) else {
                return ApiResponse::error(
                    400,
                    format!(
                        "stats_polling_interval_s {} is too large: give 0 to 65535 seconds",
                        update.stats_polling_interval_s
                    ),
                );
            };
            match b.handle.set_stats_interval(seconds) {
                Ok(()) => ApiResponse::no_content(),
                Err(e) => ApiResponse::error(400, e.to_string()),
            }
        }
        _ => ApiResponse::error(500, "not a balloon request (a densevm bug)"),
    }
}

#[cfg(test)]
mod tests;
