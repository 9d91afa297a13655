use super::*;

#[test]
fn names_cover_common_calls() {
    assert_eq!(syscall_name(libc::SYS_socket), Some("socket"));
    assert_eq!(syscall_name(libc::SYS_execve), Some("execve"));
    assert_eq!(syscall_name(libc::SYS_ioctl), Some("ioctl"));
    assert_eq!(syscall_name(libc::SYS_openat2), Some("openat2"));
    assert_eq!(syscall_name(-1), None);
    assert_eq!(syscall_name(100_000), None);
}

#[test]
fn kinds_round_trip_and_compile() {
    for &k in ThreadKind::ALL {
        assert_eq!(ThreadKind::from_name(k.name()), Some(k));
        for exec_clones in [false, true] {
            let p = filters::compile(
                k,
                &Policy {
                    exec_clones,
                    log_only: false,
                },
            )
            .unwrap();
            assert!(
                p[0].len() > 10 && p[0].len() < 4096,
                "{k:?}: {}",
                p[0].len()
            );
        }
    }
    assert_eq!(ThreadKind::virtio_worker("virtio-9p"), ThreadKind::P9);
    assert_eq!(
        ThreadKind::virtio_worker("test-poll"),
        ThreadKind::VirtioWorker
    );
}

/// Spawners allow what their children need (stacked filters intersect): every syscall
/// a child kind allows is allowed by its parent kind.
#[test]
fn spawners_cover_their_children() {
    use ThreadKind::*;
    let policy = Policy::default();
    let pairs = [
        (Vcpu, Blk),
        (Vcpu, Net),
        (Vcpu, Rng),
        (Vcpu, P9),
        (Vcpu, P9Io),
        (Vcpu, Vsock),
        (Vcpu, Balloon),
        (Vcpu, VirtioPmem),
        (P9, P9Io),
        (Api, CloneReaper),
        (Vmm, PmemFaults),
        (Vmm, PmemPool),
        (Vmm, Blk),
        (Vmm, P9),
        (Vmm, Vsock),
    ];
    for (parent, child) in pairs {
        let p = filters::rules(parent, &policy).unwrap();
        for (nr, rules) in filters::rules(child, &policy).unwrap() {
            let Some(prules) = p.get(&nr) else {
                panic!(
                    "{parent:?} lacks {:?} that {child:?} needs",
                    syscall_name(nr)
                );
            };
            assert!(
                prules.is_empty() || prules.len() >= rules.len() && !rules.is_empty(),
                "{parent:?} restricts {:?} more than {child:?}",
                syscall_name(nr)
            );
        }
    }
}

#[test]
fn vcpu_cannot_exec_or_open_inet_sockets() {
    let r = filters::rules(ThreadKind::Vcpu, &Policy::default()).unwrap();
    assert!(!r.contains_key(&libc::SYS_execve));
    assert!(!r.contains_key(&libc::SYS_fork));
    assert_eq!(r[&libc::SYS_socket].len(), 1, "socket is argument-filtered");
    assert!(!r[&libc::SYS_mmap].is_empty(), "mmap is argument-filtered");
    let vmm = filters::rules(ThreadKind::Vmm, &Policy::default()).unwrap();
    assert!(!vmm.contains_key(&libc::SYS_execve));
    let vmm = filters::rules(
        ThreadKind::Vmm,
        &Policy {
            exec_clones: true,
            ..Policy::default()
        },
    )
    .unwrap();
    assert!(vmm.contains_key(&libc::SYS_execve));
}

