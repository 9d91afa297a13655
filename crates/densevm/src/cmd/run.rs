//! `densevm run`: build a VM from the command line and run it.

use crate::cmd::pmem::PmemRegions;
use crate::output::print_json;
use anyhow::{bail, Context};
use clap::Args;
use densevm_vmm::report::MemoryReport;
use densevm_vmm::{BootImages, MergePolicy, Payload, RunOutcome, VmConfig, Vmm};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// The kernel command line used when `--cmdline` is not given.
///
/// `pci=noearly`: no early PCI scans through port 0xcf8; on AMD CPUs Linux otherwise looks
/// for an AGP bridge on all 256 buses, twice: ~33,700 port exits to the VMM at boot
/// (docs/benchmarks.md, "Linux boot time in the nested lab").
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=acpi panic=-1 pci=noearly";

/// The script `--probe` runs when given no script: an idle guest that exits at once.
pub const DEFAULT_PROBE_SCRIPT: &str = "exit 0";

// Arguments of `densevm run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Guest memory size (e.g. 128M, 2G).
    #[arg(long, short = 'm', default_value = "128M", value_parser = parse_memory)]
    pub memory: u64,
    /// Number of vCPUs, each on its own host thread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=254))]
    pub cpus: u32,
    /// Run the built-in probe guest with this `;`-separated script
    /// (touch SIZE | touch/read/sum/fill-id/fill-addr REGION OFF LEN | write REGION OFF LEN BYTE | mark ID |
    /// sleep MS | crash triple-fault|mmio-exec|int3 | reset | exit CODE). Without a script:
    /// `exit 0`.
    #[arg(long, num_args = 0..=1, default_missing_value = DEFAULT_PROBE_SCRIPT, value_name = "SCRIPT", conflicts_with = "kernel")]
    pub probe: Option<String>,
    /// Boot this Linux kernel: an ELF vmlinux with a PVH entry (mapped from the file,
    /// shared between VMs) or a bzImage (64-bit boot protocol).
    #[arg(long, value_name = "FILE")]
    pub kernel: Option<std::path::PathBuf>,
    /// Initrd for --kernel, mapped from its file.
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<std::path::PathBuf>,
    /// Kernel command line for --kernel [default: console=ttyS0 reboot=acpi panic=-1
    /// pci=noearly].
    #[arg(long)]
    pub cmdline: Option<String>,
    /// Print the boot trace points as a table (on stderr) when the VM ends.
    #[arg(long)]
    pub trace: bool,
    /// Print the VMM's memory report (RSS/USS/PSS, on stderr) when the VM ends.
    #[arg(long)]
    pub report: bool,
    /// Write the memory report and trace as one JSON object to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub report_json: Option<String>,
    /// Print the run summary as JSON on stdout; guest console output goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// Stop the VM with an error (exit code 124) after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Map a pcow image (with its backing chain) into guest memory above RAM as region
    /// `pmem0`, `pmem1`, ... (repeatable). Guest writes go straight into the image. Linux
    /// guests get a virtio-pmem device (`/dev/pmemN` with virtio_pci + virtio_pmem +
    /// nd_pmem; DAX-capable): each guest fsync there makes the image durable.
    #[arg(long, value_name = "IMAGE")]
    pub pmem: Vec<std::path::PathBuf>,
    /// Which guest memory the host's same-page merging (KSM) may fold across VMs: `boot`
    /// (the kernel and initrd windows, whose boot-time patches are identical in every VM),
    /// `all` (also guest RAM) or `off`. Merging happens only while ksmd runs
    /// (`echo 1 > /sys/kernel/mm/ksm/run`).
    #[arg(long, value_enum, default_value_t = Merge::Boot)]
    pub merge: Merge,
    /// Where a Linux guest's kernel and initrd live: `map` (mapped from their files, the
    /// default: VMs booted from the same files share the pages their guests never write)
    /// or `copy` (copied into guest RAM: all guest memory is in its RAM file). A
    /// --memory-budget always copies them, so that the budget covers all guest memory.
    #[arg(long, value_enum, value_name = "map|copy")]
    pub boot_images: Option<Images>,
    /// A virtio-blk disk for a Linux guest (repeatable; /dev/vda, /dev/vdb, ...):
    /// PATH[,readonly][,format=raw|pcow]. Format: pcow for a `.pcow` name, raw otherwise.
    /// Raw disks are files or block devices; pcow images bring their snapshots and base chain.
    #[arg(long, value_name = "PATH[,OPTS]", value_parser = crate::cmd::devices::parse_disk)]
    pub disk: Vec<crate::cmd::devices::DiskSpec>,
    /// Share a host directory with a Linux guest over virtio-9p (repeatable):
    /// HOSTDIR,tag=TAG[,readonly][,uid-map=G:H[:N]][,gid-map=G:H[:N]]. In the guest:
    /// `mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 TAG /mnt`.
    #[arg(long, value_name = "DIR,tag=TAG[,OPTS]", value_parser = crate::cmd::devices::parse_share)]
    pub share: Vec<crate::cmd::devices::ShareSpec>,
    /// Give a Linux guest a virtio-rng entropy device fed by the host's getrandom
    /// (`/dev/hwrng` with the virtio_rng module).
    #[arg(long)]
    pub rng: bool,
    /// A virtio-vsock device for a Linux guest (modules vsock, vmw_vsock_virtio_transport):
    /// cid=N (the guest's CID, >= 3),uds=PATH. Host programs connect to PATH and write
    /// `CONNECT <port>\n` (Firecracker's hybrid vsock); guest connections to host port P
    /// reach the unix socket PATH_P. `densevm exec` runs commands through it (docs/vsock.md).
    #[arg(long, value_name = "cid=N,uds=PATH", value_parser = crate::cmd::devices::parse_vsock)]
    pub vsock: Option<densevm_virtio::vsock::VsockConfig>,
    /// A virtio-net device on an existing tap interface for a Linux guest (repeatable;
    /// eth0, eth1, ... with the virtio_net module): tap=NAME[,mac=MAC]. Create the tap
    /// first, e.g. `ip tuntap add tap0 mode tap`; without mac= a random locally
    /// administered address is chosen (and kept in snapshots). See docs/networking.md.
    #[arg(long, value_name = "tap=NAME[,mac=MAC]", value_parser = crate::cmd::devices::parse_net)]
    pub net: Vec<crate::cmd::devices::NetSpec>,
    /// A virtio-balloon device for a Linux guest (`virtio_balloon` module):
    /// amount_mib=N (initial target, default 0), deflate_on_oom[=on|off] (default off),
    /// stats_interval_s=S (guest statistics every S s, default 1; 0: none),
    /// free_page_reporting=on|off (pages the guest frees go back to the host; default on).
    /// The API's /balloon routes change the target and read the statistics.
    #[arg(long, value_name = "amount_mib=N[,OPTS]", value_parser = crate::cmd::balloon::parse_balloon)]
    pub balloon: Option<densevm_virtio::balloon::BalloonConfig>,
    /// Keep guest RAM under a DRAM budget: SIZE[,compressed=SIZE][,swap_dir=DIR]
    /// [,readers=N][,async_pf=on|off][,poll=on|off]. Cold pages leave RAM (zero pages for nothing,
    /// compressible ones to an in-memory LZ4 store counted within the budget — at most
    /// `compressed`, default a quarter of it — the rest to an unlinked swap file in
    /// `swap_dir`, default $TMPDIR) and come back on access, for any guest
    /// (docs/tiering.md). `readers`: threads that read swap-file pages beside the tier's
    /// service thread (default 3 from 4 vCPUs on, else 0). PATCH /memory-tier
    /// changes it. A booted guest is not offered KVM's async page faults unless
    /// `async_pf=on`. `poll=off`: the tier's service thread sleeps right after serving
    /// faults instead of polling up to 200 µs for the next one. With --restore, RAM is a file of the VM's own filled from the
    /// snapshot on first access (not shared with other restores of the snapshot).
    #[arg(long, value_name = "SIZE[,OPTS]", value_parser = crate::cmd::tier::parse_memory_budget)]
    pub memory_budget: Option<densevm_vmm::tiering::TierSettings>,
    /// Serve the VM's HTTP API (Firecracker-style: GET /, PATCH /vm, PUT /snapshot/create,
    /// POST /clones, /balloon) on this unix socket.
    #[arg(long, value_name = "PATH")]
    pub api_sock: Option<std::path::PathBuf>,
    /// Take console input (the guest's COM1) from clients of this unix socket, e.g.
    /// `densevm console --sock PATH --send 'ls\n'`.
    #[arg(long, value_name = "PATH")]
    pub console_sock: Option<std::path::PathBuf>,
    /// The VM's id (GET / reports it; default: densevm-PID).
    #[arg(long)]
    pub id: Option<String>,
    /// Start the VM from a snapshot directory (made by PUT /snapshot/create) instead of
    /// booting: it continues where the snapshot was taken, with the snapshot's RAM, vCPUs
    /// and devices (--memory, --cpus, --merge and device flags are refused).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kernel", "probe", "pmem", "disk", "share", "rng", "net", "vsock", "balloon", "memory", "cpus", "merge"])]
    pub restore: Option<std::path::PathBuf>,
    /// (clones) the template's RAM file is this inherited descriptor.
    #[arg(long, hide = true, requires = "restore")]
    pub ram_fd: Option<i32>,
    /// (clones) write one byte to this inherited descriptor once the vCPUs run.
    #[arg(long, hide = true, requires = "restore")]
    pub ready_fd: Option<i32>,
    /// (clones) this clone's index: its writable disks are DIR/diskN.clone-INDEX.pcow.
    #[arg(long, hide = true, requires = "restore")]
    pub clone_index: Option<u32>,
    /// With --restore: put the VM's network interface IFACE (net0 for its first --net,
    /// net1, ...) on tap TAP instead of the snapshot's (repeatable).
    #[arg(long, value_name = "IFACE=TAP", requires = "restore", value_parser = crate::cmd::devices::parse_net_override)]
    pub net_override: Vec<densevm_api::NetworkOverride>,
    /// `--jail DIR --uid N --gid N` and its options (cmd/jail.rs).
    #[command(flatten)]
    pub jail: crate::cmd::jail::JailArgs,
    /// Confine every VMM thread with its kind's seccomp allow-list (`on`), run without
    /// filters (`off`), or with filters that only have the kernel log what they would deny
    /// (`log`: audit records in dmesg). `off` and `log` are for debugging, warn on stderr,
    /// and clones inherit them. A denied call ends the VMM with exit code 159 and names the
    /// thread kind and call (docs/security.md).
    #[arg(long, value_enum, default_value_t = crate::cmd::seccomp::Seccomp::On)]
    pub seccomp: crate::cmd::seccomp::Seccomp,
    /// (tests) the first thread of this kind makes a forbidden call (docs/security.md).
    #[arg(long, hide = true, value_name = "KIND", value_parser = crate::cmd::seccomp::parse_kind)]
    pub seccomp_test_violation: Option<densevm_seccomp::ThreadKind>,
}

