//! Crash test: `kill -9` the VMM at random moments while the probe guest writes a `--pmem`
//! image over a base image, many rounds. After every round the image must check clean,
//! every acknowledged write (a run that ended normally flushed its writes) must read back,
//! pages written only by killed runs may hold anything, every other page must still read
//! what it read before (in particular the base's data), and the base file must not change.
//!
//! `PMEM_CRASH_ROUNDS` (default 100) and `PMEM_CRASH_SEED` override the defaults.

mod common;

use common::{densevm, require_kvm, stderr};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const REGION: usize = 2 << 20;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn open(path: &Path) -> pcow::Chain {
    pcow::Chain::open(path, pcow::OpenOptions::default()).unwrap()
}

fn check_clean(path: &Path, round: u32, seed: u64) {
    common::assert_image_clean(path, &format!("round {round} (seed {seed}): "));
}

#[test]
fn kill_9_during_guest_writes_keeps_the_image_consistent() {
    require_kvm();
    let rounds: u32 = std::env::var("PMEM_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("PMEM_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("pmem crash test: {rounds} rounds, seed {seed}");
    let mut rng = Rng(seed);
    // Removed when the test ends, passed or failed (its images take ~1.6 GB over the rounds).
    let scratch = common::TempDir::new("pmem-crash");
    let dir = scratch.0.clone();
    let base = dir.join("base.pcow");
    let top = dir.join("top.pcow");
    let create = |path: &Path, backing: Option<&str>| {
        pcow::create_file(
            path,
            &pcow::CreateOptions {
                virtual_size: 8 << 20,
                cluster_size: 64 << 10,
                backing: backing.map(str::to_string),
            },
        )
        .unwrap();
    };
    create(&base, None);
    // The base holds a distinct byte per page over the first half of the region.
    let mut model: Vec<u8> = vec![0; REGION];
    for (i, page) in model[..REGION / 2].chunks_mut(PAGE).enumerate() {
        page.fill((i % 251) as u8 + 1);
    }
    {
        let mut c = pcow::Chain::open(
            &base,
            pcow::OpenOptions {
                writable: true,
                ..Default::default()
            },
        )
        .unwrap();
        c.write(0, &model[..REGION / 2]).unwrap();
        c.flush().unwrap();
    }
    let base_bytes = std::fs::read(&base).unwrap();
    create(&top, Some("base.pcow"));
    let mut unknown = vec![false; REGION / PAGE];
    let (mut killed, mut completed) = (0, 0);
    let mut typical_ms = 500u64;
    let started = Instant::now();
    for round in 0..rounds {
        let writes: Vec<(usize, usize, u8)> = (0..3)
            .map(|_| {
                let pages = 1 + rng.below(16) as usize;
                let first = rng.below((REGION / PAGE - pages) as u64) as usize;
                (first, pages, 1 + rng.below(255) as u8)
            })
            .collect();
        let mut script: String = writes
            .iter()
            .map(|(p, n, b)| format!("write pmem0 {} {} {b:#04x}; ", p * PAGE, n * PAGE))
            .collect();
        script.push_str("exit 0");
        let mut child = densevm()
            .args(["run", "--timeout", "60", "--pmem"])
            .arg(&top)
            .args(["--probe", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // One run in four completes (its writes are acknowledged); the others are killed at
        // a random moment of a typical run's duration.
        let run_started = Instant::now();
        if rng.below(4) != 0 {
            std::thread::sleep(Duration::from_millis(rng.below(typical_ms)));
            let _ = child.kill(); // SIGKILL
        }
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            typical_ms = (run_started.elapsed().as_millis() as u64).max(20);
        }
        if out.status.success() {
            completed += 1;
            for &(p, n, b) in &writes {
                model[p * PAGE..(p + n) * PAGE].fill(b);
                unknown[p..p + n].fill(false);
            }
        } else {
            assert!(
                out.status.code().is_none(),
                "round {round} (seed {seed}): the VMM failed by itself: {}",
                stderr(&out)
            );
            killed += 1;
            for &(p, n, _) in &writes {
                unknown[p..p + n].fill(true);
            }
        }
        check_clean(&top, round, seed);
        let mut now = vec![0u8; REGION];
        open(&top).read(0, &mut now).unwrap();
        for (i, (got, want)) in now.chunks(PAGE).zip(model.chunks(PAGE)).enumerate() {
            if !unknown[i] {
                assert!(
                    got == want,
                    "round {round} (seed {seed}): page {i} lost data: reads {:#x}.., expected {:#x}",
                    got[0],
                    want[0]
                );
            }
        }
    }
    assert_eq!(
        std::fs::read(&base).unwrap(),
        base_bytes,
        "base file changed"
    );
    check_clean(&base, rounds, seed);
    eprintln!(
        "pmem crash test: {killed} killed, {completed} completed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        killed >= rounds / 4,
        "only {killed} of {rounds} runs were killed: the test did not exercise crashes"
    );
}
