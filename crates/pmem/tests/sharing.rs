//! Two processes mapping top images over one base share the base's page-cache pages:
//! while both run, the PSS of each one's base mapping is about half its RSS.
//!
//! The test re-executes its own binary twice (test `child_maps_and_waits` with
//! `PMEM_SHARE_CHILD` set), as two VMs would be two VMM processes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{create, fill, map, slice, tmpdir, MIB};

const BASE_DATA: u64 = 8 * MIB;
/// Virtual size of the base and of each top image.
const IMAGE_SIZE: u64 = 32 * MIB;

/// Child role: map the image named by PMEM_SHARE_CHILD, read the base data, write one
/// page (copy-on-write), report READY and wait for stdin to close.
#[test]
fn child_maps_and_waits() {
    let Ok(path) = std::env::var("PMEM_SHARE_CHILD") else {
        return; // only meaningful as the child of `base_pages_are_shared_between_two_mappings`
    };
    let r = map(Path::new(&path));
    let m = slice(&r);
    let sum: u64 = m[..BASE_DATA as usize].iter().map(|&b| b as u64).sum();
    assert_eq!(sum, 0x5a * BASE_DATA, "base data visible");
    m[0] = 1; // one 4 KiB copy-up: private to this image
    println!("READY {}", r.vma_count().unwrap());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// (RSS, PSS) in KiB of `pid`'s mappings of `file`.
fn rss_pss(pid: u32, file: &Path) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let name = file.to_str().unwrap();
    let (mut inside, mut rss, mut pss) = (false, 0, 0);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = line.ends_with(name);
            continue;
        }
        if !inside {
            continue;
        }
        let kib = || {
            words
                .clone()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match first {
            "Rss:" => rss += kib(),
            "Pss:" => pss += kib(),
            _ => {}
        }
    }
    (rss, pss)
}

#[test]
fn base_pages_are_shared_between_two_mappings() {
    let dir = tmpdir("share");
    let base = dir.join("base.pcow");
    create(&base, IMAGE_SIZE, None);
    fill(&base, BASE_DATA, 0x5a);
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for i in 0..2 {
        let top = dir.join(format!("top{i}.pcow"));
        create(&top, IMAGE_SIZE, Some("base.pcow"));
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "child_maps_and_waits",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PMEM_SHARE_CHILD", &top)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("READY") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "child {i} exited early"
            );
        }
        children.push((child, out));
    }
    let figures: Vec<(u64, u64)> = children
        .iter()
        .map(|(c, _)| rss_pss(c.id(), &base))
        .collect();
    for (mut c, mut out) in children {
        drop(c.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        assert!(c.wait().unwrap().success(), "child failed: {rest}");
    }
    eprintln!("base mapping (RSS KiB, PSS KiB) per process: {figures:?}");
    let base_kib = BASE_DATA / 1024;
    for (i, &(rss, pss)) in figures.iter().enumerate() {
        assert!(
            rss >= base_kib * 9 / 10,
            "child {i}: base RSS {rss} KiB of {base_kib}"
        );
        let ratio = pss as f64 / rss as f64;
        assert!(
            (0.45..=0.55).contains(&ratio),
            "child {i}: PSS {pss} KiB / RSS {rss} KiB = {ratio:.2}, expected about 1/2"
        );
    }
}
