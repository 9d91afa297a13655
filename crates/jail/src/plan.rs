//! The pure part of a jailed launch: the flags checked ([`JailFlags::validate`]) and the
//! exact list of paths and devices one VM may reach ([`Plan`]), computed from what its
//! configuration names. No system calls here: every check is on the values given, so all
//! of it is unit-tested.

use crate::{JailError, Result};
use serde::Serialize;
use std::path::{Component, Path, PathBuf};

/// The jail flags of `densevm run` as given (before any check).
#[derive(Debug, Clone, Default)]
pub struct JailFlags {
    /// `--jail DIR`.
    pub jail: Option<PathBuf>,
    /// `--uid N`.
    pub uid: Option<u32>,
    /// `--gid N`.
    pub gid: Option<u32>,
    /// `--jail-id ID` (default: the outer process's PID).
    pub id: Option<String>,
    /// `--netns new|host|PATH`.
    pub netns: Option<String>,
    /// `--jail-list`: print the plan and exit.
    pub list: bool,
}

/// Which network namespace the jailed VM lives in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Netns {
    /// A new, empty one (loopback only, down): the default without `--net`.
    New,
    /// The host's (the namespace densevm was started in): the default with `--net`, so the
    /// taps the user created are there.
    Host,
    /// An existing named one (`ip netns add NAME` makes `/run/netns/NAME`), joined with
    /// `setns`; its taps must be created in it.
    Join(PathBuf),
}

/// Validated jail settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JailSpec {
    /// DIR: where the root is built (a tmpfs is mounted over it in the jail's mount namespace).
    pub root: PathBuf,
    /// The uid the VMM runs as.
    pub uid: u32,
    /// The gid the VMM runs as (and its only group).
    pub gid: u32,
    /// The cgroup's name under `densevm/`.
    pub id: String,
    /// The network namespace.
    pub netns: Netns,
}

/// True for a string usable as a jail id (and so as a cgroup directory name).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// True when `p` is absolute and has no `.`, `..` or empty components (a path the jail can
/// recreate exactly).
fn normal_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

impl JailFlags {
    /// Checks the flags: `Ok(None)` without `--jail`. `has_net` says whether the VM has a
    /// `--net` tap (which picks the default network namespace); `pid` names the cgroup when
    /// `--jail-id` is not given.
    pub fn validate(&self, has_net: bool, pid: u32) -> Result<Option<JailSpec>> {
        let bad = |m: String| Err(JailError::Invalid(m));
        let Some(root) = &self.jail else {
            for (given, flag) in [
                (self.uid.is_some(), "--uid"),
                (self.gid.is_some(), "--gid"),
                (self.id.is_some(), "--jail-id"),
                (self.netns.is_some(), "--netns"),
                (self.list, "--jail-list"),
            ] {
                if given {
                    return bad(format!(
                        "{flag} only applies to a jailed launch: add --jail DIR --uid N --gid N"
                    ));
                }
            }
            return Ok(None);
        };
        if !normal_absolute(root) {
            return bad(format!(
                "--jail {}: give an absolute path without `.` or `..` (e.g. /srv/jail/vm1)",
                root.display()
            ));
        }
        if root == Path::new("/") {
            return bad("--jail /: the jail root must be a directory of its own, not /".into());
        }
        let (Some(uid), Some(gid)) = (self.uid, self.gid) else {
            return bad(
                "--jail needs --uid N and --gid N: the unprivileged uid and gid the VMM \
                        runs as (use numbers of their own, e.g. --uid 64100 --gid 64100; no \
                        passwd entry is needed)"
                    .into(),
            );
        };
        if uid == 0 || gid == 0 {
            return bad(format!(
                "--uid {uid} --gid {gid}: uid and gid 0 would keep root inside the jail; give an \
                 unprivileged uid and gid"
            ));
        }
        if uid == u32::MAX || gid == u32::MAX {
            return bad("--uid/--gid 4294967295 is not a valid id".into());
        }
        let id = match &self.id {
            Some(id) if !valid_id(id) => {
                return bad(format!(
                    "--jail-id {id:?}: use 1 to 64 of A-Z a-z 0-9 - _ . (it names the cgroup)"
                ))
            }
            Some(id) => id.clone(),
            None => pid.to_string(),
        };
        let netns = match self.netns.as_deref() {
            None if has_net => Netns::Host,
            None | Some("new") => Netns::New,
            Some("host") => Netns::Host,
            Some(p) if Path::new(p).is_absolute() => Netns::Join(PathBuf::from(p)),
            Some(p) => {
                return bad(format!(
                    "--netns {p}: give new, host, or the absolute path of a named network \
                     namespace (e.g. /run/netns/vm1, made by `ip netns add vm1`)"
                ))
            }
        };
        if has_net && netns == Netns::New {
            return bad(
                "--net with --netns new: a new network namespace has no taps; create the \
                        tap in a named namespace and give --netns /run/netns/NAME, or use \
                        --netns host"
                    .into(),
            );
        }
        Ok(Some(JailSpec {
            root: root.clone(),
            uid,
            gid,
            id,
            netns,
        }))
    }
}

