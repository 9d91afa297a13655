//! Host-thread copy-on-write served inside the SIGSEGV handler, on the faulting thread
//! (`MapOptions::cow_on_faulting_thread`, the default): from a thread whose handler runs on
//! Rust's small alternate signal stack (the fault path moves to the thread's own stack),
//! from a thread without an alternate stack, with asynchronous signals arriving while
//! pages are copied up, and whole-cluster copy-ups (needs userfaultfd: run as root or with access to /dev/userfaultfd).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_clean, create, fill, map, map_with, read_chain, tmpdir, CLUSTER, MIB, PAGE};
use densevm_pmem::MapOptions;

/// A snapshot holding 0x11 over the first `len` bytes of a 16 MiB image.
fn image(dir: &Path, len: u64) -> PathBuf {
    let img = dir.join("a.pcow");
    create(&img, 16 * MIB, None);
    fill(&img, len, 0x11).snapshot_create("s").unwrap();
    img
}

/// Writes byte `v` at offset 7 of every page of `[addr, addr+len)`.
fn write_pages(addr: u64, len: u64, v: u8) {
    for off in (0..len).step_by(PAGE as usize) {
        // SAFETY: callers pass a range inside a live mapped region.
        unsafe { std::ptr::write_volatile((addr + off + 7) as *mut u8, v) };
    }
}

/// Checks the first `len` bytes of `img`: 0x11 everywhere except byte 7 of each page, `v`.
fn check_pages(img: &Path, len: u64, v: u8) {
    let data = read_chain(img, 0, len as usize);
    for (i, page) in data.chunks(PAGE as usize).enumerate() {
        assert_eq!(page[7], v, "page {i} byte 7");
        assert!(
            page[..7].iter().chain(&page[8..]).all(|&b| b == 0x11),
            "page {i} rest"
        );
    }
    assert_clean(img);
}

#[test]
fn copy_ups_are_served_on_the_faulting_thread_with_and_without_an_alternate_stack() {
    let dir = tmpdir("handler-stacks");
    let img = image(&dir, 2 * MIB);
    let r = map(&img);
    let addr = r.host_addr();
    // A Rust thread: its handler runs on the alternate signal stack Rust gives every thread.
    std::thread::spawn(move || {
        // SAFETY: querying this thread's alternate stack into a struct we own.
        let mut ss: libc::stack_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above (null new stack: query only).
        assert_eq!(unsafe { libc::sigaltstack(std::ptr::null(), &mut ss) }, 0);
        assert_eq!(ss.ss_flags & libc::SS_DISABLE, 0, "Rust gives threads one");
        write_pages(addr, MIB, 0x22)
    })
    .join()
    .unwrap();
    // The same without an alternate stack: the handler runs on the thread's own stack.
    std::thread::spawn(move || {
        let ss = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        // SAFETY: disabling this thread's alternate signal stack (Rust frees its own
        // allocation when the thread exits whether or not it is still installed).
        assert_eq!(unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) }, 0);
        write_pages(addr + MIB, MIB, 0x22);
    })
    .join()
    .unwrap();
    let s = r.stats();
    assert_eq!(s.cow_units, 2 * MIB / PAGE, "{s:?}");
    assert_eq!(s.segv_faults, 2 * MIB / PAGE, "{s:?}");
    assert_eq!(
        s.segv_in_handler, s.segv_faults,
        "all served in the handler: {s:?}"
    );
    r.flush().unwrap();
    drop(r);
    check_pages(&img, 2 * MIB, 0x22);
}

static USR1: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    USR1.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn asynchronous_signals_during_copy_ups_do_not_break_them() {
    let dir = tmpdir("handler-signals");
    let len = 8 * MIB;
    let img = image(&dir, len);
    // A SIGUSR1 handler on the alternate stack: delivered while a copy-up runs on the
    // interrupted stack, it would overwrite the SIGSEGV handler's frame if not blocked.
    // SAFETY: installing a plain handler with a zeroed, then filled, sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let r = Arc::new(map(&img));
    let addr = r.host_addr();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = done.clone();
        std::thread::spawn(move || {
            write_pages(addr, len, 0x33);
            done.store(true, Ordering::Release);
        })
    };
    let tid = {
        use std::os::unix::thread::JoinHandleExt;
        writer.as_pthread_t()
    };
    let mut sent = 0u64;
    while !done.load(Ordering::Acquire) {
        // SAFETY: the writer thread is alive until `done` is set (joined below).
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
        sent += 1;
        std::thread::sleep(Duration::from_micros(20));
    }
    writer.join().unwrap();
    assert!(sent > 0 && USR1.load(Ordering::Relaxed) > 0);
    let s = r.stats();
    assert_eq!(s.cow_units, len / PAGE, "{s:?}");
    r.flush().unwrap();
    drop(r);
    check_pages(&img, len, 0x33);
}

#[test]
fn whole_cluster_copy_ups_from_the_handler_keep_every_unit() {
    let dir = tmpdir("handler-whole");
    let img = image(&dir, MIB);
    let r = map_with(
        &img,
        MapOptions {
            whole_cluster_units: 16,
            ..MapOptions::default()
        },
    );
    // One store into the sixth page of each cluster copies the whole cluster up.
    let clusters = MIB / CLUSTER;
    for c in 0..clusters {
        let at = r.host_addr() + c * CLUSTER + 5 * PAGE + 7;
        // SAFETY: inside the mapped region.
        unsafe { std::ptr::write_volatile(at as *mut u8, 0x44) };
    }
    let s = r.stats();
    assert_eq!(s.cow_faults, clusters, "{s:?}");
    assert_eq!(s.cow_units, clusters * 16, "{s:?}");
    assert_eq!(s.segv_in_handler, clusters, "{s:?}");
    r.flush().unwrap();
    drop(r);
    let data = read_chain(&img, 0, MIB as usize);
    for (i, page) in data.chunks(PAGE as usize).enumerate() {
        let want7 = if i % 16 == 5 { 0x44 } else { 0x11 };
        assert_eq!(page[7], want7, "page {i} byte 7");
        assert!(
            page[..7].iter().chain(&page[8..]).all(|&b| b == 0x11),
            "page {i} rest"
        );
    }
    assert_clean(&img);
}
