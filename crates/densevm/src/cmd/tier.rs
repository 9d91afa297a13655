//! `--memory-budget` (guest RAM under a DRAM budget, crates/tier): its option parser, the
//! per-VM API's `/memory-tier` routes and the JSON form of the tier's counters.

use anyhow::bail;
use densevm_api::request::ApiRequest;
use densevm_api::server::ApiResponse;
use densevm_api::types::MemoryTierInfo;
use densevm_vmm::tiering::{TierHandle, TierSettings, TierStats};
use std::path::PathBuf;

const USAGE: &str =
    "SIZE[,compressed=SIZE][,swap_dir=DIR][,readers=N][,async_pf=on|off][,poll=on|off], e.g. --memory-budget 256M";

/// Parses `--memory-budget` ([`USAGE`]).
pub fn parse_memory_budget(spec: &str) -> anyhow::Result<TierSettings> {
    let mut parts = spec.split(',').filter(|o| !o.is_empty());
    let Some(size) = parts.next() else {
        bail!("--memory-budget needs a size ({USAGE})");
    };
    let size_of = |what: &str, v: &str| -> anyhow::Result<u64> {
        densevm_probe::parse_size(v).map_err(|e| {
            anyhow::anyhow!("--memory-budget {spec}: {what} {v:?}: {e} (sizes like 64M or 1G)")
        })
    };
    let budget = size_of("the budget", size)?;
    densevm_vmm::tiering::check_budget(budget)
        .map_err(|e| anyhow::anyhow!("--memory-budget {spec}: {e}"))?;
    let mut settings = TierSettings {
        budget,
        compressed_max: None,
        swap_dir: std::env::temp_dir(),
        readers: None,
        async_pf: false,
        poll: true,
    };
    for o in parts {
        match o.split_once('=') {
            Some(("compressed", v)) => settings.compressed_max = Some(size_of("compressed", v)?),
            Some(("swap_dir", v)) => {
                let dir = PathBuf::from(v);
                if !dir.is_dir() {
                    bail!("--memory-budget {spec}: swap_dir {v} is not a directory");
                }
                settings.swap_dir = dir;
            }
            Some(("readers", v)) => {
                let max = densevm_vmm::tiering::MAX_READERS;
                match v.parse::<usize>() {
                    Ok(n) if n <= max => settings.readers = Some(n),
                    _ => bail!("--memory-budget {spec}: readers is a number of threads from 0 to {max}, not {v:?}"),
                }
            }
            Some(("async_pf", "on")) => settings.async_pf = true,
            Some(("async_pf", "off")) => settings.async_pf = false,
            Some(("async_pf", v)) => {
                bail!("--memory-budget {spec}: async_pf is on or off, not {v:?}")
            }
            Some(("poll", "on")) => settings.poll = true,
            Some(("poll", "off")) => settings.poll = false,
            Some(("poll", v)) => bail!("--memory-budget {spec}: poll is on or off, not {v:?}"),
            _ => bail!("--memory-budget {spec}: unknown option '{o}' ({USAGE})"),
        }
    }
    Ok(settings)
}

/// The tier's counters as the API and `--json` report them.
pub fn info(s: &TierStats) -> MemoryTierInfo {
    MemoryTierInfo {
        budget_mib: s.budget >> 20,
        resident_kib: s.resident >> 10,
        compressed_pages: s.compressed_pages,
        compressed_kib: s.compressed_bytes >> 10,
        swap_pages: s.swap_pages,
        base_pages: s.base_pages,
        evicted_zero: s.evicted_zero,
        evicted_clean: s.evicted_clean,
        evicted_compressed: s.evicted_compressed,
        evicted_swap: s.evicted_swap,
        demoted: s.demoted,
        missing_faults: s.missing_faults,
        faults_compressed: s.faults_compressed,
        faults_swap: s.faults_swap,
        faults_base: s.faults_base,
        swap_reads_behind: s.swap_reads_behind,
        minor_faults: s.minor_faults,
        prefetched: s.prefetched,
        armed: s.armed,
        faults_polled: s.faults_polled,
        service_cpu_us: s.service_cpu_ns / 1000,
    }
}

const NO_TIER: &str = "this VM has no memory tier: start it with densevm run --memory-budget SIZE (a VM that became a clone template leaves its tier)";

/// Answers `GET` and `PATCH /memory-tier`.
pub fn answer(tier: Option<&TierHandle>, request: ApiRequest) -> ApiResponse {
    let Some(t) = tier else {
        return ApiResponse::error(400, NO_TIER);
    };
    match request {
        ApiRequest::GetMemoryTier => match t.stats() {
            Some(s) => ApiResponse::ok(&info(&s)),
            None => ApiResponse::error(400, NO_TIER),
        },
        ApiRequest::PatchMemoryTier(u) => match t.set_budget(u64::from(u.budget_mib) << 20) {
            Ok(()) => ApiResponse::no_content(),
            Err(e) => ApiResponse::error(400, e),
        },
        _ => ApiResponse::error(500, "not a /memory-tier request"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_options_parse_and_bad_ones_say_why() {
        let s = parse_memory_budget("64M").unwrap();
        assert_eq!(
            (s.budget, s.compressed_max, s.async_pf),
            (64 << 20, None, false)
        );
        assert_eq!(s.readers, None);
        assert!(s.poll);
        let s =
            parse_memory_budget("1G,compressed=128M,swap_dir=/tmp,readers=2,async_pf=on,poll=off")
                .unwrap();
        assert!(s.async_pf);
        assert!(!s.poll);
        assert_eq!(s.readers, Some(2));
        assert_eq!(s.budget, 1 << 30);
        assert_eq!(s.compressed_max, Some(128 << 20));
        assert_eq!(s.swap_dir, PathBuf::from("/tmp"));
        for (bad, says) in [
            ("", "needs a size"),
            ("lots", "the budget"),
            ("1M", "minimum"),
            ("64M,swap_dir=/nonexistent", "not a directory"),
            ("64M,zstd", "unknown option"),
            ("64M,compressed=x", "compressed"),
            ("64M,async_pf=yes", "on or off"),
            ("64M,poll=1", "poll is on or off"),
            ("64M,readers=17", "from 0 to 16"),
            ("64M,readers=-1", "number of threads"),
        ] {
            let e = parse_memory_budget(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
