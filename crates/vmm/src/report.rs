//! Memory accounting of the VMM process from /proc: RSS, USS and PSS for the whole
//! process and for the guest's own mappings, so the VMM's overhead can be told apart.

use crate::memory::RegionInfo;
use serde::Serialize;
use std::io;

/// Resident memory figures in KiB.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct MemFigures {
    /// Resident set size.
    pub rss_kib: u64,
    /// Unique set size: pages mapped by this process only (Private_Clean + Private_Dirty).
    pub uss_kib: u64,
    /// Proportional set size.
    pub pss_kib: u64,
    /// Resident anonymous memory (heap, stacks, thread arenas, anonymous guest RAM): never
    /// shared with another VM, unlike the pages of the densevm binary and its libraries,
    /// which USS also counts while a single densevm process maps them.
    pub anon_kib: u64,
}

/// Memory report of a running VM.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MemoryReport {
    /// The whole VMM process.
    pub process: MemFigures,
    /// The guest memory mappings only.
    pub guest: MemFigures,
    /// Per guest region (name, figures).
    pub regions: Vec<(String, MemFigures)>,
    /// The process minus its guest memory: what the VMM itself costs.
    pub vmm_overhead: MemFigures,
}

fn field(line: &str, name: &str) -> Option<u64> {
    let rest = line.strip_prefix(name)?.strip_prefix(':')?;
    rest.trim().trim_end_matches("kB").trim().parse().ok()
}

fn add_line(fig: &mut MemFigures, line: &str) {
    if let Some(v) = field(line, "Rss") {
        fig.rss_kib += v;
    } else if let Some(v) = field(line, "Pss") {
        fig.pss_kib += v;
    } else if let Some(v) = field(line, "Private_Clean").or_else(|| field(line, "Private_Dirty")) {
        fig.uss_kib += v;
    } else if let Some(v) = field(line, "Anonymous") {
        fig.anon_kib += v;
    }
}

/// Parses an smaps_rollup text.
pub fn parse_rollup(text: &str) -> MemFigures {
    let mut fig = MemFigures::default();
    text.lines().for_each(|l| add_line(&mut fig, l));
    fig
}

/// The VMAs of an smaps text: `(start, end, figures)`.
fn parse_vmas(text: &str) -> Vec<(u64, u64, MemFigures)> {
    let mut vmas: Vec<(u64, u64, MemFigures)> = Vec::new();
    for line in text.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                vmas.push((a, b, MemFigures::default()));
                continue;
            }
        }
        if let Some((_, _, fig)) = vmas.last_mut() {
            add_line(fig, line);
        }
    }
    vmas
}

fn sum_overlapping(vmas: &[(u64, u64, MemFigures)], ranges: &[(u64, u64)]) -> MemFigures {
    let mut total = MemFigures::default();
    for (a, b, fig) in vmas {
        // Each VMA once, however many ranges it overlaps (adjacent guest mappings merge).
        if ranges.iter().any(|&(start, end)| *a < end && *b > start) {
            total.rss_kib += fig.rss_kib;
            total.uss_kib += fig.uss_kib;
            total.pss_kib += fig.pss_kib;
            total.anon_kib += fig.anon_kib;
        }
    }
    total
}

/// Parses an smaps text, summing the figures of VMAs that overlap `[start, end)`.
pub fn parse_smaps_range(text: &str, start: u64, end: u64) -> MemFigures {
    sum_overlapping(&parse_vmas(text), &[(start, end)])
}

/// Reads the report for this process, given the guest regions it maps.
pub fn memory_report(regions: &[RegionInfo]) -> io::Result<MemoryReport> {
    memory_report_of("self", regions)
}

/// Reads the report for process `pid` (`self` for this one).
pub fn memory_report_of(pid: &str, regions: &[RegionInfo]) -> io::Result<MemoryReport> {
    let process = parse_rollup(&std::fs::read_to_string(format!(
        "/proc/{pid}/smaps_rollup"
    ))?);
    let vmas = parse_vmas(&std::fs::read_to_string(format!("/proc/{pid}/smaps"))?);
    let ranges: Vec<(u64, u64)> = regions
        .iter()
        .map(|r| (r.host_addr, r.host_addr + r.size))
        .collect();
    let guest = sum_overlapping(&vmas, &ranges);
    let per_region = regions
        .iter()
        .zip(&ranges)
        .map(|(r, &range)| (r.name.clone(), sum_overlapping(&vmas, &[range])))
        .collect();
    let vmm_overhead = MemFigures {
        rss_kib: process.rss_kib.saturating_sub(guest.rss_kib),
        uss_kib: process.uss_kib.saturating_sub(guest.uss_kib),
        pss_kib: process.pss_kib.saturating_sub(guest.pss_kib),
        anon_kib: process.anon_kib.saturating_sub(guest.anon_kib),
    };
    Ok(MemoryReport {
        process,
        guest,
        regions: per_region,
        vmm_overhead,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
1000-3000 rw-p 00000000 00:00 0
Rss:                   8 kB
Pss:                   8 kB
Private_Clean:         0 kB
Private_Dirty:         8 kB
Anonymous:             8 kB
7000-9000 r--p 00000000 08:01 12 /bin/x
Rss:                   8 kB
Pss:                   4 kB
Shared_Clean:          8 kB
Private_Clean:         0 kB
Private_Dirty:         0 kB
";

    #[test]
    fn sums_only_overlapping_vmas() {
        let fig = parse_smaps_range(SMAPS, 0x2000, 0x2800);
        assert_eq!(
            fig,
            MemFigures {
                rss_kib: 8,
                uss_kib: 8,
                pss_kib: 8,
                anon_kib: 8,
            }
        );
        let fig = parse_smaps_range(SMAPS, 0, 0x10000);
        assert_eq!(
            fig,
            MemFigures {
                rss_kib: 16,
                uss_kib: 8,
                pss_kib: 12,
                anon_kib: 8,
            }
        );
        assert_eq!(parse_rollup(SMAPS).pss_kib, 12);
        // Two regions inside one VMA count it once.
        let vmas = parse_vmas(SMAPS);
        let both = sum_overlapping(&vmas, &[(0x1000, 0x2000), (0x2000, 0x3000)]);
        assert_eq!(both.rss_kib, 8);
    }

    #[test]
    fn live_report_counts_touched_guest_memory() {
        let size = 4 << 20;
        // SAFETY: a fresh private anonymous mapping, unmapped at the end of the test.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: the mapping is `size` bytes long and writable.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 1, size / 2) };
        let region = RegionInfo {
            name: "t".into(),
            gpa: 0,
            size: size as u64,
            host_addr: ptr as u64,
            kind: crate::memory::RegionKind::Anonymous,
            kvm_readonly: Vec::new(),
        };
        let report = memory_report(&[region]).unwrap();
        assert_eq!(report.guest.rss_kib, 2048);
        assert_eq!(report.guest.anon_kib, 2048);
        assert!(report.process.rss_kib >= report.guest.rss_kib);
        // SAFETY: unmapping the mapping created above.
        unsafe { libc::munmap(ptr, size) };
    }
}
