//! The jailed VM's cgroup: `densevm/ID` under the cgroup densevm was started in, in each
//! cgroup v1 hierarchy of the `memory`, `cpu` and `pids` controllers, or in the v2
//! hierarchy when `/sys/fs/cgroup` is one (a VM started by the fleet inside its `vm-ID`
//! cgroup stays below that cgroup's `memory.max`). The outer process creates it, moves the
//! VM process in and removes it when the VM has ended. Every path is a parameter, so the
//! choice is tested on plain files.

use crate::{JailError, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The v1 controllers the VM gets a cgroup in.
pub const V1_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// One VM's cgroup directories (one per hierarchy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailCgroup {
    dirs: Vec<PathBuf>,
}

/// The own path of the controller `ctrl` (`""` for the v2 line) in `/proc/self/cgroup` text.
fn own_path<'a>(proc_self_cgroup: &'a str, ctrl: &str) -> Option<&'a str> {
    proc_self_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let hit = if ctrl.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == ctrl)
        };
        hit.then_some(path)
    })
}

fn under(base: &Path, own: &str, id: &str) -> PathBuf {
    base.join(own.trim().trim_start_matches('/'))
        .join("densevm")
        .join(id)
}

impl JailCgroup {
    /// Where the cgroup of jail `id` goes, given the cgroup mount point (`/sys/fs/cgroup`)
    /// and the text of `/proc/self/cgroup`.
    pub fn locate(sys_fs_cgroup: &Path, proc_self_cgroup: &str, id: &str) -> Result<Self> {
        if sys_fs_cgroup.join("cgroup.controllers").exists() {
            let own = own_path(proc_self_cgroup, "").ok_or_else(|| {
                JailError::Invalid("no cgroup v2 entry (0::PATH) in /proc/self/cgroup".into())
            })?;
            return Ok(Self {
                dirs: vec![under(sys_fs_cgroup, own, id)],
            });
        }
        let mut dirs = Vec::new();
        for c in V1_CONTROLLERS {
            let mount = sys_fs_cgroup.join(c);
            let Some(own) = own_path(proc_self_cgroup, c) else {
                continue;
            };
            if !mount.join("cgroup.procs").exists() {
                continue;
            }
            // Controllers mounted together (cpu,cpuacct) share a directory.
            let mount = fs::canonicalize(&mount).unwrap_or(mount);
            let dir = under(&mount, own, id);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        if dirs.is_empty() {
            return Err(JailError::Invalid(format!(
                "no cgroup hierarchy found under {} (neither cgroup v2 nor a v1 memory, cpu or \
                 pids controller): mount one, e.g. mount -t cgroup2 none {}",
                sys_fs_cgroup.display(),
                sys_fs_cgroup.display()
            )));
        }
        Ok(Self { dirs })
    }

    /// The cgroup directories.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Creates the directories (an existing one is an error: another VM with this id).
    pub fn create(&self) -> Result<()> {
        for d in &self.dirs {
            if let Some(p) = d.parent() {
                fs::create_dir_all(p)
                    .map_err(|e| JailError::io(format!("cannot create {}", p.display()), e))?;
            }
            fs::create_dir(d).map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::AlreadyExists {
                    " (a VM with this --jail-id runs, or an earlier one was killed: remove the \
                     directory or choose another id)"
                } else {
                    " (creating cgroups needs root)"
                };
                JailError::io(format!("cannot create the cgroup {}{hint}", d.display()), e)
            })?;
        }
        Ok(())
    }

    /// Moves process `pid` (and its future children) into every directory.
    pub fn join(&self, pid: u32) -> Result<()> {
        for d in &self.dirs {
            let procs = d.join("cgroup.procs");
            fs::write(&procs, pid.to_string()).map_err(|e| {
                JailError::io(format!("cannot move pid {pid} into {}", procs.display()), e)
            })?;
        }
        Ok(())
    }

    /// Removes the directories once no process is left in them (retrying for up to a
    /// second while the kernel finishes the exit), then the `densevm` parents if empty.
    /// Returns the directories that could not be removed.
    pub fn remove(&self) -> Vec<(PathBuf, std::io::Error)> {
        let mut failed = Vec::new();
        for d in &self.dirs {
            let mut tries = 0;
            loop {
                match fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if tries < 100 && e.raw_os_error() == Some(libc::EBUSY) => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => {
                        failed.push((d.clone(), e));
                        break;
                    }
                }
            }
            if let Some(p) = d.parent() {
                let _ = fs::remove_dir(p);
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("jail-cg-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    const V1: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/a/b\n2:cpu,cpuacct:/\n0::/\n";

    #[test]
    fn v1_uses_each_mounted_controller_under_the_own_path() {
        let root = tmp("v1");
        for c in ["memory", "pids", "cpu"] {
            fs::create_dir_all(root.join(c)).unwrap();
            fs::write(root.join(c).join("cgroup.procs"), "").unwrap();
        }
        let cg = JailCgroup::locate(&root, V1, "vm1").unwrap();
        assert_eq!(
            cg.dirs(),
            [
                root.join("memory/a/b/densevm/vm1"),
                root.join("cpu/densevm/vm1"),
                root.join("pids/densevm/vm1")
            ]
        );
        cg.create().unwrap();
        assert!(cg.create().unwrap_err().to_string().contains("--jail-id"));
        cg.join(7).unwrap();
        assert_eq!(
            fs::read_to_string(root.join("pids/densevm/vm1/cgroup.procs")).unwrap(),
            "7"
        );
        fs::remove_file(root.join("pids/densevm/vm1/cgroup.procs")).unwrap();
        let failed = cg.remove();
        // Plain directories with files left in them (a fake cgroupfs) stay.
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(!root.join("pids/densevm").exists());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn v2_uses_the_unified_line() {
        let root = tmp("v2");
        fs::write(root.join("cgroup.controllers"), "memory pids").unwrap();
        let cg = JailCgroup::locate(&root, "0::/densevm-fleet/vm-a\n", "a").unwrap();
        assert_eq!(cg.dirs(), [root.join("densevm-fleet/vm-a/densevm/a")]);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn no_hierarchy_says_what_to_do() {
        let root = tmp("none");
        let e = JailCgroup::locate(&root, V1, "a").unwrap_err().to_string();
        assert!(e.contains("mount -t cgroup2"), "{e}");
        let _ = fs::remove_dir_all(&root);
    }
}
