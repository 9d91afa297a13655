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
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
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
        VmCommand::Clone { sock, count, dir } => {
            let t0 = Instant::now();
            let abs = std::path::absolute(&dir).context("clone directory")?;
            let list: CloneList = ApiClient::new(&sock.api_sock).create_clones(&CloneRequest {
                count,
                snapshot_path: abs.display().to_string(),
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
        VmCommand::CloneFrom {
            snapshot,
            count,
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
            if let Some(p) = specs.pmem.first() {
                anyhow::bail!(
                    "the snapshot's VM had a --pmem image ({}), which every clone started from the snapshot would write. Clone the running VM instead (densevm vm clone, which gives each clone an overlay)",
                    p.display()
                );
            }
            let clones = crate::cmd::clones::start_clones(&snapshot, count, None)?.wait()?;
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
