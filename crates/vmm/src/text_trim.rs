//! Dropping the VMM's own code and read-only data pages from its page tables once the VM
//! runs.
//!
//! The densevm binary and its shared libraries are mapped from the page cache, and every
//! page a thread touches is mapped in with its neighbours (the kernel's fault-around, 64 KiB
//! at a time). Start-up (argument parsing, relocation, loading the kernel, building devices)
//! thus leaves about 3.5 MiB of code and read-only data mapped that an idle VM never uses
//! again; while one densevm process maps them they count in its USS. `MADV_DONTNEED` on
//! those mappings drops the page-table entries (the pages stay in the page cache, shared);
//! what a running VM still uses comes back as a minor fault.
//!
//! Only mappings that cannot hold a private copy are advised: not writable, and no
//! anonymous (copy-on-write) page in them. RELRO, read-only data the loader relocated, is
//! such a private copy and is left alone, as are the guest's and every other mapping.

use std::io;

/// One mapping of a shared object or of the binary: `[start, end)`.
#[derive(Debug, PartialEq, Eq)]
struct Vma {
    start: usize,
    end: usize,
}

/// The mappings of `smaps` text that are safe to drop: file mappings of `exe` or of a shared
/// object (`*.so` or `*.so.N[.M...]`), without write permission and without anonymous pages.
fn droppable(smaps: &str, exe: &str) -> Vec<Vma> {
    let mut out = Vec::new();
    let mut current: Option<Vma> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some(rest) = first.strip_suffix(':') {
            // A VMA's field: only `Anonymous` decides.
            if rest == "Anonymous" && fields.next().is_some_and(|v| v != "0") {
                current = None;
            }
            continue;
        }
        // A VMA header: range perms offset dev inode path. Flush the previous one.
        out.extend(current.take());
        let Some(perms) = fields.next() else { continue };
        // offset, device, inode, then the path (which may contain spaces).
        let path = fields.skip(3).collect::<Vec<_>>().join(" ");
        let ours = path == exe || is_shared_object(&path);
        if !ours || perms.contains('w') || !perms.ends_with('p') {
            continue;
        }
        let Some((start, end)) = first.split_once('-') else {
            continue;
        };
        if let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) {
            current = Some(Vma { start, end });
        }
    }
    out.extend(current);
    out
}

fn is_shared_object(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    path.starts_with('/')
        && (name.ends_with(".so")
            || name.split_once(".so.").is_some_and(|(_, v)| {
                !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.')
            }))
}

/// Drops the page-table entries of the densevm binary's and its libraries' read-only file
/// mappings; returns the bytes of mapping advised.
pub fn trim_own_text() -> io::Result<u64> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut bytes = 0;
    for vma in droppable(&smaps, &exe.to_string_lossy()) {
        // SAFETY: [start, end) is one of this process's own private file mappings of its
        // binary or a shared library (read from /proc/self/smaps), without write permission
        // and without a single anonymous page: every page in it is the page cache's. So
        // MADV_DONTNEED only drops page-table entries and the next access of any of them
        // faults the same bytes back in from the file. No pointer into it changes.
        if unsafe {
            libc::madvise(
                vma.start as *mut libc::c_void,
                vma.end - vma.start,
                libc::MADV_DONTNEED,
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        bytes += (vma.end - vma.start) as u64;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
1000-2000 r--p 00000000 fe:00 7 /usr/bin/densevm
Rss:                   8 kB
Anonymous:             0 kB
2000-4000 r-xp 00001000 fe:00 7 /usr/bin/densevm
Anonymous:             0 kB
4000-5000 r--p 00003000 fe:00 7 /usr/bin/densevm
Anonymous:             4 kB
5000-6000 rw-p 00004000 fe:00 7 /usr/bin/densevm
Anonymous:             0 kB
7000-8000 rw-s 00000000 00:01 9 /memfd:densevm-ram (deleted)
Anonymous:             0 kB
9000-a000 r--p 00000000 fe:00 8 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
a000-b000 r--p 00000000 fe:00 3 /var/lib/images/vmlinux
Anonymous:             0 kB
b000-c000 r-xp 00000000 fe:00 5 /opt/my lib/libx.so
Anonymous:             0 kB
c000-d000 r--p 00000000 00:00 0
Anonymous:             0 kB
";

    #[test]
    fn only_read_only_file_mappings_of_code_without_private_copies() {
        let got = droppable(SMAPS, "/usr/bin/densevm");
        let want = [
            (0x1000, 0x2000),
            (0x2000, 0x4000),
            (0x9000, 0xa000),
            (0xb000, 0xc000),
        ];
        let want: Vec<Vma> = want
            .iter()
            .map(|&(start, end)| Vma { start, end })
            .collect();
        // Not RELRO (anonymous pages), .data (writable), guest RAM (shared), a kernel image
        // (not code of ours), nor an anonymous mapping.
        assert_eq!(got, want);
    }

    #[test]
    fn shared_object_names() {
        assert!(is_shared_object("/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_shared_object("/usr/lib/libfoo.so"));
        assert!(is_shared_object("/usr/lib/libz.so.1.2.13"));
        assert!(!is_shared_object("/data/disk.so.img"));
        assert!(!is_shared_object("libc.so.6"));
        assert!(!is_shared_object("/images/vmlinux"));
    }

    /// The test binary's code and read-only data are dropped and still work afterwards.
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
        assert!(advised > 0, "no read-only mapping of /proc/self/exe found");
        let after = rss();
        assert!(after < before, "RssFile {before} KiB -> {after} KiB");
        // Code and read-only data run again (faulting back in): format and sum something.
        let s: u64 = (0..1000u64).map(|i| format!("{i}").len() as u64).sum();
        assert_eq!(s, 2890);
    }
}