/// The child half of [`denied_call_kills_with_message`].
fn child(kind: &str) -> ! {
    let kind = ThreadKind::from_name(kind).unwrap();
    enable(Policy::default(), None).unwrap();
    let t = std::thread::spawn(move || {
        enter(kind);
        // Allowed: the thread goes on.
        eprintln!("child: filtered as {}", kind.name());
        // Forbidden for every kind.
        // SAFETY: socket takes no pointers.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    });
    let _ = t.join();
    std::process::exit(0);
}

#[test]
fn denied_call_kills_with_message() {
    if let Ok(kind) = std::env::var("DENSEVM_SECCOMP_TEST_CHILD") {
        child(&kind);
    }
    for kind in ["vcpu", "virtio-blk", "api", "vmm"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::denied_call_kills_with_message",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DENSEVM_SECCOMP_TEST_CHILD", kind)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_CODE), "{kind}: {stderr}");
        assert!(stderr.contains(&format!("filtered as {kind}")), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "densevm: seccomp: thread kind {kind} made a forbidden system call: socket (41)"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn enter_is_a_no_op_until_enabled() {
    // This test process never enables filtering (the child above runs in its own process).
    assert_eq!(mode(), Mode::Unset);
    enter(ThreadKind::Vcpu);
    // SAFETY: socket takes no pointers; the descriptor is closed at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
}

/// A clone runs under its parent's control-thread list (filters survive `execve`) as well
/// as its own: no rule of that list may name the parent's pid, and it covers every kind.
#[test]
fn the_control_list_that_clones_inherit_covers_every_kind_for_any_pid() {
    let vmm = filters::rules(
        ThreadKind::Vmm,
        &Policy {
            exec_clones: true,
            ..Policy::default()
        },
    )
    .unwrap();
    assert!(
        vmm[&libc::SYS_tgkill].is_empty(),
        "tgkill must not be pid-bound"
    );
    for &k in ThreadKind::ALL {
        for (nr, rules) in filters::rules(k, &Policy::default()).unwrap() {
            let Some(prules) = vmm.get(&nr) else {
                panic!("a clone's {k:?} needs {:?}", syscall_name(nr));
            };
            assert!(
                prules.is_empty() || !rules.is_empty(),
                "the inherited list restricts {:?} that {k:?} allows",
                syscall_name(nr)
            );
        }
    }
}

extern "C" fn on_usr1(_: libc::c_int) {}

/// Stages of [`a_clone_started_by_a_filtered_control_thread_can_kick_its_threads`], each
/// in its own process (this test binary, re-run).
fn exec_stage(stage: &str) -> ! {
    if stage == "parent" {
        // The parent VMM: its control thread is filtered and starts the clone.
        enable(
            Policy {
                exec_clones: true,
                ..Policy::default()
            },
            None,
        )
        .unwrap();
        enter(ThreadKind::Vmm);
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::a_clone_started_by_a_filtered_control_thread_can_kick_its_threads",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DENSEVM_SECCOMP_TEST_EXEC", "clone")
            .status()
            .unwrap();
        eprintln!("parent: the clone ended with {status}");
        std::process::exit(status.code().unwrap_or(100));
    }
    // The clone: its own filters on top of the inherited one; its control thread kicks a
    // vCPU-kind thread the way the VMM does (pthread_kill of a real-time signal).
    enable(Policy::default(), None).unwrap();
    // SAFETY: a plain handler that does nothing; the sigaction struct is fully set.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_usr1 as *const () as usize;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()),
            0
        );
    }
    enter(ThreadKind::Vmm);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let vcpu = std::thread::spawn(move || {
        enter(ThreadKind::Vcpu);
        while !stop2.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    use std::os::unix::thread::JoinHandleExt;
    for _ in 0..10 {
        // SAFETY: the thread is alive until it is joined below.
        assert_eq!(
            unsafe { libc::pthread_kill(vcpu.as_pthread_t(), libc::SIGUSR1) },
            0
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    stop.store(true, Ordering::Release);
    vcpu.join().unwrap();
    eprintln!("clone: kicked its vCPU thread 10 times");
    std::process::exit(0);
}

#[test]
fn a_clone_started_by_a_filtered_control_thread_can_kick_its_threads() {
    if let Ok(stage) = std::env::var("DENSEVM_SECCOMP_TEST_EXEC") {
        exec_stage(&stage);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::a_clone_started_by_a_filtered_control_thread_can_kick_its_threads",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DENSEVM_SECCOMP_TEST_EXEC", "parent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("clone: kicked its vCPU thread 10 times"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the clone ended with exit status: 0"),
        "{stderr}"
    );
}