/// What a bind mount brings in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BindKind {
    /// A file (or a block device used as a raw disk).
    File,
    /// A directory, with everything under it.
    Dir,
}

/// One host path bind-mounted into the jail at the same absolute path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bind {
    /// The path (the same outside and inside).
    pub path: PathBuf,
    /// File or directory.
    pub kind: BindKind,
    /// Mounted read-only.
    pub readonly: bool,
    /// Which part of the configuration needs it.
    pub why: String,
}

/// A device node created in the jail's `/dev`, owned by the VM's uid:gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// `/dev/kvm` (mode 0600).
    Kvm,
    /// `/dev/userfaultfd` (0600): pmem and memory tiering; a uffd from this node receives
    /// KVM's faults whatever `vm.unprivileged_userfaultfd` says.
    Userfaultfd,
    /// `/dev/net/tun` (0600), with `--net`.
    Tun,
    /// `/dev/null` (0666), for the standard streams of clone processes.
    Null,
}

impl Device {
    /// Its path (in the jail and on the host, where its major:minor are read).
    pub fn path(self) -> &'static str {
        match self {
            Device::Kvm => "/dev/kvm",
            Device::Userfaultfd => "/dev/userfaultfd",
            Device::Tun => "/dev/net/tun",
            Device::Null => "/dev/null",
        }
    }

    /// The node's permission bits.
    pub fn mode(self) -> u32 {
        match self {
            Device::Null => 0o666,
            _ => 0o600,
        }
    }
}

/// Everything the jail holds for one VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The validated flags.
    pub spec: JailSpec,
    /// Bind mounts, parents before children.
    pub binds: Vec<Bind>,
    /// Device nodes.
    pub devices: Vec<Device>,
    /// Taps whose sysfs directory (`/sys/class/net/NAME`, read-only) the tap check reads.
    pub taps: Vec<String>,
}

/// One entry of [`Plan::listing`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Its path in the jail.
    pub path: PathBuf,
    /// `dir` (an empty directory of the jail's own tmpfs), `file`/`tree` (a bind mount of a
    /// host file / directory with its contents), `device`, `proc` (a procfs showing the
    /// jail's own processes only) or `sysfs` (one network interface's sysfs directory).
    pub kind: &'static str,
    /// Read-only.
    pub readonly: bool,
    /// Why it is there.
    pub why: String,
}

/// Collects the paths a VM's configuration references.
#[derive(Debug, Clone)]
pub struct PlanBuilder {
    spec: JailSpec,
    binds: Vec<Bind>,
    taps: Vec<String>,
    uffd: bool,
}

impl PlanBuilder {
    /// An empty plan for `spec`.
    pub fn new(spec: JailSpec) -> Self {
        Self {
            spec,
            binds: Vec::new(),
            taps: Vec::new(),
            uffd: true,
        }
    }

    /// A file the VM opens (read-only if `readonly`).
    pub fn file(mut self, path: impl Into<PathBuf>, readonly: bool, why: &str) -> Self {
        self.binds.push(Bind {
            path: path.into(),
            kind: BindKind::File,
            readonly,
            why: why.into(),
        });
        self
    }

    /// A directory the VM uses (a share, a socket's directory, a snapshot directory).
    pub fn dir(mut self, path: impl Into<PathBuf>, readonly: bool, why: &str) -> Self {
        self.binds.push(Bind {
            path: path.into(),
            kind: BindKind::Dir,
            readonly,
            why: why.into(),
        });
        self
    }

