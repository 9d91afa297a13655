//! `densevm vm ...`: client verbs for a running VM's API socket (`densevm run --api-sock`).

use crate::output::print_json;
use anyhow::Context;
use clap::{Args, Subcommand};
use densevm_api::client::ApiClient;
use densevm_api::types::{CloneList, CloneRequest, SnapshotCreate, SnapshotType};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct VmArgs {
    #[command(subcommand)]
    command: VmCommand,
}

#[derive(Args, Debug)]
struct Sock {
    /// The VM's API socket (`densevm run --api-sock PATH`).
    #[arg(long, value_name = "PATH")]
    api_sock: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum VmCommand {
    /// Show the VM's id, state and VMM version (GET /).
    Info(Sock),
    /// Park every vCPU (PATCH /vm {"state": "Paused"}).
    Pause(Sock),
    /// Let a paused VM run again (PATCH /vm {"state": "Resumed"}).
    Resume(Sock),
    /// Write a full snapshot (state + memory) into a new directory (PUT /snapshot/create).
    Snapshot {
        #[command(flatten)]
        sock: Sock,
        /// The directory to create (must not exist, or be empty).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Clone the running VM COUNT times (POST /clones): it is paused only while its state
    /// is saved and its RAM frozen as the clones' copy-on-write template.
    Clone {
        #[command(flatten)]
        sock: Sock,
        /// How many clones.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// The template directory to create (holds the state and each clone's socket and
        /// console file).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Put each clone's network interface IFACE (net0, net1, ...) on its own tap
        /// (repeatable; required when the VM has --net): `{index}` in TAP becomes the clone's
        /// index, e.g. --net-override net0=tap-c{index} for taps made beforehand.
        #[arg(long, value_name = "IFACE=TAP", value_parser = crate::cmd::devices::parse_net_override)]
        net_override: Vec<densevm_api::NetworkOverride>,
        /// A DRAM budget for each clone's RAM (e.g. 64M): RAM of its own, read from the
        /// template on first access, instead of the template mapped copy-on-write.
        #[arg(long, value_name = "SIZE", value_parser = parse_budget_mib)]
        memory_budget: Option<u32>,
    },
    /// Show the balloon (GET /balloon: target, the size the guest reached, options), after
    /// setting a new target with --amount-mib (PATCH /balloon). The VM needs
    /// `densevm run --balloon`.
    Balloon {
        #[command(flatten)]
        sock: Sock,
        /// The new target: MiB the guest gives back (0 deflates it completely).
        #[arg(long, value_name = "MIB")]
        amount_mib: Option<u32>,
        /// Set how often the guest sends statistics, in seconds (PATCH /balloon/statistics).
        #[arg(long, value_name = "SECS")]
        stats_interval_s: Option<u32>,
    },
    /// Show the guest's memory statistics and the balloon's size (GET /balloon/statistics).
    BalloonStats(Sock),
    /// Show the memory tier (GET /memory-tier: budget, resident RAM, pages compressed and
    /// in the swap file, faults), after setting a new budget with --budget (PATCH
    /// /memory-tier). The VM needs `densevm run --memory-budget`.
    MemoryTier {
        #[command(flatten)]
        sock: Sock,
        /// The new DRAM budget for guest RAM (e.g. 256M).
        #[arg(long, value_name = "SIZE")]
        budget: Option<String>,
    },
    /// Start COUNT VMs from a snapshot directory (`densevm vm snapshot`), each a `densevm run
    /// --restore` process with its sockets and console file in the directory; they map its
    /// memory file copy-on-write, so pages none of them writes exist once in the page cache.
    CloneFrom {
        /// The snapshot directory.
        #[arg(long, value_name = "DIR")]
        snapshot: PathBuf,
        /// How many clones.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Put each clone's network interface IFACE (net0, net1, ...) on its own tap
        /// (repeatable; required when the VM has --net): `{index}` in TAP becomes the clone's
        /// index, e.g. --net-override net0=tap-c{index} for taps made beforehand.
        #[arg(long, value_name = "IFACE=TAP", value_parser = crate::cmd::devices::parse_net_override)]
        net_override: Vec<densevm_api::NetworkOverride>,
        /// A DRAM budget for each clone's RAM (e.g. 64M): RAM of its own, read from the
        /// snapshot on first access, instead of the snapshot mapped copy-on-write.
        #[arg(long, value_name = "SIZE", value_parser = parse_budget_mib)]
        memory_budget: Option<u32>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A clone's `--memory-budget SIZE` in MiB (at least the tier's minimum).
fn parse_budget_mib(text: &str) -> Result<u32, String> {
    let bytes = densevm_probe::parse_size(text).map_err(|e| format!("{e} (sizes like 64M)"))?;
    densevm_vmm::tiering::check_budget(bytes)?;
    u32::try_from(bytes >> 20).map_err(|_| format!("{text} is too large"))
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn done(json: bool, doc: serde_json::Value, human: String) -> anyhow::Result<i32> {
    if json {
        print_json(&doc)?;
    } else {
        println!("{human}");
    }
    Ok(0)
}

pub fn main(args: VmArgs) -> anyhow::Result<i32> {
    match args.command {
        VmCommand::Info(s) => {
            let info = ApiClient::new(&s.api_sock).info()?;
            let human = format!(
                "{}: {:?} (densevm {})",
                info.id, info.state, info.vmm_version
            );
            done(s.json, serde_json::to_value(&info)?, human)
        }
        VmCommand::Pause(s) => {
            ApiClient::new(&s.api_sock).pause()?;
            done(s.json, json!({"state": "Paused"}), "paused".into())
        }
        VmCommand::Resume(s) => {
            ApiClient::new(&s.api_sock).resume()?;
            done(s.json, json!({"state": "Running"}), "resumed".into())
        }
        VmCommand::Snapshot { sock, dir } => {
            let t0 = Instant::now();
            let abs = std::path::absolute(&dir).context("snapshot directory")?;
            ApiClient::new(&sock.api_sock).create_snapshot(&SnapshotCreate {
                snapshot_type: SnapshotType::Full,
                snapshot_path: abs.display().to_string(),
                mem_file_path: None,
            })?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            done(
                sock.json,
                json!({"snapshot_path": abs, "ms": ms}),
                format!("snapshot written to {} in {ms:.1} ms", abs.display()),
            )
        }
        VmCommand::Clone {
            sock,
            count,
            dir,
            net_override,
            memory_budget,
        } => {
            let t0 = Instant::now();
            let abs = std::path::absolute(&dir).context("clone directory")?;
            let list: CloneList = ApiClient::new(&sock.api_sock).create_clones(&CloneRequest {
                count,
                snapshot_path: abs.display().to_string(),
                network_overrides: net_override,
                memory_budget_mib: memory_budget,
            })?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let running_ms = list.running_us.map(|us| us as f64 / 1e3);
            let mut human = match running_ms {
                Some(r) => format!(
                    "{} clones running {r:.1} ms after the request (answer after {ms:.1} ms):",
                    list.clones.len()
                ),
                None => format!("{} clones running ({ms:.1} ms):", list.clones.len()),
            };
            for c in &list.clones {
                human.push_str(&format!(
                    "\n  clone {}: pid {}, api {}, console {}",
                    c.index, c.pid, c.api_sock, c.console
                ));
            }
            done(
                sock.json,
                json!({"clones": list.clones, "ms": ms, "running_ms": running_ms}),
                human,
            )
        }
        VmCommand::Balloon {
            sock,
            amount_mib,
            stats_interval_s,
        } => {
            let client = ApiClient::new(&sock.api_sock);
            if let Some(mib) = amount_mib {
                client.set_balloon_target(mib)?;
            }
            if let Some(s) = stats_interval_s {
                client.set_balloon_stats_interval(s)?;
            }
            let b = client.balloon()?;
            let human = format!(
                "balloon: target {} MiB, guest reached {} MiB ({} of {} pages); deflate_on_oom {}, free page reporting {}, statistics every {} s",
                b.amount_mib,
                b.actual_mib,
                b.actual_pages,
                b.target_pages,
                on(b.deflate_on_oom),
                on(b.free_page_reporting),
                b.stats_polling_interval_s
            );
            done(sock.json, serde_json::to_value(b)?, human)
        }
        VmCommand::BalloonStats(s) => {
            let st = ApiClient::new(&s.api_sock).balloon_stats()?;
            let mib = |v: Option<u64>| v.map_or("-".to_string(), |b| format!("{} MiB", b >> 20));
            let human = format!(
                "balloon: target {} MiB, actual {} MiB\nguest: total {}, free {}, available {}, caches {}, major faults {}, swap in {}",
                st.target_mib,
                st.actual_mib,
                mib(st.total_memory),
                mib(st.free_memory),
                mib(st.available_memory),
                mib(st.disk_caches),
                st.major_faults.map_or("-".into(), |n| n.to_string()),
                mib(st.swap_in),
            );
            done(s.json, serde_json::to_value(st)?, human)
        }
        VmCommand::MemoryTier { sock, budget } => {
            let client = ApiClient::new(&sock.api_sock);
            if let Some(b) = budget {
                let bytes = densevm_probe::parse_size(&b)
                    .map_err(|e| anyhow::anyhow!("--budget {b}: {e} (sizes like 256M)"))?;
                let mib = u32::try_from(bytes >> 20)
                    .map_err(|_| anyhow::anyhow!("--budget {b} is too large"))?;
                client.set_memory_budget(mib)?;
            }
            let t = client.memory_tier()?;
            let human = format!(
                "memory tier: budget {} MiB, resident {} MiB; compressed {} pages in {} KiB, swap file {} pages, {} pages only in the snapshot (a restore)
left RAM: {} zero, {} clean (the snapshot has them), {} compressed, {} to swap ({} demoted); faults: {} missing ({} from the compressed store, {} from swap ({} by readers), {} from the snapshot), {} minor (cold-page samples), {} prefetched, {} found by polling; service CPU {:.1} ms",
                t.budget_mib,
                t.resident_kib >> 10,
                t.compressed_pages,
                t.compressed_kib,
                t.swap_pages,
                t.base_pages,
                t.evicted_zero,
                t.evicted_clean,
                t.evicted_compressed,
                t.evicted_swap,
                t.demoted,
                t.missing_faults,
                t.faults_compressed,
                t.faults_swap,
                t.swap_reads_behind,
                t.faults_base,
                t.minor_faults,
                t.prefetched,
                t.faults_polled,
                t.service_cpu_us as f64 / 1e3,
            );
            done(sock.json, serde_json::to_value(t)?, human)
        }
        VmCommand::CloneFrom {
            snapshot,
            count,
            net_override,
            memory_budget,
            json,
        } => {
            if count == 0 || count > densevm_api::types::MAX_CLONES {
                anyhow::bail!("--count must be 1..={}", densevm_api::types::MAX_CLONES);
            }
            let t0 = Instant::now();
            let state = densevm_vmm::snapshot::restore::read_snapshot(&snapshot)?;
            let specs: crate::cmd::devices::DeviceSpecs = if state.device_specs.is_null() {
                Default::default()
            } else {
                serde_json::from_value(state.device_specs)?
            };
            if let Some(d) = specs.disks.iter().find(|d| !d.readonly) {
                anyhow::bail!(
                    "the snapshot's VM had a writable disk ({}): clones started from the snapshot would all write it. Clone the running VM instead (densevm vm clone, which gives each clone an overlay), or snapshot a VM whose disks are readonly",
                    d.path.display()
                );
            }
            crate::cmd::devices::check_clone_nets(&specs.nets, &net_override)
                .map_err(|why| anyhow::anyhow!("cannot clone the snapshot's VM: {why}"))?;
            if count > 1 {
                if let Some(o) = net_override
                    .iter()
                    .find(|o| !o.host_dev_name.contains("{index}"))
                {
                    anyhow::bail!(
                        "--net-override {}={}: all {count} clones would use that tap, and a tap serves one VM: put {{index}} in it",
                        o.iface_id,
                        o.host_dev_name
                    );
                }
            }
            if let Some(p) = specs.pmem.first() {
                anyhow::bail!(
                    "the snapshot's VM had a --pmem image ({}), which every clone started from the snapshot would write. Clone the running VM instead (densevm vm clone, which gives each clone an overlay)",
                    p.display()
                );
            }
            let clones = crate::cmd::clones::start_clones(
                &snapshot,
                count,
                None,
                &crate::cmd::clones::CloneOpts {
                    nets: net_override,
                    memory_budget_mib: memory_budget,
                },
            )?
            .wait()?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let mut human = format!("{} clones running ({ms:.1} ms):", clones.len());
            for c in &clones {
                human.push_str(&format!(
                    "\n  clone {}: pid {}, api {}, console {}",
                    c.index, c.pid, c.api_sock, c.console
                ));
            }
            done(json, json!({"clones": clones, "ms": ms}), human)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_budget_mib;

    #[test]
    fn clone_budgets_are_sizes_of_at_least_the_tier_minimum() {
        assert_eq!(parse_budget_mib("64M"), Ok(64));
        assert_eq!(parse_budget_mib("1G"), Ok(1024));
        for (bad, says) in [
            ("2M", "minimum"),
            ("lots", "sizes like"),
            ("", "sizes like"),
        ] {
            let e = parse_budget_mib(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
