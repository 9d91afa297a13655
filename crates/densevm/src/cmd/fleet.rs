//! `densevm fleet ...`: the host daemon (`serve`) and client verbs for its socket
//! (docs/fleet.md).

use crate::output::print_json;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use densevm_fleet::cgroup::{self, Cgroups};
use densevm_fleet::host::ProcFs;
use densevm_fleet::launcher::{JailConfig, ProcessLauncher};
use densevm_fleet::policy::{PolicyConfig, Priority};
use densevm_fleet::registry::{Registry, RegistryConfig};
use densevm_fleet::types::{CgroupInfo, VmCreate, VmExec, VmInfo, VmPatch};
use densevm_fleet::{Fleet, FleetClient};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct FleetArgs {
    #[command(subcommand)]
    command: FleetCommand,
}

#[derive(Args, Debug)]
struct Sock {
    /// The fleet daemon's socket (`densevm fleet serve --sock PATH`).
    #[arg(long, value_name = "PATH")]
    sock: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Class {
    Low,
    Normal,
    High,
}

impl From<Class> for Priority {
    fn from(c: Class) -> Self {
        match c {
            Class::Low => Priority::Low,
            Class::Normal => Priority::Normal,
            Class::High => Priority::High,
        }
    }
}

#[derive(Subcommand, Debug)]
enum FleetCommand {
    /// Run the daemon: VMs as `densevm run` processes, the memory policy every second, the
    /// REST API on --sock. Stops on SIGTERM/SIGINT; its VMs keep running and a new daemon
    /// with the same --state-dir adopts them.
    Serve {
        /// The API socket to serve.
        #[arg(long, value_name = "PATH")]
        sock: PathBuf,
        /// Where VM sockets, consoles and records go.
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
        /// Reclaim below this MemAvailable: a size (512M) or a share of MemTotal (10%).
        #[arg(long, value_name = "SIZE|PCT", value_parser = parse_watermark)]
        low_watermark: Option<Watermark>,
        /// Give memory to short guests only above this MemAvailable (default 20%).
        #[arg(long, value_name = "SIZE|PCT", value_parser = parse_watermark)]
        high_watermark: Option<Watermark>,
        /// Per-VM cgroup v2 memory.max: `auto` (the daemon's own cgroup, if it has a memory
        /// controller), `off`, or a delegated cgroup directory.
        #[arg(long, default_value = "auto", value_name = "auto|off|DIR")]
        cgroup: String,
        /// VMM overhead added to each VM's max for its memory.max, MiB.
        #[arg(long, default_value_t = 64)]
        cgroup_overhead_mib: u64,
        /// Policy period, milliseconds.
        #[arg(long, default_value_t = 1000)]
        tick_ms: u64,
        /// A VM using less CPU than this (percent of one CPU) for 10 ticks in a row is idle
        /// (default 2). Raise it where idle guests cost more, e.g. under emulation (the
        /// nested lab: 2-3%).
        #[arg(long, value_name = "PCT")]
        idle_cpu_pct: Option<f64>,
        /// Seconds a delete waits after SIGTERM before SIGKILL.
        #[arg(long, default_value_t = 5)]
        grace_secs: u64,
        /// The policy lowers no VM's DRAM budget under this (default 16M), nor under a
        /// quarter of its RAM.
        #[arg(long, value_name = "SIZE", value_parser = parse_mib)]
        budget_floor: Option<u64>,
        /// Jail every VM (needs root): `densevm run --jail DIR/ID --uid --gid` (namespaces,
        /// a root holding only the VM's files, a cgroup densevm/ID, no privileges;
        /// docs/security.md). DIR/ID must not be inside a VM directory of --state-dir (e.g. STATE/jail). Without it VMs run unjailed,
        /// as the daemon's user.
        #[arg(long, value_name = "DIR", requires_all = ["jail_uid", "jail_gid"])]
        jail_root: Option<PathBuf>,
        /// The uid jailed VMMs run as (each VM in its own PID namespace).
        #[arg(long, value_name = "N", requires = "jail_root")]
        jail_uid: Option<u32>,
        /// The gid jailed VMMs run as.
        #[arg(long, value_name = "N", requires = "jail_root")]
        jail_gid: Option<u32>,
    },
    /// Start a VM (POST /vms).
    Create(Box<CreateArgs>),
    /// List the VMs (GET /vms).
    List(Sock),
    /// Show one VM (GET /vms/ID).
    Show {
        #[command(flatten)]
        sock: Sock,
        /// The VM's id.
        id: String,
    },
    /// Change a VM's class, bounds or balloon target (PATCH /vms/ID).
    Set {
        #[command(flatten)]
        sock: Sock,
        /// The VM's id.
        id: String,
        #[arg(long, value_enum)]
        priority: Option<Class>,
        /// Least guest memory (e.g. 128M).
        #[arg(long, value_parser = parse_mib)]
        min: Option<u64>,
        /// Most guest memory.
        #[arg(long, value_parser = parse_mib)]
        max: Option<u64>,
        /// Balloon target (memory taken from the guest).
        #[arg(long, value_parser = parse_mib)]
        balloon: Option<u64>,
        /// A new DRAM budget for the VM's RAM (a VM created with --memory-budget).
        #[arg(long, value_name = "SIZE", value_parser = parse_mib)]
        memory_budget: Option<u64>,
    },
    /// Stop and forget a VM (DELETE /vms/ID): SIGTERM, then SIGKILL after the grace period.
    Delete {
        #[command(flatten)]
        sock: Sock,
        /// The VM's id.
        id: String,
    },
    /// Print the Prometheus metrics (GET /metrics).
    Metrics(Sock),
    /// Run a command in a VM's guest through its agent (POST /vms/ID/exec; the VM needs
    /// --vsock-cid and a guest running densevm-agent): prints its stdout and stderr when it
    /// ends and exits with its exit code.
    Exec(ExecArgs),
}

#[derive(Args, Debug)]
struct ExecArgs {
    #[command(flatten)]
    sock: Sock,
    /// The VM's id.
    id: String,
    /// Kill the command after this many seconds (exit code 124); default and most: 3600.
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// An environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// The command's stdin, read from this file (`-`: this stdin); default empty.
    #[arg(long, value_name = "FILE")]
    stdin: Option<PathBuf>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct CreateArgs {
    #[command(flatten)]
    sock: Sock,
    /// The VM's id (default vm-N).
    #[arg(long)]
    id: Option<String>,
    /// Guest memory (for --restore: the snapshot's RAM size).
    #[arg(long, short = 'm', default_value = "256M", value_parser = parse_mib)]
    memory: u64,
    #[arg(long)]
    cpus: Option<u32>,
    #[arg(long, value_name = "FILE")]
    kernel: Option<String>,
    #[arg(long, value_name = "FILE")]
    initrd: Option<String>,
    #[arg(long)]
    cmdline: Option<String>,
    /// The probe guest with this script.
    #[arg(long, value_name = "SCRIPT")]
    probe: Option<String>,
    /// Start from a snapshot directory.
    #[arg(long, value_name = "DIR")]
    restore: Option<String>,
    /// As `densevm run --disk` (repeatable).
    #[arg(long)]
    disk: Vec<String>,
    /// As `densevm run --share` (repeatable).
    #[arg(long)]
    share: Vec<String>,
    #[arg(long)]
    rng: bool,
    #[arg(long, value_enum, default_value = "normal")]
    priority: Class,
    /// Least guest memory the policy leaves (default a quarter of --memory).
    #[arg(long, value_parser = parse_mib)]
    min: Option<u64>,
    /// Most guest memory (default --memory).
    #[arg(long, value_parser = parse_mib)]
    max: Option<u64>,
    /// A DRAM budget for its RAM (`densevm run --memory-budget`, docs/tiering.md): its
    /// coldest pages leave DRAM for densevm's compressed and swap tiers; the policy may
    /// lower it when the host runs low. With --restore, RAM of its own read from the
    /// snapshot on first access.
    #[arg(long, value_name = "SIZE", value_parser = parse_mib)]
    memory_budget: Option<u64>,
    /// As `densevm run --net` (repeatable): tap=NAME[,mac=MAC].
    #[arg(long)]
    net: Vec<String>,
    /// A vsock device with this guest CID (3 or more), its socket in the VM's directory:
    /// what `densevm fleet exec` reaches the guest agent through.
    #[arg(long, value_name = "CID")]
    vsock_cid: Option<u32>,
    /// With --restore: put interface IFACE (net0 for the snapshot's first --net, ...) on
    /// tap TAP instead of the snapshot's (repeatable), as `densevm run --net-override`.
    #[arg(long, value_name = "IFACE=TAP", requires = "restore", value_parser = crate::cmd::devices::parse_net_override)]
    net_override: Vec<densevm_api::NetworkOverride>,
}

/// A watermark: MiB, or a percentage of MemTotal.
#[derive(Debug, Clone, Copy)]
pub enum Watermark {
    Mib(u64),
    Percent(u64),
}

fn parse_watermark(text: &str) -> Result<Watermark, String> {
    match text.strip_suffix('%') {
        Some(p) => match p.trim().parse::<u64>() {
            Ok(n) if (1..100).contains(&n) => Ok(Watermark::Percent(n)),
            _ => Err(format!("{text}: a percentage is 1% to 99%")),
        },
        None => parse_mib(text).map(Watermark::Mib),
    }
}

fn parse_mib(text: &str) -> Result<u64, String> {
    let bytes = densevm_probe::parse_size(text).map_err(|e| format!("{e}; e.g. 256M or 1G"))?;
    Ok(bytes >> 20)
}

fn resolve(w: Watermark, total_mib: u64) -> u64 {
    match w {
        Watermark::Mib(m) => m,
        Watermark::Percent(p) => total_mib * p / 100,
    }
}

fn abs(path: &Option<String>) -> anyhow::Result<Option<String>> {
    path.as_ref()
        .map(|p| Ok(std::path::absolute(p)?.display().to_string()))
        .transpose()
}

fn print_vm(json: bool, vm: &VmInfo) -> anyhow::Result<i32> {
    if json {
        print_json(vm)?;
    } else {
        println!("{}", vm_line(vm));
    }
    Ok(0)
}

fn vm_line(v: &VmInfo) -> String {
    let status = match &v.exit {
        Some(how) => format!("exited ({how})"),
        None => format!("pid {}", v.pid),
    };
    let budget = match (v.memory_budget_mib, v.memory_budget_user_mib, &v.tier) {
        (Some(b), Some(u), t) => {
            let user = if u == b {
                String::new()
            } else {
                format!(" (user {u})")
            };
            let resident = t.map_or(String::new(), |t| {
                format!(", {} MiB resident", t.resident_kib >> 10)
            });
            format!("  budget {b} MiB{user}{resident}")
        }
        _ => String::new(),
    };
    format!(
        "{:<16} {:<7} {:<24} mem {} MiB [{}..{}] balloon {} MiB  rss {} MiB  pss {} MiB{budget}",
        v.id,
        v.priority.as_str(),
        status,
        v.memory_mib,
        v.min_mib,
        v.max_mib,
        v.balloon_mib,
        v.rss_kib >> 10,
        v.pss_kib >> 10
    )
}

pub fn main(args: FleetArgs) -> anyhow::Result<i32> {
    match args.command {
        FleetCommand::Serve {
            sock,
            state_dir,
            low_watermark,
            high_watermark,
            cgroup,
            cgroup_overhead_mib,
            tick_ms,
            idle_cpu_pct,
            grace_secs,
            budget_floor,
            jail_root,
            jail_uid,
            jail_gid,
        } => serve(ServeArgs {
            sock,
            state_dir,
            low_watermark,
            high_watermark,
            cgroup,
            overhead_mib: cgroup_overhead_mib,
            tick: Duration::from_millis(tick_ms.max(10)),
            idle_cpu_pct,
            grace: Duration::from_secs(grace_secs),
            budget_floor,
            jail: match (jail_root, jail_uid, jail_gid) {
                (Some(root), Some(uid), Some(gid)) => Some(JailConfig {
                    root: std::path::absolute(root)?,
                    uid,
                    gid,
                }),
                _ => None,
            },
        }),
        FleetCommand::Create(c) => {
            let spec = VmCreate {
                id: c.id,
                kernel: abs(&c.kernel)?,
                initrd: abs(&c.initrd)?,
                cmdline: c.cmdline,
                probe: c.probe,
                restore: abs(&c.restore)?,
                memory_mib: c.memory,
                vcpus: c.cpus,
                disks: c.disk,
                shares: c.share,
                rng: c.rng,
                priority: c.priority.into(),
                min_mib: c.min,
                max_mib: c.max,
                memory_budget_mib: c.memory_budget,
                nets: c.net,
                vsock_cid: c.vsock_cid,
                network_overrides: c.net_override,
            };
            let vm = FleetClient::new(&c.sock.sock).create(&spec)?;
            print_vm(c.sock.json, &vm)
        }
        FleetCommand::List(s) => {
            let vms = FleetClient::new(&s.sock).list()?;
            if s.json {
                print_json(&vms)?;
            } else {
                for v in &vms {
                    println!("{}", vm_line(v));
                }
            }
            Ok(0)
        }
        FleetCommand::Show { sock, id } => {
            let vm = FleetClient::new(&sock.sock).get(&id)?;
            if sock.json {
                print_json(&vm)?;
            } else {
                println!("{}", serde_json::to_string_pretty(&vm)?);
            }
            Ok(0)
        }
        FleetCommand::Set {
            sock,
            id,
            priority,
            min,
            max,
            balloon,
            memory_budget,
        } => {
            let patch = VmPatch {
                priority: priority.map(Into::into),
                min_mib: min,
                max_mib: max,
                balloon_mib: balloon,
                memory_budget_mib: memory_budget,
            };
            let vm = FleetClient::new(&sock.sock).patch(&id, &patch)?;
            print_vm(sock.json, &vm)
        }
        FleetCommand::Delete { sock, id } => {
            let vm = FleetClient::new(&sock.sock).delete(&id)?;
            print_vm(sock.json, &vm)
        }
        FleetCommand::Exec(e) => exec(e),
        FleetCommand::Metrics(s) => {
            let text = FleetClient::new(&s.sock).metrics()?;
            if s.json {
                print_json(&serde_json::json!({ "metrics": text }))?;
            } else {
                print!("{text}");
            }
            Ok(0)
        }
    }
}

fn exec(e: ExecArgs) -> anyhow::Result<i32> {
    use std::io::{Read, Write};
    let stdin = match &e.stdin {
        None => None,
        Some(p) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading stdin (the command's stdin must be UTF-8 text)")?;
            Some(s)
        }
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| {
            format!(
                "reading {} (the command's stdin must be UTF-8 text)",
                p.display()
            )
        })?),
    };
    let req = VmExec {
        argv: e.command,
        env: e.env,
        stdin,
        timeout_s: e.timeout,
        port: None,
    };
    let r = FleetClient::new(&e.sock.sock).exec(&e.id, &req)?;
    if e.sock.json {
        print_json(&r)?;
    } else {
        std::io::stdout().write_all(r.stdout.as_bytes())?;
        std::io::stderr().write_all(r.stderr.as_bytes())?;
        if r.truncated {
            eprintln!("densevm fleet exec: output past 16 MiB was dropped");
        }
        if r.status != "exited" {
            eprintln!(
                "densevm fleet exec: the command {}: {}",
                r.status, r.message
            );
        }
    }
    Ok(r.exit_code)
}