    /// The directory a socket or output file at `path` is created in (read-write).
    pub fn parent_dir(self, path: &Path, why: &str) -> Self {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("/"))
            .to_path_buf();
        self.dir(parent, false, why)
    }

    /// A tap the VM opens.
    pub fn tap(mut self, name: &str) -> Self {
        self.taps.push(name.to_string());
        self
    }

    /// Whether to create `/dev/userfaultfd` (default yes).
    pub fn userfaultfd(mut self, yes: bool) -> Self {
        self.uffd = yes;
        self
    }

    /// Checks every path and orders the binds: parents first, duplicates merged (read-only
    /// only if every use is), binds made redundant by a directory bind with the same access
    /// dropped.
    pub fn build(self) -> Result<Plan> {
        let root = &self.spec.root;
        let mut binds: Vec<Bind> = Vec::new();
        let mut all = self.binds;
        all.sort_by(|a, b| a.path.cmp(&b.path));
        for b in all {
            if !normal_absolute(&b.path) {
                return Err(JailError::Invalid(format!(
                    "{} ({}): a jailed VM needs absolute paths without `.` or `..`",
                    b.path.display(),
                    b.why
                )));
            }
            if b.path == Path::new("/") {
                return Err(JailError::Invalid(format!(
                    "{} needs / itself, which would put the whole host in the jail; use a \
                     directory of its own",
                    b.why
                )));
            }
            if b.path.starts_with(root) {
                return Err(JailError::Invalid(format!(
                    "{} ({}) is inside the jail directory {}, which the jail covers with its \
                     own tmpfs: keep the VM's files outside DIR",
                    b.path.display(),
                    b.why,
                    root.display()
                )));
            }
            if root.starts_with(&b.path) {
                return Err(JailError::Invalid(format!(
                    "{} ({}) contains the jail directory {}: put DIR outside every directory \
                     the VM uses",
                    b.path.display(),
                    b.why,
                    root.display()
                )));
            }
            if let Some(last) = binds.last_mut() {
                if last.path == b.path {
                    if last.kind != b.kind {
                        return Err(JailError::Invalid(format!(
                            "{} is used both as a file and as a directory ({}; {})",
                            b.path.display(),
                            last.why,
                            b.why
                        )));
                    }
                    last.readonly &= b.readonly;
                    last.why = format!("{}; {}", last.why, b.why);
                    continue;
                }
            }
            let covered = binds.iter().rev().find(|d| {
                d.kind == BindKind::Dir && b.path.starts_with(&d.path) && d.path != b.path
            });
            if let Some(d) = covered {
                if d.readonly == b.readonly {
                    continue;
                }
            }
            binds.push(b);
        }
        let mut devices = vec![Device::Kvm, Device::Null];
        if self.uffd {
            devices.push(Device::Userfaultfd);
        }
        if !self.taps.is_empty() {
            devices.push(Device::Tun);
        }
        devices.sort();
        let mut taps = self.taps;
        taps.sort();
        taps.dedup();
        Ok(Plan {
            spec: self.spec,
            binds,
            devices,
            taps,
        })
    }
}

impl Plan {
    /// Every path that exists in the jail, sorted, each once: the directories created on
    /// the tmpfs to hold the mounts, the binds, the devices, `/proc` and the taps' sysfs
    /// directories. A bind of a directory brings its contents too (not listed).
    pub fn listing(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::new();
        let mut add = |e: Entry| {
            if !out.iter().any(|x| x.path == e.path) {
                out.push(e)
            }
        };
        let mut leaves: Vec<Entry> = self
            .binds
            .iter()
            .map(|b| Entry {
                path: b.path.clone(),
                kind: match b.kind {
                    BindKind::File => "file",
                    BindKind::Dir => "tree",
                },
                readonly: b.readonly,
                why: b.why.clone(),
            })
            .collect();
        for d in &self.devices {
            leaves.push(Entry {
                path: d.path().into(),
                kind: "device",
                readonly: false,
                why: format!("{d:?}").to_lowercase(),
            });
        }
        leaves.push(Entry {
            path: "/proc".into(),
            kind: "proc",
            readonly: false,
            why: "the jail's own processes (subset=pid)".into(),
        });
        for t in &self.taps {
            leaves.push(Entry {
                path: Path::new("/sys/class/net").join(t),
                kind: "sysfs",
                readonly: true,
                why: format!("tap {t}"),
            });
        }
        for leaf in leaves {
            // Ancestors not bound themselves are directories of the jail's tmpfs.
            let mut anc: Vec<PathBuf> = leaf
                .path
                .ancestors()
                .skip(1)
                .filter(|a| *a != Path::new("/"))
                .map(Path::to_path_buf)
                .collect();
            anc.reverse();
            for a in anc {
                if self.binds.iter().any(|b| a.starts_with(&b.path)) {
                    continue;
                }
                add(Entry {
                    path: a,
                    kind: "dir",
                    readonly: true,
                    why: "holds a mount".into(),
                });
            }
            add(leaf);
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// The plan as the JSON `--jail-list` prints.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "root": self.spec.root,
            "uid": self.spec.uid,
            "gid": self.spec.gid,
            "id": self.spec.id,
            "netns": self.spec.netns,
            "binds": self.binds,
            "devices": self.devices.iter().map(|d| d.path()).collect::<Vec<_>>(),
            "entries": self.listing(),
        })
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
