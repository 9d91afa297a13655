//! `densevm run --jail DIR --uid N --gid N`: what a VM's command line references, as a
//! [`densevm_jail::Plan`], and the fork into the jail (crates/jail; docs/security.md).

use crate::cmd::run::RunArgs;
use anyhow::Context;
use clap::Args;
use densevm_jail::{JailFlags, Launched, PlanBuilder};
use std::path::{Path, PathBuf};

// The jail flags of `densevm run`.
#[derive(Args, Debug, Default, Clone)]
pub struct JailArgs {
    /// Run the VM jailed (needs root): new PID, mount, IPC and network namespaces, a root
    /// on a tmpfs mounted over DIR (an existing, empty directory; nothing is written to it
    /// on the host) holding only the files this command line names, at their own paths,
    /// plus /dev/kvm, /dev/userfaultfd, /dev/null (/dev/net/tun with --net), a cgroup
    /// densevm/ID, and the VMM as --uid/--gid with no capabilities. Paths given later on the
    /// API (snapshot and clone directories) are paths inside the jail. See docs/security.md.
    #[arg(long, value_name = "DIR")]
    pub jail: Option<PathBuf>,
    /// The unprivileged uid the jailed VMM runs as (a number of its own; no passwd entry
    /// needed). Its sockets' directories must be writable by it; a --net tap must be owned
    /// by it (`ip tuntap add NAME mode tap user N`).
    #[arg(long, value_name = "N")]
    pub uid: Option<u32>,
    /// The gid the jailed VMM runs as (its only group).
    #[arg(long, value_name = "N")]
    pub gid: Option<u32>,
    /// The jail's id: its cgroup is densevm/ID [default: the outer process's PID].
    #[arg(long, value_name = "ID")]
    pub jail_id: Option<String>,
    /// The jail's network namespace: `new` (empty; the default without --net), `host` (the
    /// default with --net: the taps are there) or the path of a named one, e.g.
    /// /run/netns/vm1 (`ip netns add vm1`; create the tap in it).
    #[arg(long, value_name = "new|host|PATH")]
    pub netns: Option<String>,
    /// Print, as JSON, exactly which files and devices the jailed VM could reach, and exit.
    #[arg(long)]
    pub jail_list: bool,
}

fn abs(p: &mut PathBuf) {
    if let Ok(a) = std::path::absolute(&*p) {
        *p = a;
    }
}

/// Makes every path of `args` absolute (the jailed process's working directory is `/`).
fn absolutize(args: &mut RunArgs) {
    for p in [&mut args.kernel, &mut args.initrd, &mut args.api_sock]
        .into_iter()
        .chain([&mut args.console_sock, &mut args.restore])
        .flatten()
    {
        abs(p);
    }
    args.disk.iter_mut().for_each(|d| abs(&mut d.path));
    args.share.iter_mut().for_each(|s| abs(&mut s.dir));
    args.pmem.iter_mut().for_each(abs);
    if let Some(v) = &mut args.vsock {
        abs(&mut v.uds);
    }
    if let Some(t) = &mut args.memory_budget {
        abs(&mut t.swap_dir);
    }
    if let Some(r) = &mut args.report_json {
        if r != "-" {
            let mut p = PathBuf::from(&*r);
            abs(&mut p);
            *r = p.display().to_string();
        }
    }
}

/// The files of a pcow image's chain, top first.
fn chain_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let chain = pcow::Chain::open(path, pcow::OpenOptions::default())
        .with_context(|| format!("{}: cannot read its pcow chain", path.display()))?;
    Ok(chain.layer_files().into_iter().map(|l| l.path).collect())
}

fn add_chain(
    mut b: PlanBuilder,
    path: &Path,
    readonly: bool,
    why: &str,
) -> anyhow::Result<PlanBuilder> {
    for (i, f) in chain_files(path)?.into_iter().enumerate() {
        b = if i == 0 {
            b.file(f, readonly, why)
        } else {
            b.file(f, true, &format!("{why} (base image)"))
        };
    }
    Ok(b)
}

/// Adds what a device list references.
fn add_devices(
    mut b: PlanBuilder,
    specs: &crate::cmd::devices::DeviceSpecs,
) -> anyhow::Result<PlanBuilder> {
    for (i, d) in specs.disks.iter().enumerate() {
        let why = format!("--disk {i}");
        b = if d.pcow {
            add_chain(b, &d.path, d.readonly, &why)?
        } else {
            b.file(&d.path, d.readonly, &why)
        };
    }
    for s in &specs.shares {
        b = b.dir(&s.dir, s.readonly, &format!("--share tag={}", s.tag));
    }
    for (i, p) in specs.pmem.iter().enumerate() {
        b = add_chain(b, p, false, &format!("--pmem {i}"))?;
    }
    if let Some(v) = &specs.vsock {
        b = b.parent_dir(&v.uds, "--vsock uds (its socket and PATH_PORT sockets)");
    }
    for n in &specs.nets {
        b = b.tap(&n.tap);
    }
    Ok(b)
}

/// The ELF interpreter (`PT_INTERP`, e.g. /lib64/ld-linux-x86-64.so.2) a dynamically
/// linked executable names, as the kernel looks it up.
fn interpreter(elf: &[u8]) -> Option<PathBuf> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20)? as usize, u16_at(0x36)?, u16_at(0x38)?);
    (0..phnum as usize).find_map(|i| {
        let ph = phoff + i * phentsize as usize;
        if elf.get(ph..ph + 4)? != 3u32.to_le_bytes() {
            return None;
        }
        let (off, len) = (u64_at(ph + 8)? as usize, u64_at(ph + 32)? as usize);
        let name = elf.get(off..off + len)?.split(|b| *b == 0).next()?;
        Some(PathBuf::from(std::str::from_utf8(name).ok()?))
    })
}