impl RunArgs {
    /// The device options as [`DeviceSpecs`](crate::cmd::devices::DeviceSpecs): paths made
    /// absolute, each `--net` given a MAC, `--vsock` added.
    pub fn device_specs(&self) -> crate::cmd::devices::DeviceSpecs {
        crate::cmd::devices::DeviceSpecs::absolute(
            &self.disk,
            &self.share,
            self.rng,
            &self.pmem,
            &self.net,
        )
        .with_vsock(self.vsock.as_ref())
    }
}

/// `--boot-images`: the command-line form of [`BootImages`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Images {
    /// Mapped from their files.
    Map,
    /// Copied into guest RAM.
    Copy,
}

/// `--merge`: the command-line form of [`MergePolicy`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// No region is marked.
    Off,
    /// Kernel and initrd windows.
    Boot,
    /// Kernel, initrd and guest RAM.
    All,
}

impl From<Merge> for MergePolicy {
    fn from(m: Merge) -> Self {
        match m {
            Merge::Off => MergePolicy::Off,
            Merge::Boot => MergePolicy::BootImages,
            Merge::All => MergePolicy::All,
        }
    }
}

/// Parses `--memory`: a size with an optional K/M/G suffix, at least 1 MiB, 4 KiB aligned.
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let bytes = densevm_probe::parse_size(text)
        .map_err(|e| format!("{e}; give the guest memory size like 256M or 2G"))?;
    if bytes < (1 << 20) {
        return Err(format!(
            "{bytes} bytes is too small; guest memory must be at least 1M"
        ));
    }
    if bytes % 4096 != 0 {
        return Err(format!("{bytes} bytes is not a multiple of 4K"));
    }
    if bytes > (1 << 40) {
        return Err("more than 1T of guest memory is not supported".into());
    }
    Ok(bytes)
}

