//! `densevm kernel`: inspect kernel images and extract the ELF vmlinux from a bzImage.

use anyhow::Context;
use clap::{Args, Subcommand};
use densevm_kernel::{
    detect_format, extract_vmlinux_with_progress, parse_elf, read_bzimage_header, BzImageHeader,
    ElfKernel, ExtractProgress, KernelFormat,
};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

// Arguments of `densevm kernel`.
#[derive(Args, Debug)]
pub struct KernelArgs {
    #[command(subcommand)]
    command: KernelCommand,
}

#[derive(Subcommand, Debug)]
enum KernelCommand {
    /// Extract the ELF vmlinux from a bzImage (xz, gzip or lz4 payload).
    Extract(ExtractArgs),
    /// Describe a bzImage or ELF kernel: header, compression, PT_LOAD segments, PVH entry.
    Info(InfoArgs),
}

#[derive(Args, Debug)]
struct ExtractArgs {
    /// The bzImage to read (e.g. /boot/vmlinuz-6.1.0-NN-amd64).
    bzimage: PathBuf,
    /// Where to write the vmlinux (written to a temporary file, then renamed).
    #[arg(short, long)]
    output: PathBuf,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// Show progress on stderr even when it is not a terminal.
    #[arg(long)]
    progress: bool,
}

#[derive(Args, Debug)]
struct InfoArgs {
    /// A bzImage or an ELF vmlinux.
    file: PathBuf,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand; returns the process exit code.
pub fn main(args: KernelArgs) -> anyhow::Result<i32> {
    match args.command {
        KernelCommand::Extract(a) => extract(a),
        KernelCommand::Info(a) => info(a),
    }
}

#[derive(Serialize)]
struct ExtractSummary {
    input: PathBuf,
    output: PathBuf,
    compression: String,
    input_bytes: u64,
    output_bytes: u64,
    seconds: f64,
    pvh_entry: Option<u64>,
    load_segments: usize,
}

fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}; check the path", path.display()))
}

fn extract(args: ExtractArgs) -> anyhow::Result<i32> {
    let data = read_file(&args.bzimage)?;
    let header = read_bzimage_header(&data).with_context(|| {
        format!(
            "{} is not a usable bzImage (pass the vmlinuz from a linux-image package)",
            args.bzimage.display()
        )
    })?;
    let show_progress = args.progress || std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last_mib = 0;
    let mut report = |p: ExtractProgress| {
        let mib = p.output_done >> 20;
        if show_progress && mib >= last_mib + 4 {
            last_mib = mib;
            let pct = 100 * p.input_done / p.input_total.max(1);
            eprint!("\rdensevm: extracting: {pct:3}% of input, {mib} MiB out");
            let _ = std::io::stderr().flush();
        }
    };
    let vmlinux = extract_vmlinux_with_progress(&data, &mut report)
        .with_context(|| format!("cannot extract the vmlinux from {}", args.bzimage.display()))?;
    if show_progress {
        eprintln!("\rdensevm: extracting: done{:30}", "");
    }
    write_atomically(&args.output, &vmlinux)?;
    let elf = parse_elf(&vmlinux).context("the extracted vmlinux does not parse")?;
    let summary = ExtractSummary {
        input: args.bzimage.clone(),
        output: args.output.clone(),
        compression: header.compression.to_string(),
        input_bytes: data.len() as u64,
        output_bytes: vmlinux.len() as u64,
        seconds: started.elapsed().as_secs_f64(),
        pvh_entry: elf.pvh_entry,
        load_segments: elf.segments.len(),
    };
    if args.json {
        crate::output::print_json(&summary)?;
    } else {
        println!(
            "{}: {} bytes ({}) -> {}: {} bytes in {:.2} s; {} PT_LOAD segments, PVH entry {}",
            summary.input.display(),
            summary.input_bytes,
            summary.compression,
            summary.output.display(),
            summary.output_bytes,
            summary.seconds,
            summary.load_segments,
            summary
                .pvh_entry
                .map_or("none".to_string(), |e| format!("{e:#x}")),
        );
    }
    Ok(0)
}

/// Writes `bytes` to a temporary file next to `path`, then renames it over `path`, so
/// a VM that maps the old file keeps its (unchanged) inode.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!(
            "cannot write {}: {e}; check the directory exists and is writable",
            path.display()
        )
    })
}

#[derive(Serialize)]
struct InfoReport {
    file: PathBuf,
    format: KernelFormat,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    bzimage: Option<BzImageHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    elf: Option<ElfKernel>,
}

fn info(args: InfoArgs) -> anyhow::Result<i32> {
    let data = read_file(&args.file)?;
    let format = detect_format(&data);
    let mut report = InfoReport {
        file: args.file.clone(),
        format,
        size: data.len() as u64,
        bzimage: None,
        elf: None,
    };
    match format {
        KernelFormat::BzImage => {
            report.bzimage = Some(
                read_bzimage_header(&data)
                    .with_context(|| format!("{} has a bad bzImage header", args.file.display()))?,
            )
        }
        KernelFormat::Elf => {
            report.elf = Some(parse_elf(&data).with_context(|| {
                format!(
                    "{} is not a loadable x86_64 ELF kernel",
                    args.file.display()
                )
            })?)
        }
        KernelFormat::Unknown => anyhow::bail!(
            "{} is neither a bzImage nor an ELF file; pass a vmlinuz or a vmlinux",
            args.file.display()
        ),
    }
    if args.json {
        crate::output::print_json(&report)?;
        return Ok(0);
    }
    println!("{}: {} bytes", report.file.display(), report.size);
    if let Some(h) = &report.bzimage {
        println!(
            "  format            bzImage, boot protocol {}",
            h.protocol_string()
        );
        println!("  compression       {}", h.compression);
        println!(
            "  payload           offset {:#x}, {} bytes",
            h.payload_offset, h.payload_length
        );
        println!(
            "  xloadflags        {:#x} [{}]",
            h.xloadflags.0,
            h.xloadflags.names().join(" ")
        );
        println!(
            "  relocatable       {} (alignment {:#x})",
            h.relocatable, h.kernel_alignment
        );
        println!("  pref_address      {:#x}", h.pref_address);
        println!(
            "  init_size         {:#x} ({} MiB)",
            h.init_size,
            h.init_size >> 20
        );
        println!("  cmdline_size      {}", h.cmdline_size);
    }
    if let Some(e) = &report.elf {
        println!("  format            ELF x86_64, entry {:#x}", e.entry);
        match e.pvh_entry {
            Some(p) => println!("  PVH entry         {p:#x}"),
            None => println!("  PVH entry         none (no XEN_ELFNOTE_PHYS32_ENTRY)"),
        }
        println!(
            "  load range        {:#x}..{:#x}",
            e.load_start(),
            e.load_end()
        );
        println!("  PT_LOAD  paddr        offset     filesz     memsz      flags mappable");
        for s in &e.segments {
            println!(
                "           {:<12x} {:<10x} {:<10x} {:<10x} {:<5} {}",
                s.paddr,
                s.offset,
                s.filesz,
                s.memsz,
                s.flags.as_rwx(),
                s.mappable()
            );
        }
    }
    Ok(0)
}
