//! Dropping the VMM's own code pages from its page tables once the VM runs.
//!
//! The densevm binary's code is mapped from the page cache, and every page a thread runs
//! is mapped in with its neighbours (the kernel's fault-around, 64 KiB at a time). Start-up
//! (argument parsing, loading the kernel, building devices) thus leaves about 3 MiB of code
//! mapped that an idle VM never runs again; while one densevm process maps them they count
//! in its USS. `MADV_DONTNEED` on the executable mapping drops those mappings (the pages stay
//! in the page cache, shared); the code a running VM uses comes back at its next run as a
//! minor fault. Only the `r-xp` mapping of the binary itself: code is never written, so
//! nothing private is lost (read-only data after relocation, RELRO, is private and is left
//! alone).

use std::io;

/// Drops the page-table entries of the densevm binary's executable mapping; returns the
/// bytes of mapping advised.
pub fn trim_own_text() -> io::Result<u64> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let exe = exe.to_string_lossy();
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut bytes = 0;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        // offset, device, inode, then the path (which may contain spaces).
        let path: Vec<&str> = fields.skip(3).collect();
        if perms != "r-xp" || path.join(" ") != exe {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        // SAFETY: [start, end) is this process's own executable file mapping of its binary
        // (read from /proc/self/maps): code pages are never written, so MADV_DONTNEED only
        // drops their page-table entries and the next run of any of them faults the same
        // bytes back in from the page cache. No pointer into it changes.
        if unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) }
            != 0
        {
            return Err(io::Error::last_os_error());
        }
        bytes += (end - start) as u64;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary's own code is dropped and still runs afterwards.
    #[test]
    fn the_binary_keeps_running_after_its_code_is_dropped() {
        let rss = || {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find(|l| l.starts_with("RssFile:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap()
        };
        let before = rss();
        let advised = trim_own_text().unwrap();
        assert!(advised > 0, "no r-xp mapping of /proc/self/exe found");
        let after = rss();
        assert!(after < before, "RssFile {before} KiB -> {after} KiB");
        // Code runs again (faulting back in): format and sum something.
        let s: u64 = (0..1000u64).map(|i| format!("{i}").len() as u64).sum();
        assert_eq!(s, 2890);
    }
}
