//! cgroup v2 memory limits: each VM in its own child cgroup with `memory.max` = its max
//! memory + the VMM's overhead, the hard stop behind the balloon policy. Optional: without
//! a usable cgroup v2 memory controller the fleet runs without it and says so.
//!
//! Layout: `BASE/densevm-fleet/vm-ID`, where BASE is the daemon's own cgroup (from
//! `/proc/self/cgroup`) in the v2 hierarchy (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
//! on hybrid hosts), or a directory given with `--cgroup DIR` (one delegated to the
//! daemon). A v2 cgroup other than the root may not hold processes and enable controllers
//! for its children at once, so when BASE holds the daemon and refuses `+memory`, the
//! daemon first moves itself into `BASE/fleetd`. Every path is a parameter, so tests run
//! on a fake cgroupfs (plain files).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Where the v2 hierarchy is and the daemon's place in it: the directory under which the
/// fleet's cgroup goes.
pub fn detect(sys_fs_cgroup: &Path, proc_self_cgroup: &str) -> Result<PathBuf, String> {
    let unified = sys_fs_cgroup.join("unified");
    let root = if sys_fs_cgroup.join("cgroup.controllers").exists() {
        sys_fs_cgroup.to_path_buf()
    } else if unified.join("cgroup.controllers").exists() {
        unified
    } else {
        return Err(format!(
            "no cgroup v2 hierarchy at {} or {} (mount one: mount -t cgroup2 none {})",
            sys_fs_cgroup.display(),
            unified.display(),
            sys_fs_cgroup.display()
        ));
    };
    let controllers = fs::read_to_string(root.join("cgroup.controllers"))
        .map_err(|e| format!("{}: {e}", root.join("cgroup.controllers").display()))?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err(format!(
            "the cgroup v2 hierarchy at {} has no memory controller (controllers: {:?}); on a \
             hybrid host the memory controller is bound to cgroup v1: boot with \
             systemd.unified_cgroup_hierarchy=1 or cgroup_no_v1=memory",
            root.display(),
            controllers.trim()
        ));
    }
    let own = proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("no cgroup v2 entry (0::PATH) in /proc/self/cgroup")?;
    Ok(root.join(own.trim().trim_start_matches('/')))
}

/// The fleet's parent cgroup, with the memory controller enabled for its children.
#[derive(Debug, Clone)]
pub struct Cgroups {
    parent: PathBuf,
}

fn write(path: &Path, text: &str) -> io::Result<()> {
    // cgroupfs files exist already; a fake cgroupfs gets them created.
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?
        .write_all(text.as_bytes())
}

fn has_memory(subtree_control: &Path) -> bool {
    fs::read_to_string(subtree_control).is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"))
}

/// Turns on the memory controller for `dir`'s children.
fn enable_memory(dir: &Path) -> io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    if has_memory(&control) {
        return Ok(());
    }
    write(&control, "+memory")
}

impl Cgroups {
    /// Makes `BASE/densevm-fleet` with the memory controller for its children. `pid` is the
    /// daemon's, moved into `BASE/fleetd` if BASE holds it and refuses `+memory`.
    pub fn set_up(base: &Path, pid: u32) -> Result<Self, String> {
        let fail = |what: &str, p: &Path, e: io::Error| format!("{what} {}: {e}", p.display());
        if let Err(e) = enable_memory(base) {
            // EBUSY: BASE holds processes (ours) and is not the root.
            let leaf = base.join("fleetd");
            fs::create_dir_all(&leaf).map_err(|e| fail("cannot create", &leaf, e))?;
            write(&leaf.join("cgroup.procs"), &pid.to_string()).map_err(|e2| {
                format!(
                    "cannot enable the memory controller in {} ({e}) nor move the daemon to \
                     {} ({e2}); give the daemon a delegated cgroup (--cgroup DIR)",
                    base.display(),
                    leaf.display()
                )
            })?;
            enable_memory(base).map_err(|e| fail("cannot enable memory in", base, e))?;
        }
        let parent = base.join("densevm-fleet");
        fs::create_dir_all(&parent).map_err(|e| fail("cannot create", &parent, e))?;
        enable_memory(&parent).map_err(|e| fail("cannot enable memory in", &parent, e))?;
        Ok(Self { parent })
    }

    /// Uses `parent` as it is (tests, or a parent already set up).
    pub fn at(parent: impl Into<PathBuf>) -> Self {
        Self {
            parent: parent.into(),
        }
    }

    /// The fleet's cgroup.
    pub fn parent(&self) -> &Path {
        &self.parent
    }

    /// Creates (or reuses) `vm-ID` with `memory.max` = `max_bytes` and no swap.
    pub fn create_vm(&self, id: &str, max_bytes: u64) -> Result<VmCgroup, String> {
        let dir = self.parent.join(format!("vm-{id}"));
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = VmCgroup { dir };
        cg.set_max(max_bytes)?;
        // Guest memory swapped by the host is what the policy is there to prevent; a
        // kernel without swap accounting has no such file, which is fine.
        let swap = cg.dir.join("memory.swap.max");
        if swap.exists() {
            if let Err(e) = write(&swap, "0") {
                tracing::warn!("cannot set {}: {e}", swap.display());
            }
        }
        Ok(cg)
    }
}