fn summary(args: &RunArgs, outcome: &RunOutcome, pmem: &PmemRegions) -> Value {
    let mut obj = json!({
        "exit_code": outcome.end.exit_code(),
        "end": outcome.end.to_string(),
        "error": outcome.end.is_error(),
        "memory_bytes": args.memory,
        "cpus": args.cpus,
        "trace_ms": trace_ms(outcome),
    });
    if pmem.len() > 0 {
        let o = obj.as_object_mut().expect("object");
        o.insert("pmem".into(), json!(pmem.stats()));
        o.insert("readonly_slots".into(), json!(outcome.readonly_slots));
    }
    add_figures(obj.as_object_mut().expect("object"), outcome);
    obj
}

/// The start-up trace: ms from `main` by point.
fn trace_ms(outcome: &RunOutcome) -> Map<String, Value> {
    let mut trace = Map::new();
    for p in outcome.trace.points() {
        trace.insert(p.name, json!((p.ms * 1000.0).round() / 1000.0));
    }
    trace
}

/// `--report`, `--report-json` and `--json` once the VM has ended, booted or restored.
fn report(args: &RunArgs, outcome: &RunOutcome, doc: &Value) -> anyhow::Result<()> {
    if args.report {
        match &outcome.memory {
            Some(m) => print_report(m),
            None => eprintln!("densevm: memory report unavailable (cannot read /proc/self/smaps)"),
        }
    }
    match args.report_json.as_deref() {
        Some("-") => print_json(doc)?,
        Some(path) => std::fs::write(path, serde_json::to_string_pretty(doc)? + "\n")
            .with_context(|| format!("cannot write the JSON report to {path}"))?,
        None => {}
    }
    if args.json && args.report_json.as_deref() != Some("-") {
        print_json(doc)?;
    }
    Ok(())
}

