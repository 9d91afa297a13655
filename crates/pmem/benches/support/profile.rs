//! `pmem_bench -- profile` (built with `--features fault-trace`): where the time of one
//! host-thread 4 KiB copy-on-write and of one thin expansion goes. One thread faults at a
//! time; around each store the bench takes a timestamp, and the fault paths record theirs
//! (`densevm_pmem::trace`); the medians of each step's share are printed as a table.

use std::path::Path;
use std::time::Duration;

use densevm_pmem::trace::{self, Step, STEPS};
use densevm_pmem::MapOptions;

use crate::common::{create, fill, map_with, CLUSTER, MIB, PAGE};

/// One traced store: the bench's timestamps around it and the fault's steps.
struct Sample {
    before: u64,
    steps: [u64; STEPS],
    after: u64,
}

fn store(addr: u64) -> Sample {
    trace::reset();
    let before = trace::now_ns();
    // SAFETY: callers pass an address inside a live mapped region.
    unsafe { std::ptr::write_volatile(addr as *mut u8, 1) };
    let after = trace::now_ns();
    Sample {
        before,
        steps: trace::last(),
        after,
    }
}

/// A point of a sample's timeline: the bench's timestamps or one recorded step.
#[derive(Clone, Copy)]
enum At {
    Before,
    Mark(Step),
    After,
}

fn at(s: &Sample, a: At) -> u64 {
    match a {
        At::Before => s.before,
        At::Mark(step) => s.steps[step as usize],
        At::After => s.after,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prints, for each segment `(name, from, to)`, the median of `to - from` over the samples
/// where both points were reached, and the median of the whole store.
fn report(title: &str, samples: &[Sample], segments: &[(&str, At, At)]) {
    println!("\n{title} ({} faults, medians)\n", samples.len());
    println!("| step | µs |");
    println!("|---|---|");
    for (name, from, to) in segments {
        let d: Vec<f64> = samples
            .iter()
            .filter_map(|s| {
                let (a, b) = (at(s, *from), at(s, *to));
                (a != 0 && b >= a).then(|| (b - a) as f64 / 1e3)
            })
            .collect();
        let n = d.len();
        println!("| {name} | {:.2} ({n}) |", median(d));
    }
    let total: Vec<f64> = samples
        .iter()
        .map(|s| (s.after - s.before) as f64 / 1e3)
        .collect();
    println!("| **whole store** | **{:.2}** |", median(total));
}

/// Host-thread 4 KiB CoW over a snapshot, one store per page, with `opts`.
pub fn cow(d: &Path, name: &str, opts: MapOptions) {
    let img = d.join(format!("prof-cow-{name}.pcow"));
    create(&img, 64 * MIB, None);
    fill(&img, 8 * MIB, 0x11).snapshot_create("s").unwrap();
    let r = map_with(&img, opts);
    let mut samples = Vec::new();
    for off in (0..8 * MIB).step_by(PAGE as usize) {
        // SAFETY: inside the mapped region; warms the read-only page like the peers.
        std::hint::black_box(unsafe {
            std::ptr::read_volatile((r.host_addr() + off) as *const u8)
        });
        samples.push(store(r.host_addr() + off));
    }
    use At::{After, Before, Mark};
    report(
        &format!("4 KiB CoW, host thread, {name}"),
        &samples,
        &[
            (
                "store → handler entered (fault + signal delivery)",
                Before,
                Mark(Step::HandlerEntered),
            ),
            (
                "handler → work started (here or on the service thread)",
                Mark(Step::HandlerEntered),
                Mark(Step::PickedUp),
            ),
            (
                "allocate (top cluster, entry)",
                Mark(Step::PickedUp),
                Mark(Step::Allocated),
            ),
            (
                "read the lower-layer 4 KiB (none: copied from the faulting page)",
                Mark(Step::Allocated),
                Mark(Step::Read),
            ),
            (
                "pwrite the 4 KiB to the top file",
                Mark(Step::Read),
                Mark(Step::Written),
            ),
            (
                "mmap the copy over the page",
                Mark(Step::Written),
                Mark(Step::Mapped),
            ),
            (
                "pre-fault it writable (only with MapOptions::prefault)",
                Mark(Step::Mapped),
                Mark(Step::WorkDone),
            ),
            (
                "bookkeeping → work finished",
                Mark(Step::WorkDone),
                Mark(Step::WakeSent),
            ),
            (
                "handler sees it finished",
                Mark(Step::WakeSent),
                Mark(Step::HandlerLeaving),
            ),
            (
                "sigreturn + retried store (faults the page in unless pre-faulted)",
                Mark(Step::HandlerLeaving),
                After,
            ),
            (
                "(work: pickup → done)",
                Mark(Step::PickedUp),
                Mark(Step::WorkDone),
            ),
        ],
    );
    let s = r.stats();
    println!(
        "\nstats: cow units {}, SIGSEGV faults {}, served in the handler {}",
        s.cow_units, s.segv_faults, s.segv_in_handler
    );
}

/// Thin expansion of fresh clusters, one store per cluster, paced like the `expansion`
/// part's paced figure (a pause every 32 so the pool keeps up), with `opts`.
pub fn expansion(d: &Path, name: &str, opts: MapOptions) {
    let img = d.join(format!("prof-exp-{name}.pcow"));
    let n = 1024u64;
    create(&img, n * CLUSTER, None);
    let r = map_with(&img, opts);
    let mut samples = Vec::new();
    for i in 0..n {
        if i % 32 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        samples.push(store(r.host_addr() + i * CLUSTER));
    }
    use At::{After, Before, Mark};
    report(
        &format!("thin expansion, host thread, {name}"),
        &samples,
        &[
            (
                "store → service thread read the uffd message",
                Before,
                Mark(Step::PickedUp),
            ),
            (
                "allocate (pool cluster, entry)",
                Mark(Step::PickedUp),
                Mark(Step::Allocated),
            ),
            (
                "mmap the cluster over the placeholder",
                Mark(Step::Allocated),
                Mark(Step::Mapped),
            ),
            (
                "pre-fault the page writable (only with MapOptions::prefault)",
                Mark(Step::Mapped),
                Mark(Step::WorkDone),
            ),
            ("bookkeeping", Mark(Step::WorkDone), Mark(Step::WakeSent)),
            (
                "UFFDIO_WAKE → retried store done (faults the page in unless pre-faulted)",
                Mark(Step::WakeSent),
                After,
            ),
            (
                "(work: pickup → done)",
                Mark(Step::PickedUp),
                Mark(Step::WorkDone),
            ),
        ],
    );
    r.flush().unwrap();
}

/// Runs the profile of both faults with the default options.
pub fn run(d: &Path) {
    if !trace::ENABLED {
        println!("profile: build with `--features fault-trace` to record the fault steps");
        return;
    }
    cow(
        d,
        "served on the faulting thread (default)",
        MapOptions::default(),
    );
    cow(
        d,
        "handed to the service thread",
        MapOptions {
            cow_on_faulting_thread: false,
            ..MapOptions::default()
        },
    );
    expansion(d, "default", MapOptions::default());
    expansion(
        d,
        "pre-faulted before the wake",
        MapOptions {
            prefault: true,
            ..MapOptions::default()
        },
    );
}
