//! `densevm image`: qemu-img-like verbs for pcow images.

use std::io::{IsTerminal, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use pcow::{Chain, CreateOptions, EntryKind, OpenOptions};
use serde::Serialize;

use crate::output::print_json;

// Arguments of `densevm image`.
#[derive(Args, Debug)]
pub struct ImageArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// Create an image: `create FILE SIZE [-o cluster_size=64K] [-b BASE]`.
    Create {
        file: PathBuf,
        /// Virtual size (K, M, G, T suffixes).
        size: String,
        /// Options, e.g. `cluster_size=64K`.
        #[arg(short = 'o')]
        options: Option<String>,
        /// Backing file (path relative to the new image's directory, as stored).
        #[arg(short = 'b')]
        backing: Option<String>,
    },
    /// Show an image's header, chain and usage.
    Info {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Check metadata; exit 0 clean, 2 corruption, 3 leaks only, 1 could not check.
    Check {
        file: PathBuf,
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },
    /// Snapshot verbs: create|list|apply|delete FILE [NAME].
    Snapshot {
        action: SnapshotAction,
        file: PathBuf,
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Copy the image's data into its backing file and empty it.
    Commit {
        file: PathBuf,
        #[arg(short = 'p', long)]
        progress: bool,
    },
    /// Change the backing file (`-b ""` removes it); `-u` only rewrites the header.
    Rebase {
        file: PathBuf,
        #[arg(short = 'b')]
        backing: String,
        #[arg(short = 'u')]
        unsafe_mode: bool,
        #[arg(short = 'p', long)]
        progress: bool,
    },
    /// Move clusters into holes and truncate the file.
    Compact {
        file: PathBuf,
        #[arg(short = 'p', long)]
        progress: bool,
    },
    /// Show which logical clusters live where, per layer.
    Map {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Convert between raw, pcow and qcow2 (qcow2 through qemu-img).
    Convert {
        #[arg(short = 'f')]
        from: String,
        #[arg(short = 'O')]
        to: String,
        /// Options for a pcow destination, e.g. `cluster_size=64K`.
        #[arg(short = 'o')]
        options: Option<String>,
        #[arg(short = 'p', long)]
        progress: bool,
        src: PathBuf,
        dst: PathBuf,
    },
}

#[derive(clap::ValueEnum, Clone, Debug)]
enum SnapshotAction {
    Create,
    List,
    Apply,
    Delete,
}

/// Runs the subcommand; returns the process exit code.
pub fn main(args: ImageArgs) -> anyhow::Result<i32> {
    match args.verb {
        Verb::Create {
            file,
            size,
            options,
            backing,
        } => {
            let opts = CreateOptions {
                virtual_size: parse_size(&size)?,
                cluster_size: cluster_size_option(options.as_deref())?,
                backing,
            };
            pcow::create_file(&file, &opts)
                .with_context(|| format!("creating {} (does it already exist?)", file.display()))?;
            println!(
                "Formatting '{}', fmt=pcow size={}",
                file.display(),
                opts.virtual_size
            );
            Ok(0)
        }
        Verb::Info { file, json } => info(&file, json),
        Verb::Check { file, repair, json } => check(&file, repair, json),
        Verb::Snapshot {
            action,
            file,
            name,
            json,
        } => snapshot(action, &file, name, json),
        Verb::Commit { file, progress } => {
            let mut chain = open_rw(&file, true)?;
            chain.commit(progress_fn("commit", progress))?;
            println!("Image committed.");
            Ok(0)
        }
        Verb::Rebase {
            file,
            backing,
            unsafe_mode,
            progress,
        } => {
            let mut chain = open_rw(&file, false)?;
            let new_base = if backing.is_empty() {
                None
            } else {
                let dir = file.parent().unwrap_or(Path::new("."));
                let nb = Chain::open(&dir.join(&backing), OpenOptions::default())
                    .with_context(|| format!("opening new backing file {backing}"))?;
                Some((backing.as_str(), nb))
            };
            chain.rebase(new_base, unsafe_mode, progress_fn("rebase", progress))?;
            Ok(0)
        }
        Verb::Compact { file, progress } => {
            let mut chain = open_rw(&file, false)?;
            let saved = chain.compact(progress_fn("compact", progress))?;
            println!("Compacted: file shrank by {saved} bytes.");
            Ok(0)
        }
        Verb::Map { file, json } => map(&file, json),
        Verb::Convert {
            from,
            to,
            options,
            progress,
            src,
            dst,
        } => convert(&from, &to, options.as_deref(), progress, &src, &dst),
    }
}

fn open_rw(file: &Path, bases: bool) -> anyhow::Result<Chain> {
    Chain::open(
        file,
        OpenOptions {
            writable: true,
            writable_bases: bases,
            allow_corrupt: false,
        },
    )
    .with_context(|| format!("opening {} for writing", file.display()))
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num.parse().with_context(|| {
        format!("size {s:?}: expected a number with an optional K/M/G/T suffix")
    })?;
    n.checked_mul(mult)
        .with_context(|| format!("size {s:?} is too large"))
}

fn cluster_size_option(options: Option<&str>) -> anyhow::Result<u64> {
    let mut cs = 64 << 10;
    for opt in options.unwrap_or("").split(',').filter(|o| !o.is_empty()) {
        match opt.split_once('=') {
            Some(("cluster_size", v)) => cs = parse_size(v)?,
            _ => bail!("unknown option {opt:?} (supported: cluster_size=SIZE)"),
        }
    }
    Ok(cs)
}

/// Returns a progress callback that prints to stderr when it is a TTY or when asked.
fn progress_fn(what: &'static str, asked: bool) -> impl FnMut(u64, u64) {
    let show = asked || std::io::stderr().is_terminal();
    let mut last = u64::MAX;
    move |done, total| {
        if !show || total == 0 {
            return;
        }
        let pct = done * 100 / total;
        if pct != last {
            last = pct;
            eprint!("\r{what}: {pct:3}% ({done}/{total})");
            if done == total {
                eprintln!();
            }
        }
    }
}

#[derive(Serialize)]
struct InfoOut {
    filename: String,
    format: &'static str,
    format_version: u32,
    virtual_size: u64,
    cluster_size: u64,
    file_size: u64,
    allocated_clusters: u64,
    backing_filename: Option<String>,
    chain: Vec<String>,
    snapshots: Vec<SnapshotOut>,
}

#[derive(Serialize)]
struct SnapshotOut {
    name: String,
    epoch: u32,
    created_unix_ns: u64,
    virtual_size: u64,
}

fn info(file: &Path, json: bool) -> anyhow::Result<i32> {
    let chain = Chain::open(file, OpenOptions::default())
        .with_context(|| format!("opening {}", file.display()))?;
    let top = &chain.images()[0];
    let h = top.header();
    let allocated = (0..top.slot_count())
        .filter(|&s| top.slot(s).kind == EntryKind::Data)
        .count() as u64;
    let out = InfoOut {
        filename: file.display().to_string(),
        format: "pcow",
        format_version: pcow::format::VERSION,
        virtual_size: h.virtual_size,
        cluster_size: chain.cluster_size(),
        file_size: top.storage().len()?,
        allocated_clusters: allocated,
        backing_filename: (!h.backing_name.is_empty()).then(|| h.backing_name.clone()),
        chain: chain
            .images()
            .iter()
            .map(|i| i.path().display().to_string())
            .collect(),
        snapshots: snapshots_out(&chain),
    };
    if json {
        print_json(&out)?;
    } else {
        println!("image: {}", out.filename);
        println!("file format: pcow (version {})", out.format_version);
        println!("virtual size: {} bytes", out.virtual_size);
        println!("disk size: {} bytes", out.file_size);
        println!("cluster_size: {}", out.cluster_size);
        println!("allocated clusters: {}", out.allocated_clusters);
        if let Some(b) = &out.backing_filename {
            println!("backing file: {b}");
        }
        if !out.snapshots.is_empty() {
            println!("Snapshot list:");
            for s in &out.snapshots {
                println!("  {} (epoch {})", s.name, s.epoch);
            }
        }
    }
    Ok(0)
}

fn snapshots_out(chain: &Chain) -> Vec<SnapshotOut> {
    chain
        .snapshot_list()
        .into_iter()
        .map(|s| SnapshotOut {
            name: s.record.name,
            epoch: s.record.epoch,
            created_unix_ns: s.record.created_ns,
            virtual_size: s.record.virtual_size,
        })
        .collect()
}

fn check(file: &Path, repair: bool, json: bool) -> anyhow::Result<i32> {
    let opts = OpenOptions {
        writable: repair,
        writable_bases: false,
        allow_corrupt: true,
    };
    let mut chain = match Chain::open(file, opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("densevm: error: could not check {}: {e}", file.display());
            return Ok(1);
        }
    };
    let mut repaired = None;
    if repair {
        repaired = Some(chain.repair().context("repair failed")?);
    }
    let report = chain.check();
    if json {
        #[derive(Serialize)]
        struct Out<'a> {
            report: &'a pcow::CheckReport,
            repaired: Option<pcow::RepairSummary>,
            exit_code: i32,
        }
        print_json(&Out {
            report: &report,
            repaired,
            exit_code: report.exit_code(),
        })?;
    } else {
        if let Some(r) = &repaired {
            println!(
                "Repaired: {} entries cleared, {} slots freed, {} snapshots dropped",
                r.entries_cleared, r.slots_freed, r.snapshots_dropped
            );
        }
        for p in &report.corruptions {
            println!("ERROR: {}", p.what);
        }
        for p in &report.leaks {
            println!("Leaked: {}", p.what);
        }
        match report.exit_code() {
            0 => println!("No errors were found on the image."),
            2 => println!(
                "{} errors were found; run `densevm image check --repair {}`",
                report.corruptions.len(),
                file.display()
            ),
            _ => println!(
                "{} leaked clusters were found; run with --repair to reclaim them",
                report.leaks.len()
            ),
        }
        println!(
            "{}/{} slots used by data clusters",
            report.allocated_clusters, report.total_slots
        );
    }
    Ok(report.exit_code())
}

fn snapshot(
    action: SnapshotAction,
    file: &Path,
    name: Option<String>,
    json: bool,
) -> anyhow::Result<i32> {
    let need_name = || {
        name.clone()
            .context("this snapshot verb needs a NAME: `densevm image snapshot create FILE NAME`")
    };
    match action {
        SnapshotAction::List => {
            let chain = Chain::open(file, OpenOptions::default())?;
            let list = snapshots_out(&chain);
            if json {
                print_json(&list)?;
            } else {
                println!("{:<6} {:<32} {:>20}", "EPOCH", "NAME", "CREATED (unix s)");
                for s in list {
                    println!(
                        "{:<6} {:<32} {:>20}",
                        s.epoch,
                        s.name,
                        s.created_unix_ns / 1_000_000_000
                    );
                }
            }
        }
        SnapshotAction::Create => open_rw(file, false)?.snapshot_create(&need_name()?)?,
        SnapshotAction::Apply => open_rw(file, false)?.snapshot_apply(&need_name()?)?,
        SnapshotAction::Delete => open_rw(file, false)?.snapshot_delete(&need_name()?)?,
    }
    Ok(0)
}

#[derive(Serialize)]
struct MapRun {
    layer: usize,
    file: String,
    epoch: u32,
    logical_start: u64,
    clusters: u64,
    file_offset: u64,
    kind: EntryKind,
    full: bool,
}

fn map(file: &Path, json: bool) -> anyhow::Result<i32> {
    let chain = Chain::open(file, OpenOptions::default())?;
    let units = chain.geometry().units();
    let cs = chain.cluster_size();
    let mut runs: Vec<MapRun> = Vec::new();
    for layer in (0..chain.layer_count()).rev() {
        let (img, epoch) = chain.layer_info(layer).expect("layer exists");
        let fname = chain.images()[img].path().display().to_string();
        for (logical, loc) in chain.layer_clusters(layer) {
            let full = loc.kind == EntryKind::Data && loc.is_full(units);
            if let Some(r) = runs.last_mut() {
                if r.layer == layer
                    && r.kind == loc.kind
                    && r.full == full
                    && r.logical_start + r.clusters == logical
                    && r.file_offset + r.clusters * cs == loc.file_offset
                {
                    r.clusters += 1;
                    continue;
                }
            }
            runs.push(MapRun {
                layer,
                file: fname.clone(),
                epoch,
                logical_start: logical,
                clusters: 1,
                file_offset: loc.file_offset,
                kind: loc.kind,
                full,
            });
        }
    }
    if json {
        print_json(&runs)?;
    } else {
        println!(
            "{:>5} {:>6} {:>18} {:>10} {:>18} {:<6} FILE",
            "LAYER", "EPOCH", "OFFSET", "LENGTH", "FILE OFFSET", "KIND"
        );
        for r in &runs {
            let kind = match (r.kind, r.full) {
                (EntryKind::Zero, _) => "zero",
                (_, true) => "data",
                _ => "part",
            };
            println!(
                "{:>5} {:>6} {:>#18x} {:>10} {:>#18x} {:<6} {}",
                r.layer,
                r.epoch,
                r.logical_start * cs,
                r.clusters * cs,
                r.file_offset,
                kind,
                r.file
            );
        }
    }
    Ok(0)
}

fn qemu_img(args: &[&std::ffi::OsStr]) -> anyhow::Result<()> {
    let status = std::process::Command::new("qemu-img")
        .args(args)
        .status()
        .context("running qemu-img (install the Debian package qemu-utils: `make deps`)")?;
    if !status.success() {
        bail!("qemu-img {:?} failed with {status}", args);
    }
    Ok(())
}

fn temp_next_to(dst: &Path) -> PathBuf {
    let mut name = dst.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.raw.tmp", std::process::id()));
    dst.with_file_name(name)
}

fn convert(
    from: &str,
    to: &str,
    options: Option<&str>,
    progress: bool,
    src: &Path,
    dst: &Path,
) -> anyhow::Result<i32> {
    match (from, to) {
        ("raw", "pcow") => raw_to_pcow(src, dst, cluster_size_option(options)?, progress),
        ("pcow", "raw") => pcow_to_raw(src, dst, progress),
        ("qcow2", "pcow") => {
            let tmp = temp_next_to(dst);
            qemu_img(&[
                "convert".as_ref(),
                "-f".as_ref(),
                "qcow2".as_ref(),
                "-O".as_ref(),
                "raw".as_ref(),
                src.as_os_str(),
                tmp.as_os_str(),
            ])?;
            let r = raw_to_pcow(&tmp, dst, cluster_size_option(options)?, progress);
            let _ = std::fs::remove_file(&tmp);
            r
        }
        ("pcow", "qcow2") => {
            let tmp = temp_next_to(dst);
            pcow_to_raw(src, &tmp, progress)?;
            let r = qemu_img(&[
                "convert".as_ref(),
                "-f".as_ref(),
                "raw".as_ref(),
                "-O".as_ref(),
                "qcow2".as_ref(),
                tmp.as_os_str(),
                dst.as_os_str(),
            ]);
            let _ = std::fs::remove_file(&tmp);
            r.map(|_| 0)
        }
        _ => bail!("unsupported conversion {from} -> {to} (supported: raw<->pcow, qcow2<->pcow)"),
    }
}

/// Raw → pcow through the bulk import (`pcow::bulk`): the image is built in a temporary
/// file next to `dst` (data in large sequential writes, each meta cluster written once, the
/// header last), flushed once and renamed into place, so an interrupted convert never leaves
/// a file under `dst`'s name.
fn raw_to_pcow(src: &Path, dst: &Path, cs: u64, progress: bool) -> anyhow::Result<i32> {
    pcow::import_raw(src, dst, cs, progress_fn("convert", progress))
        .with_context(|| format!("converting {} to {}", src.display(), dst.display()))?;
    Ok(0)
}

fn pcow_to_raw(src: &Path, dst: &Path, progress: bool) -> anyhow::Result<i32> {
    let chain = Chain::open(src, OpenOptions::default())
        .with_context(|| format!("opening {}", src.display()))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .with_context(|| format!("creating {} (does it already exist?)", dst.display()))?;
    let size = chain.virtual_size();
    out.set_len(size)?;
    let cs = chain.cluster_size();
    let mut buf = vec![0u8; cs as usize];
    let mut report = progress_fn("convert", progress);
    let total = chain.virtual_clusters();
    for logical in 0..total {
        if chain.lookup(logical).is_some() {
            let start = logical * cs;
            let n = cs.min(size - start) as usize;
            chain.read(start, &mut buf[..n])?;
            if buf[..n].iter().any(|&b| b != 0) {
                out.seek(SeekFrom::Start(start))?;
                out.write_all(&buf[..n])?;
            }
        }
        if logical % 1024 == 0 || logical + 1 == total {
            report(logical + 1, total);
        }
    }
    out.sync_data()?;
    Ok(0)
}
