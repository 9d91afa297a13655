//! `densevm run --kernel` input errors: each is reported clearly before any guest runs.
//! (Booting real Linux is tested in the nested lab: lab/tests/densevm-l2-boot.sh.)

mod common;

use common::{densevm, require_kvm, stderr};
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("densevm-linux-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> (Option<i32>, String) {
    require_kvm();
    let out = densevm().arg("run").args(args).output().unwrap();
    (out.status.code(), stderr(&out))
}

#[test]
fn missing_kernel() {
    let (code, err) = run(&["--kernel", "/nonexistent/vmlinux"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("cannot read kernel /nonexistent/vmlinux"),
        "{err}"
    );
}

#[test]
fn corrupt_kernels() {
    let dir = scratch("corrupt");
    let junk = dir.join("junk");
    std::fs::write(&junk, vec![0x42u8; 64 * 1024]).unwrap();
    let (code, err) = run(&["--kernel", junk.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not a bootable kernel"), "{err}");
    // An ELF header cut short.
    let elf = dir.join("short.elf");
    std::fs::write(&elf, b"\x7fELF\x02\x01\x01\x00").unwrap();
    let (code, err) = run(&["--kernel", elf.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not a bootable kernel"), "{err}");
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let (code, err) = run(&["--kernel", empty.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("empty"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A minimal ELF64 with one PT_LOAD segment at 16 MiB and a PVH entry note.
fn tiny_pvh_elf() -> Vec<u8> {
    let mut f = vec![0u8; 0x2000];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little endian
    f[6] = 1;
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // entry
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    f[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    f[56..58].copy_from_slice(&2u16.to_le_bytes()); // phnum
    let ph = |f: &mut Vec<u8>, at: usize, kind: u32, off: u64, addr: u64, size: u64| {
        f[at..at + 4].copy_from_slice(&kind.to_le_bytes());
        f[at + 4..at + 8].copy_from_slice(&5u32.to_le_bytes());
        f[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
        f[at + 16..at + 24].copy_from_slice(&addr.to_le_bytes());
        f[at + 24..at + 32].copy_from_slice(&addr.to_le_bytes());
        f[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
        f[at + 40..at + 48].copy_from_slice(&size.to_le_bytes());
        f[at + 48..at + 56].copy_from_slice(&4096u64.to_le_bytes());
    };
    ph(&mut f, 64, 1, 0x1000, 0x100_0000, 0x1000); // PT_LOAD
                                                   // PT_NOTE with one note: namesz 4 ("Xen\0"), descsz 4, type 18 (XEN_ELFNOTE_PHYS32_ENTRY).
    ph(&mut f, 120, 4, 0x200, 0, 24);
    let note = [4u32.to_le_bytes(), 4u32.to_le_bytes(), 18u32.to_le_bytes()].concat();
    f[0x200..0x20c].copy_from_slice(&note);
    f[0x20c..0x210].copy_from_slice(b"Xen\0");
    f[0x210..0x214].copy_from_slice(&0x100_0000u32.to_le_bytes());
    f
}

#[test]
fn initrd_too_large_and_bad_cmdline() {
    let dir = scratch("initrd");
    let kernel = dir.join("vmlinux");
    std::fs::write(&kernel, tiny_pvh_elf()).unwrap();
    let initrd = dir.join("initrd");
    let f = std::fs::File::create(&initrd).unwrap();
    f.set_len(200 << 20).unwrap(); // sparse, 200 MiB
    let k = kernel.to_str().unwrap();
    let (code, err) = run(&[
        "--kernel",
        k,
        "--initrd",
        initrd.to_str().unwrap(),
        "--memory",
        "128M",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("the initrd does not fit in guest memory") && err.contains("--memory"),
        "{err}"
    );
    let long = "x".repeat(70_000);
    let (code, err) = run(&["--kernel", k, "--cmdline", &long, "--timeout", "10"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid kernel command line"), "{err}");
    let (code, err) = run(&[
        "--kernel",
        k,
        "--cmdline",
        "console=ttyS0\u{e9}",
        "--timeout",
        "10",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("printable ASCII"), "{err}");
    let (code, err) = run(&["--kernel", k, "--memory", "8M", "--timeout", "10"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("the kernel does not fit"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn flags_that_need_a_kernel() {
    let out = densevm()
        .args(["run", "--initrd", "/tmp/x", "--probe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--kernel"), "{}", stderr(&out));
    let out = densevm().args(["run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("nothing to run"), "{}", stderr(&out));
}

/// Bad device options stop densevm before the VM exists, each with a message that says
/// what to do.
#[test]
fn bad_device_options_are_refused_before_the_vm_starts() {
    let dir = scratch("devices");
    let kernel = dir.join("vmlinux");
    std::fs::write(&kernel, tiny_pvh_elf()).unwrap();
    let k = kernel.to_str().unwrap();
    let d = dir.to_str().unwrap();
    let disk = dir.join("disk.raw");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let disk = disk.to_str().unwrap();
    let missing = format!("{d}/missing.raw");
    let twice_tag = [format!("{d},tag=t"), format!("{d},tag=t")];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--kernel", k, "--disk", &missing],
            "densevm image create",
        ),
        (vec!["--kernel", k, "--disk", d], "is a directory"),
        (
            vec!["--kernel", k, "--disk", disk, "--disk", disk],
            "given twice",
        ),
        (
            vec!["--kernel", k, "--disk", "x,format=qcow2"],
            "format=raw|pcow",
        ),
        (vec!["--kernel", k, "--share", d], "tag=host0"),
        (
            vec![
                "--kernel",
                k,
                "--share",
                &twice_tag[0],
                "--share",
                &twice_tag[1],
            ],
            "its own tag",
        ),
        (vec!["--kernel", k, "--share", &missing], "tag="),
        (vec!["--probe", "--rng"], "add --kernel FILE"),
        (
            vec!["--probe", "--balloon", "amount_mib=0"],
            "the probe guest has no PCI",
        ),
        (
            vec![
                "--kernel",
                k,
                "--balloon",
                "amount_mib=200",
                "--memory",
                "128M",
            ],
            "give 0 to 128",
        ),
        (
            vec!["--kernel", k, "--balloon", "amount=1"],
            "unknown option 'amount=1'",
        ),
        (
            vec!["--kernel", k, "--balloon", "free_page_reporting=maybe"],
            "give on or off",
        ),
        (
            vec![
                "--kernel",
                k,
                "--boot-images",
                "map",
                "--memory-budget",
                "64M",
            ],
            "drop --boot-images map",
        ),
        (vec!["--kernel", k, "--boot-images", "mmap"], "map, copy"),
        (
            vec!["--probe", "--boot-images", "copy"],
            "add --kernel FILE",
        ),
    ];
    for (args, needle) in cases {
        let (code, err) = run(&args);
        assert_ne!(code, Some(0), "{args:?} was accepted");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (code, err) = run(&["--kernel", k, "--share", &format!("{missing},tag=m")]);
    assert_eq!(code, Some(1));
    assert!(err.contains("missing.raw"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