struct ServeArgs {
    sock: PathBuf,
    state_dir: PathBuf,
    low_watermark: Option<Watermark>,
    high_watermark: Option<Watermark>,
    cgroup: String,
    overhead_mib: u64,
    tick: Duration,
    idle_cpu_pct: Option<f64>,
    grace: Duration,
    budget_floor: Option<u64>,
    jail: Option<JailConfig>,
}

/// The fleet's cgroup, or why there is none.
fn cgroups(mode: &str) -> (Option<Cgroups>, Option<String>) {
    let pid = std::process::id();
    let result = match mode {
        "off" => Err("disabled with --cgroup off".to_owned()),
        "auto" => std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))
            .and_then(|own| cgroup::detect(Path::new("/sys/fs/cgroup"), &own))
            .and_then(|base| Cgroups::set_up(&base, pid)),
        dir => Cgroups::set_up(Path::new(dir), pid),
    };
    match result {
        Ok(c) => (Some(c), None),
        Err(why) => (None, Some(why)),
    }
}

fn serve(a: ServeArgs) -> anyhow::Result<i32> {
    let procfs = ProcFs::default();
    let Some(host) = procfs.host() else {
        bail!("cannot read /proc/meminfo: the fleet needs the host's MemAvailable");
    };
    let mut policy = PolicyConfig::for_host(host.mem_total_mib);
    if let Some(w) = a.low_watermark {
        policy.low_watermark_mib = resolve(w, host.mem_total_mib);
    }
    if let Some(w) = a.high_watermark {
        policy.high_watermark_mib = resolve(w, host.mem_total_mib);
    }
    if let Some(pct) = a.idle_cpu_pct {
        policy.idle_cpu_pct = pct;
    }
    if let Some(mib) = a.budget_floor {
        policy.budget_floor_mib = mib;
    }
    policy.check().map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&a.state_dir)
        .with_context(|| format!("cannot create {}", a.state_dir.display()))?;
    let state_dir = std::path::absolute(&a.state_dir)?;
    let (cg, missing) = cgroups(&a.cgroup);
    let info = CgroupInfo {
        enabled: cg.is_some(),
        parent: cg.as_ref().map(|c| c.parent().display().to_string()),
        missing,
        overhead_mib: a.overhead_mib,
    };
    let mut registry = Registry::new(
        RegistryConfig {
            state_dir,
            overhead_mib: a.overhead_mib,
            grace: a.grace,
        },
        Box::new(ProcessLauncher::new(std::env::current_exe()?).with_jail(a.jail.clone())),
        cg,
    );
    let adopted = registry.adopt(&procfs);
    if adopted > 0 {
        eprintln!("densevm fleet: adopted {adopted} VM records from an earlier daemon");
    }
    let fleet = Fleet::new(registry, policy.clone(), info.clone(), procfs);
    eprintln!(
        "densevm fleet: serving {} (low watermark {} MiB, high {} MiB, cgroup memory.max: {})",
        a.sock.display(),
        policy.low_watermark_mib,
        policy.high_watermark_mib,
        match (&info.parent, &info.missing) {
            (Some(p), _) => format!("under {p}"),
            (None, Some(why)) => format!("MISSING, no hard stop ({why})"),
            (None, None) => "missing".into(),
        }
    );
    match &a.jail {
        Some(j) => eprintln!(
            "densevm fleet: every VM jailed under {} as uid {} gid {}",
            j.root.display(),
            j.uid,
            j.gid
        ),
        // SAFETY: geteuid has no arguments.
        None if unsafe { libc::geteuid() } == 0 => eprintln!(
            "densevm fleet: warning: VMs run unjailed as root; give --jail-root DIR --jail-uid N \
             --jail-gid N to confine them"
        ),
        None => {}
    }
    let stop = densevm_fleet::daemon::stop_on_signals();
    fleet
        .serve(&a.sock, a.tick, stop)
        .map_err(anyhow::Error::msg)?;
    Ok(0)
}