/// Adds what the VM's end measured (balloon, memory tier, memory figures) to `o`.
fn add_figures(o: &mut Map<String, Value>, outcome: &RunOutcome) {
    if let Some(b) = &outcome.balloon {
        o.insert("balloon".into(), json!(b));
    }
    if let Some(t) = &outcome.tier {
        o.insert("memory_tier".into(), json!(crate::cmd::tier::info(t)));
    }
    if let Some(m) = &outcome.memory {
        o.insert("rss_kib".into(), json!(m.process.rss_kib));
        o.insert("uss_kib".into(), json!(m.process.uss_kib));
        o.insert("pss_kib".into(), json!(m.process.pss_kib));
        o.insert("guest".into(), json!(m.guest));
        o.insert("vmm_overhead".into(), json!(m.vmm_overhead));
        o.insert(
            "regions".into(),
            json!(m
                .regions
                .iter()
                .map(|(n, f)| json!({"name": n, "figures": f}))
                .collect::<Vec<_>>()),
        );
    }
}

fn print_report(m: &MemoryReport) {
    eprintln!(
        "{:<22} {:>10} {:>10} {:>10} {:>10}",
        "memory (KiB)", "RSS", "USS", "PSS", "anon"
    );
    let row = |name: &str, f: &densevm_vmm::report::MemFigures| {
        eprintln!(
            "{:<22} {:>10} {:>10} {:>10} {:>10}",
            name, f.rss_kib, f.uss_kib, f.pss_kib, f.anon_kib
        )
    };
    row("VMM process", &m.process);
    row("  guest memory", &m.guest);
    row("  VMM overhead", &m.vmm_overhead);
    for (name, f) in &m.regions {
        row(&format!("  region {name}"), f);
    }
}

