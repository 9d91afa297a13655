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
        for log_only in [false, true] {
            let p = filters::compile(k, &Policy { log_only }).unwrap();
            assert!(p.len() > 10 && p.len() < 4096, "{k:?}: {}", p.len());
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
        let p = filters::rules(parent).unwrap();
        for (nr, rules) in filters::rules(child).unwrap() {
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
    let r = filters::rules(ThreadKind::Vcpu).unwrap();
    assert!(!r.contains_key(&libc::SYS_execve));
    assert!(!r.contains_key(&libc::SYS_fork));
    assert_eq!(r[&libc::SYS_socket].len(), 1, "socket is argument-filtered");
    assert!(!r[&libc::SYS_mmap].is_empty(), "mmap is argument-filtered");
}

/// No thread may start a program (clones are started by the launcher, forked before any
/// filter): no kind has `execve`, `fork`, `vfork`, `clone` without `CLONE_THREAD`, or
/// executable mappings.
#[test]
fn no_kind_can_start_a_program_or_map_code() {
    for &k in ThreadKind::ALL {
        let r = filters::rules(k).unwrap();
        for nr in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_fork,
            libc::SYS_vfork,
        ] {
            assert!(!r.contains_key(&nr), "{k:?} allows {:?}", syscall_name(nr));
        }
        for nr in [libc::SYS_mmap, libc::SYS_mprotect] {
            assert!(
                !r[&nr].is_empty(),
                "{k:?}: {:?} unfiltered",
                syscall_name(nr)
            );
        }
        if let Some(clone) = r.get(&libc::SYS_clone) {
            assert!(!clone.is_empty(), "{k:?}: clone with any flags");
        }
    }
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

/// The child half of [`a_filtered_thread_can_free_a_large_heap`]: a thread of a kind
/// without `openat` fills and frees 8 MiB of small chunks (its own arena's heap shrinks).
fn shrink_child() -> ! {
    enable(Policy::default(), None).unwrap();
    let t = std::thread::spawn(|| {
        enter(ThreadKind::Console);
        for round in 0..4 {
            let chunks: Vec<Box<[u8]>> = (0..8192)
                .map(|i| vec![(i + round) as u8; 1000].into_boxed_slice())
                .collect();
            std::hint::black_box(&chunks);
            for c in chunks.into_iter().rev() {
                drop(std::hint::black_box(c));
            }
        }
        eprintln!("child: freed its heap");
    });
    let _ = t.join();
    std::process::exit(0);
}

/// glibc's first shrink of a thread arena's heap reads /proc/sys/vm/overcommit_memory:
/// `enable` makes that happen before any filter, so a filtered thread without `openat`
/// can free memory.
#[test]
fn a_filtered_thread_can_free_a_large_heap() {
    if std::env::var_os("DENSEVM_SECCOMP_TEST_SHRINK").is_some() {
        shrink_child();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::a_filtered_thread_can_free_a_large_heap",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DENSEVM_SECCOMP_TEST_SHRINK", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("child: freed its heap"), "{stderr}");
}

/// The kernel accepts every kind's program, under both policies (it rejects, with EINVAL,
/// a program whose jumps leave it, even jumps that never run), and a filtered thread goes
/// on with what every kind may do.
#[test]
fn the_kernel_accepts_every_kind() {
    for &k in ThreadKind::ALL {
        for log_only in [false, true] {
            let p = filters::compile(k, &Policy { log_only }).unwrap();
            let r = std::thread::spawn(move || {
                seccompiler::apply_filter(&p).map_err(|e| e.to_string())?;
                // SAFETY: gettid takes no arguments.
                Ok::<_, String>(unsafe { libc::gettid() })
            })
            .join()
            .unwrap();
            assert!(r.is_ok(), "{k:?} log_only={log_only}: {r:?}");
        }
    }
}