/// The densevm binary, its ELF interpreter and the shared libraries mapped into this
/// process (read from /proc/self/maps), which a clone process started from the jail needs
/// to exec.
fn exec_files() -> anyhow::Result<Vec<PathBuf>> {
    let exe = std::env::current_exe()?;
    let interp = interpreter(&std::fs::read(&exe)?);
    let mut out = vec![exe];
    out.extend(interp);
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for line in maps.lines() {
        if let Some(p) = line.split_whitespace().nth(5) {
            let name = Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if p.starts_with('/') && (name.ends_with(".so") || name.contains(".so.")) {
                let p = PathBuf::from(p);
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    Ok(out)
}

/// The devices of the snapshot `--restore` names, with `--net-override` applied.
fn restored_devices(args: &RunArgs) -> anyhow::Result<Option<crate::cmd::devices::DeviceSpecs>> {
    let Some(dir) = &args.restore else {
        return Ok(None);
    };
    let state = densevm_vmm::snapshot::restore::read_snapshot(dir)
        .with_context(|| format!("--restore {}", dir.display()))?;
    let mut specs: crate::cmd::devices::DeviceSpecs = if state.device_specs.is_null() {
        Default::default()
    } else {
        serde_json::from_value(state.device_specs)
            .with_context(|| format!("snapshot {}: its device list", dir.display()))?
    };
    crate::cmd::devices::override_nets(&mut specs.nets, &args.net_override, None)
        .with_context(|| format!("snapshot {}", dir.display()))?;
    Ok(Some(specs))
}

/// The plan for `args` (paths already absolute; `restored`: the snapshot's devices).
fn plan(
    args: &RunArgs,
    spec: densevm_jail::JailSpec,
    restored: Option<&crate::cmd::devices::DeviceSpecs>,
) -> anyhow::Result<densevm_jail::Plan> {
    let mut b = PlanBuilder::new(spec);
    if let Some(k) = &args.kernel {
        b = b.file(k, true, "--kernel");
    }
    if let Some(i) = &args.initrd {
        b = b.file(i, true, "--initrd");
    }
    let specs = args.device_specs();
    b = add_devices(b, &specs)?;
    if let (Some(dir), Some(specs)) = (&args.restore, restored) {
        b = b.dir(dir, false, "--restore (snapshot and clone overlays)");
        b = add_devices(b, specs)?;
    }
    if let Some(p) = &args.api_sock {
        b = b.parent_dir(p, "--api-sock");
        for f in exec_files()? {
            b = b.file(f, true, "exec of clone processes (POST /clones)");
        }
    }
    if let Some(p) = &args.console_sock {
        b = b.parent_dir(p, "--console-sock");
    }
    if let Some(r) = args.report_json.as_deref().filter(|r| *r != "-") {
        b = b.parent_dir(Path::new(r), "--report-json");
    }
    if let Some(t) = &args.memory_budget {
        b = b.dir(&t.swap_dir, false, "--memory-budget swap_dir");
    }
    Ok(b.build()?)
}

/// With `--jail`, forks into the jail: returns `Ok(None)` in the jailed process (go on and
/// run the VM) and `Ok(Some(code))` in the outer process once the VM has ended (or at once
/// for `--jail-list`). Without `--jail`: `Ok(None)`. Call it first in `run`, while the
/// process is single-threaded.
pub fn enter(args: &mut RunArgs) -> anyhow::Result<Option<i32>> {
    let j = &args.jail;
    let flags = JailFlags {
        jail: j.jail.clone(),
        uid: j.uid,
        gid: j.gid,
        id: j.jail_id.clone(),
        netns: j.netns.clone(),
        list: j.jail_list,
    };
    if flags.jail.is_none() {
        // Only the checks: flags that need --jail are refused.
        flags.validate(false, 0)?;
        return Ok(None);
    }
    absolutize(args);
    let restored = restored_devices(args)?;
    let has_net = !args.net.is_empty() || restored.as_ref().is_some_and(|r| !r.nets.is_empty());
    let Some(spec) = flags.validate(has_net, std::process::id())? else {
        return Ok(None);
    };
    // The VM's id as GET / reports it: the outer PID, not the jailed one (always 1).
    args.id
        .get_or_insert_with(|| format!("densevm-{}", std::process::id()));
    let plan = plan(args, spec, restored.as_ref())?;
    if args.jail.jail_list {
        crate::output::print_json(&plan.to_json())?;
        return Ok(Some(0));
    }
    match densevm_jail::launch(&plan)? {
        Launched::Jailed => Ok(None),
        Launched::Exited(code) => Ok(Some(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_elf_interpreter_of_this_binary_is_found() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let interp = interpreter(&exe).expect("a dynamically linked test binary has PT_INTERP");
        assert!(interp.is_absolute() && interp.exists(), "{interp:?}");
        assert_eq!(interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(interpreter(&exe[..64]), None);
    }

    #[test]
    fn exec_files_hold_the_binary_its_interpreter_and_libc() {
        let files = exec_files().unwrap();
        assert_eq!(files[0], std::env::current_exe().unwrap());
        assert!(
            files
                .iter()
                .any(|f| f.to_string_lossy().contains("libc.so")),
            "{files:?}"
        );
        assert!(
            files.iter().all(|f| f.is_absolute() && f.exists()),
            "{files:?}"
        );
    }
}