/// One VM's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmCgroup {
    dir: PathBuf,
}

impl VmCgroup {
    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets `memory.max`.
    pub fn set_max(&self, bytes: u64) -> Result<(), String> {
        let path = self.dir.join("memory.max");
        write(&path, &bytes.to_string()).map_err(|e| format!("cannot set {}: {e}", path.display()))
    }

    /// `memory.max` as set.
    pub fn max(&self) -> Option<u64> {
        fs::read_to_string(self.dir.join("memory.max"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// `cgroup.procs` opened for writing: a child writes "0" to it before exec to join.
    pub fn procs_for_join(&self) -> Result<File, String> {
        let path = self.dir.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .create(!path.exists())
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))
    }

    /// `memory.events`' `oom_kill` count.
    pub fn oom_kills(&self) -> Option<u64> {
        let text = fs::read_to_string(self.dir.join("memory.events")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
    }

    /// Removes the cgroup (its processes gone). A fake cgroupfs directory holds files,
    /// which are removed first; a real cgroup's files cannot be and need not be.
    pub fn remove(&self) {
        if fs::remove_dir(&self.dir).is_ok() {
            return;
        }
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let _ = fs::remove_file(e.path());
            }
        }
        if let Err(e) = fs::remove_dir(&self.dir) {
            tracing::warn!("cannot remove the cgroup {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root(controllers: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.controllers"), controllers).unwrap();
        fs::write(dir.path().join("cgroup.subtree_control"), "").unwrap();
        dir
    }

    #[test]
    fn detection_finds_unified_hybrid_or_says_what_is_missing() {
        let v2 = fake_root("cpuset cpu io memory pids\n");
        assert_eq!(
            detect(v2.path(), "0::/system.slice/x.service\n").unwrap(),
            v2.path().join("system.slice/x.service")
        );
        assert_eq!(detect(v2.path(), "0::/\n").unwrap(), v2.path());
        assert!(detect(v2.path(), "4:memory:/x\n")
            .unwrap_err()
            .contains("0::"));

        // Hybrid: v1 controllers, v2 at unified/ without memory (this project's host).
        let hybrid = tempfile::tempdir().unwrap();
        fs::create_dir(hybrid.path().join("unified")).unwrap();
        fs::write(hybrid.path().join("unified/cgroup.controllers"), "").unwrap();
        let err = detect(hybrid.path(), "0::/\n").unwrap_err();
        assert!(
            err.contains("no memory controller") && err.contains("hybrid"),
            "{err}"
        );
        fs::write(hybrid.path().join("unified/cgroup.controllers"), "memory\n").unwrap();
        assert_eq!(
            detect(hybrid.path(), "0::/a\n").unwrap(),
            hybrid.path().join("unified/a")
        );

        let none = tempfile::tempdir().unwrap();
        assert!(detect(none.path(), "0::/\n")
            .unwrap_err()
            .contains("no cgroup v2"));
    }

    #[test]
    fn set_up_enables_memory_and_vm_cgroups_get_their_limit() {
        let root = fake_root("memory pids\n");
        let cg = Cgroups::set_up(root.path(), 1234).unwrap();
        assert_eq!(cg.parent(), root.path().join("densevm-fleet"));
        let control = |p: &Path| fs::read_to_string(p.join("cgroup.subtree_control")).unwrap();
        assert_eq!(control(root.path()), "+memory");
        assert_eq!(control(cg.parent()), "+memory");

        let vm = cg.create_vm("a", 300 << 20).unwrap();
        assert_eq!(vm.dir(), cg.parent().join("vm-a"));
        assert_eq!(vm.max(), Some(300 << 20));
        assert!(
            !vm.dir().join("memory.swap.max").exists(),
            "only set where it exists"
        );
        fs::write(vm.dir().join("memory.swap.max"), "max").unwrap();
        let vm = cg.create_vm("a", 400 << 20).unwrap();
        assert_eq!(vm.max(), Some(400 << 20));
        assert_eq!(
            fs::read_to_string(vm.dir().join("memory.swap.max")).unwrap(),
            "0"
        );
        fs::write(
            vm.dir().join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(vm.oom_kills(), Some(1));
        vm.procs_for_join().unwrap();
        vm.remove();
        assert!(!vm.dir().exists());
    }

    #[test]
    fn set_up_moves_the_daemon_to_a_leaf_when_its_cgroup_refuses() {
        let root = fake_root("memory\n");
        // A subtree_control that cannot be written stands for EBUSY.
        let control = root.path().join("cgroup.subtree_control");
        fs::remove_file(&control).unwrap();
        fs::create_dir(&control).unwrap();
        let err = Cgroups::set_up(root.path(), 99).unwrap_err();
        // It moved itself, then still could not: the message says what to do.
        assert_eq!(
            fs::read_to_string(root.path().join("fleetd/cgroup.procs")).unwrap(),
            "99"
        );
        assert!(err.contains("cannot enable memory"), "{err}");
    }
}
