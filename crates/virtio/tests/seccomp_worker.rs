//! A device worker filters itself at its start when the process enabled seccomp
//! (docs/security.md, "seccomp filters"): its own calls (eventfds, epoll, getrandom) pass,
//! a forbidden one ends the process with exit code 159 and a line naming the worker's kind
//! and the call. Each case runs in a child process (this test binary run again), since a
//! filter cannot be removed and the violation ends the process.

use densevm_seccomp::{Policy, ThreadKind};
use densevm_virtio::worker::{QueueHandler, Worker};
use std::process::Command;
use vmm_sys_util::eventfd::EventFd;

const CHILD_ENV: &str = "DENSEVM_SECCOMP_WORKER_CHILD";

/// Queue 0 notified: fill a buffer from getrandom (what virtio-rng does) and report on
/// `done`; the next notification makes a forbidden call.
struct Handler {
    done: EventFd,
    calls: u32,
}

impl QueueHandler for Handler {
    fn handle_queue(&mut self, _index: usize) {
        self.calls += 1;
        match self.calls {
            1 => {} // the start-up call
            2 => {
                let mut buf = [0u8; 64];
                // SAFETY: `buf` is valid for its length.
                let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
                assert_eq!(n, 64);
                self.done.write(1).unwrap();
            }
            _ => {
                // SAFETY: socket takes no pointers.
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
                self.done.write(1).unwrap();
            }
        }
    }
}

fn child(case: &str) -> ! {
    let (name, violation) = match case {
        "hook" => ("virtio-blk", Some(ThreadKind::Blk)),
        _ => ("virtio-rng", None),
    };
    densevm_seccomp::enable(Policy::default(), violation).unwrap();
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let done = EventFd::new(0).unwrap();
    let handler = Handler {
        done: done.try_clone().unwrap(),
        calls: 0,
    };
    let worker = Worker::spawn(name, vec![kick.try_clone().unwrap()], handler).unwrap();
    kick.write(1).unwrap();
    done.read().unwrap();
    eprintln!("child: the filtered worker served a request");
    kick.write(1).unwrap();
    done.read().unwrap();
    drop(worker);
    std::process::exit(0);
}

fn run_child(case: &str) -> (Option<i32>, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "filtered_workers",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, case)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn filtered_workers() {
    if let Ok(case) = std::env::var(CHILD_ENV) {
        child(&case);
    }
    let (code, err) = run_child("serve");
    assert_eq!(code, Some(159), "{err}");
    assert!(
        err.contains("the filtered worker served a request"),
        "{err}"
    );
    assert!(
        err.contains("densevm: seccomp: thread kind virtio-rng made a forbidden system call: socket (41); exiting with code 159"),
        "{err}"
    );
    let (code, err) = run_child("hook");
    assert_eq!(code, Some(159), "{err}");
    assert!(
        err.contains("thread kind virtio-blk made a forbidden system call: socket (41)"),
        "{err}"
    );
    assert!(!err.contains("served a request"), "{err}");
}
