//! What the daemon reads from `/proc`: the host's memory and pressure, and each VMM
//! process's memory and CPU time. Parsers are pure functions over the files' text.

use std::path::{Path, PathBuf};

use crate::policy::HostSample;

/// `MemTotal` and `MemAvailable` from `/proc/meminfo`, in KiB.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    Some((field("MemTotal")?, field("MemAvailable")?))
}

/// `some avg10` and `full avg10` (percent) from `/proc/pressure/memory`.
pub fn parse_psi(text: &str) -> Option<(f64, f64)> {
    let avg10 = |kind: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(kind)?;
            rest.split_whitespace()
                .find_map(|kv| kv.strip_prefix("avg10="))?
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
        })
    };
    Some((avg10("some ")?, avg10("full ").unwrap_or(0.0)))
}

/// `Rss` and `Pss` from `/proc/PID/smaps_rollup`, in KiB.
pub fn parse_smaps_rollup(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    Some((field("Rss")?, field("Pss")?))
}

/// utime + stime (clock ticks) from `/proc/PID/stat`; the command name may hold spaces
/// and parentheses, so fields are counted from the last `)`.
pub fn parse_stat_cpu(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ... utime is field 14, stime 15 (1-based, name is 2).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A VMM process's memory and CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// Proportional set, KiB.
    pub pss_kib: u64,
    /// utime + stime, clock ticks.
    pub cpu_ticks: u64,
}

/// Reads `/proc` (or a fake of it, in tests).
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
    clock_ticks: u64,
}

impl Default for ProcFs {
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl ProcFs {
    /// `/proc` at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        // SAFETY: sysconf takes no pointers.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Self {
            root: root.into(),
            clock_ticks: u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100),
        }
    }

    /// Clock ticks per second (for [`ProcSample::cpu_ticks`]).
    pub fn clock_ticks(&self) -> u64 {
        self.clock_ticks
    }

    fn read(&self, rel: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }

    /// The host's memory and PSI; `None` without a readable `meminfo`. PSI reads as 0 when
    /// the kernel has none (`psi=0`, or no `CONFIG_PSI`).
    pub fn host(&self) -> Option<HostSample> {
        let (total, avail) = parse_meminfo(&self.read("meminfo")?)?;
        let (some, full) = self
            .read("pressure/memory")
            .and_then(|t| parse_psi(&t))
            .unwrap_or((0.0, 0.0));
        Some(HostSample {
            mem_total_mib: total / 1024,
            mem_available_mib: avail / 1024,
            psi_some_avg10: some,
            psi_full_avg10: full,
        })
    }

    /// Whether the kernel reports memory pressure (PSI).
    pub fn has_psi(&self) -> bool {
        self.read("pressure/memory")
            .is_some_and(|t| parse_psi(&t).is_some())
    }

    /// A process's memory and CPU time; `None` once it is gone.
    pub fn process(&self, pid: u32) -> Option<ProcSample> {
        let cpu_ticks = parse_stat_cpu(&self.read(format!("{pid}/stat"))?)?;
        let (rss_kib, pss_kib) = self
            .read(format!("{pid}/smaps_rollup"))
            .and_then(|t| parse_smaps_rollup(&t))
            .unwrap_or((0, 0));
        Some(ProcSample {
            rss_kib,
            pss_kib,
            cpu_ticks,
        })
    }

    /// A process's command line, arguments split.
    pub fn cmdline(&self, pid: u32) -> Option<Vec<String>> {
        let raw = std::fs::read(self.root.join(format!("{pid}/cmdline"))).ok()?;
        Some(
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_psi_smaps_and_stat_parse() {
        let meminfo = "MemTotal:        2014248 kB\nMemFree:          100 kB\n\
                       MemAvailable:    1500000 kB\nBuffers: 1 kB\n";
        assert_eq!(parse_meminfo(meminfo), Some((2014248, 1500000)));
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotalX: 5 kB\nMemAvailable: 1 kB"), None);

        let psi = "some avg10=1.50 avg60=0.20 avg300=0.00 total=12345\n\
                   full avg10=0.25 avg60=0.00 avg300=0.00 total=100\n";
        assert_eq!(parse_psi(psi), Some((1.5, 0.25)));
        assert_eq!(parse_psi("some avg10=nan avg60=0\n"), None);
        assert_eq!(parse_psi(""), None);

        let smaps = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss:  10240 kB\n\
                     Pss:  5120 kB\nPss_Anon: 100 kB\n";
        assert_eq!(parse_smaps_rollup(smaps), Some((10240, 5120)));

        let stat = "4242 (densevm (run) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    17 23 0 0 20 0 5 0 100 1000000 2500 18446744073709551615";
        assert_eq!(parse_stat_cpu(stat), Some(40));
        assert_eq!(parse_stat_cpu("1 (x) S 1"), None);
        assert_eq!(parse_stat_cpu("garbage"), None);
    }

    #[test]
    fn a_fake_proc_reads_like_the_real_one() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("pressure")).unwrap();
        std::fs::create_dir_all(root.join("77")).unwrap();
        std::fs::write(
            root.join("meminfo"),
            "MemTotal: 4194304 kB\nMemAvailable: 1048576 kB\n",
        )
        .unwrap();
        let fs = ProcFs::new(root);
        let h = fs.host().unwrap();
        assert_eq!((h.mem_total_mib, h.mem_available_mib), (4096, 1024));
        assert_eq!(h.psi_some_avg10, 0.0, "no PSI reads as none");
        assert!(!fs.has_psi());
        std::fs::write(
            root.join("pressure/memory"),
            "some avg10=12.00 avg60=1 avg300=0 total=1\nfull avg10=3.00 avg60=0 avg300=0 total=1\n",
        )
        .unwrap();
        assert_eq!(fs.host().unwrap().psi_some_avg10, 12.0);
        assert!(fs.has_psi());
        assert_eq!(fs.process(77), None);
        std::fs::write(
            root.join("77/stat"),
            "77 (d) S 1 1 1 0 -1 0 0 0 0 0 5 6 0 0",
        )
        .unwrap();
        std::fs::write(root.join("77/smaps_rollup"), "Rss: 8 kB\nPss: 4 kB\n").unwrap();
        std::fs::write(root.join("77/cmdline"), b"densevm\0run\0--api-sock\0/s\0").unwrap();
        assert_eq!(
            fs.process(77),
            Some(ProcSample {
                rss_kib: 8,
                pss_kib: 4,
                cpu_ticks: 11
            })
        );
        assert_eq!(fs.cmdline(77).unwrap()[3], "/s");
    }

    #[test]
    fn this_process_reads_from_the_real_proc() {
        let fs = ProcFs::default();
        let me = fs.process(std::process::id()).unwrap();
        assert!(me.rss_kib > 0 && me.pss_kib > 0);
        let host = fs.host().unwrap();
        assert!(host.mem_total_mib > 0 && host.mem_available_mib <= host.mem_total_mib);
    }
}