/// Runs the VM; returns the guest-requested exit code.
pub fn main(mut args: RunArgs) -> anyhow::Result<i32> {
    let origin = crate::process_start();
    // First, while the process is single-threaded: the outer process of a jailed launch
    // returns here with the jailed VM's exit code.
    if let Some(code) = crate::cmd::jail::enter(&mut args)? {
        return Ok(code);
    }
    // A VM serving an API socket can be asked for clones: the launcher that will start
    // them is forked now, before any filter, so that no VMM thread needs `execve`.
    if args.api_sock.is_some() {
        crate::cmd::launcher::start(crate::cmd::launcher::Allowed::new(
            std::env::current_exe().map(|p| p.into_os_string()),
            args.seccomp.inherited(),
        ))?;
    }
    crate::cmd::seccomp::setup(args.seccomp, args.seccomp_test_violation)?;
    if args.kernel.is_none()
        && (args.initrd.is_some() || args.cmdline.is_some() || args.boot_images.is_some())
    {
        bail!(
            "--initrd, --cmdline and --boot-images only apply to a Linux guest: add --kernel FILE"
        );
    }
    if args.restore.is_some() {
        return restore_main(args, origin);
    }
    let payload = match (&args.probe, &args.kernel) {
        (Some(script), None) => Payload::Probe(densevm_probe::parse_script(script).context("invalid --probe script")?),
        (None, Some(kernel)) => Payload::Linux {
            kernel: kernel.clone(),
            initrd: args.initrd.clone(),
            cmdline: args.cmdline.clone().unwrap_or_else(|| DEFAULT_CMDLINE.to_string()),
            // A budget copies them whatever this says (the VMM's builder decides).
            images: match args.boot_images {
                Some(Images::Map) if args.memory_budget.is_some() => bail!(
                    "--memory-budget copies the kernel and initrd into guest RAM, so that the budget covers all guest memory: drop --boot-images map"
                ),
                Some(Images::Copy) => BootImages::Copied,
                Some(Images::Map) | None => BootImages::Mapped,
            },
        },
        _ => bail!("nothing to run: give --kernel FILE [--initrd FILE] for Linux, or --probe [SCRIPT] for the probe guest"),
    };
    let console: Box<dyn std::io::Write + Send> = if args.json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let timeout = match args.timeout {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            bail!("--timeout must be a positive number of seconds")
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    if args.kernel.is_none() && (!args.disk.is_empty() || !args.share.is_empty() || args.rng) {
        bail!("--disk, --share and --rng are virtio devices for a Linux guest: add --kernel FILE");
    }
    if args.kernel.is_none() && args.vsock.is_some() {
        bail!("--vsock is a virtio device for a Linux guest (the probe guest has no PCI and no vsock driver): add --kernel FILE");
    }
    if args.kernel.is_none() && !args.net.is_empty() {
        bail!("--net is a virtio device for a Linux guest (the probe guest has no PCI): add --kernel FILE");
    }
    if let Some(b) = &args.balloon {
        if args.kernel.is_none() {
            bail!("--balloon is a virtio device for a Linux guest (the probe guest has no PCI): add --kernel FILE");
        }
        crate::cmd::balloon::check_balloon(b, args.memory)?;
    }
    let specs = args.device_specs();
    let (devices, disk_handles) = specs.open()?;
    let pmem = PmemRegions::open(&specs.pmem)?;
    let config = VmConfig {
        memory_bytes: args.memory,
        cpus: args.cpus,
        payload,
        console,
        timeout,
        origin,
        report_memory: args.report || args.report_json.is_some() || args.json,
        external_regions: pmem.external_regions(),
        merge: args.merge.into(),
        devices,
        device_specs: serde_json::to_value(&specs)?,
        balloon: args.balloon,
        memory_budget: args.memory_budget.clone(),
    };
    let started = Instant::now();
    let vmm = densevm_vmm::builder::build(config).context("could not start the VM")?;
    let outcome = run_with_api(&args, vmm, &specs, disk_handles, &pmem)?;
    pmem.flush()?;
    tracing::debug!("VM ran for {:?}", started.elapsed());
    if args.trace {
        eprint!("{}", outcome.trace.table());
    }
    report(&args, &outcome, &summary(&args, &outcome, &pmem))?;
    if outcome.end.is_error() {
        eprintln!("densevm: error: {}", outcome.end);
    }
    Ok(outcome.end.exit_code())
}

/// Runs `vmm` to its end, serving its API socket meanwhile when `--api-sock` asks for it.
fn run_with_api(
    args: &RunArgs,
    vmm: Vmm,
    specs: &crate::cmd::devices::DeviceSpecs,
    disk_handles: Vec<densevm_virtio::block::BackendHandle>,
    pmem: &PmemRegions,
) -> anyhow::Result<RunOutcome> {
    let balloon = vmm
        .balloon()
        .map(|(handle, created)| crate::cmd::balloon::BalloonApi {
            handle,
            created,
            memory_bytes: vmm.memory_bytes(),
        });
    let server = match &args.api_sock {
        Some(path) => {
            let id = args
                .id
                .clone()
                .unwrap_or_else(|| format!("densevm-{}", std::process::id()));
            Some(crate::cmd::vm_api::serve(
                path,
                id,
                vmm.handle(),
                specs.clone(),
                disk_handles,
                pmem.clone(),
                crate::cmd::vm_api::MemoryApi {
                    balloon,
                    tier: vmm.tier(),
                },
            )?)
        }
        None => None,
    };
    let console = match &args.console_sock {
        Some(path) => {
            let serial = vmm.serial();
            Some(
                crate::cmd::console::serve_console_socket_paced(path, move |bytes: &[u8]| {
                    serial
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .enqueue_input(bytes)
                })
                .with_context(|| format!("--console-sock {}", path.display()))?,
            )
        }
        None => None,
    };
    let outcome = vmm.run().context("the VM failed");
    drop(console);
    if let Some(server) = server {
        server.shutdown();
    }
    outcome
}

/// `densevm run --restore DIR`.
fn restore_main(args: RunArgs, origin: Instant) -> anyhow::Result<i32> {
    let Some(dir) = args.restore.clone() else {
        bail!("--restore needs a snapshot directory");
    };
    // SAFETY: --ram-fd is passed only by a parent densevm that made the descriptor this
    // process's own (dup2 before exec) and gives up its ownership here.
    let ram = args
        .ram_fd
        .map(|fd| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let console: Box<dyn std::io::Write + Send> = if args.json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let timeout = args.timeout.map(Duration::from_secs_f64);
    let state = densevm_vmm::snapshot::restore::read_snapshot(&dir)
        .with_context(|| format!("could not restore the VM from {}", dir.display()))?;
    let mut specs: crate::cmd::devices::DeviceSpecs = if state.device_specs.is_null() {
        Default::default()
    } else {
        serde_json::from_value(state.device_specs.clone())
            .with_context(|| format!("snapshot {}: its device list", dir.display()))?
    };
    if let Some(index) = args.clone_index {
        crate::cmd::clones::use_clone_overlays(&mut specs, &dir, index);
    }
    crate::cmd::devices::override_nets(&mut specs.nets, &args.net_override, None)
        .with_context(|| format!("snapshot {}", dir.display()))?;
    let (devices, disk_handles) = specs
        .open()
        .with_context(|| format!("snapshot {}: cannot open its devices again", dir.display()))?;
    let pmem = PmemRegions::open(&specs.pmem).with_context(|| {
        format!(
            "snapshot {}: cannot map its --pmem images again",
            dir.display()
        )
    })?;
    let mut vmm = densevm_vmm::build_restored(
        densevm_vmm::RestoreSource {
            dir: dir.clone(),
            ram,
            instance: args.clone_index.map_or(0, |k| k + 1),
            memory_budget: args.memory_budget.clone(),
        },
        state,
        densevm_vmm::Reopened {
            external: pmem.external_regions(),
            virtio: devices,
        },
        console,
        timeout,
        origin,
        args.report || args.report_json.is_some() || args.json,
    )
    .with_context(|| format!("could not restore the VM from {}", dir.display()))?;
    if let Some(fd) = args.ready_fd {
        vmm.on_running(crate::cmd::clones::signal_ready(fd));
    }
    let outcome = run_with_api(&args, vmm, &specs, disk_handles, &pmem)?;
    pmem.flush()?;
    if args.trace {
        eprint!("{}", outcome.trace.table());
    }
    // `--report` and `--report-json` as for a boot (they were ignored here until
    // 2026-12-06), the trace included: a restore's start-up is what it is for.
    let mut doc = json!({
        "exit_code": outcome.end.exit_code(),
        "end": outcome.end.to_string(),
        "error": outcome.end.is_error(),
        "restored_from": dir.display().to_string(),
        "trace_ms": trace_ms(&outcome),
    });
    add_figures(doc.as_object_mut().expect("object"), &outcome);
    report(&args, &outcome, &doc)?;
    if outcome.end.is_error() {
        eprintln!("densevm: error: {}", outcome.end);
    }
    Ok(outcome.end.exit_code())
}
