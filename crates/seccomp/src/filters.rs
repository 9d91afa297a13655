//! The allow-lists. Each kind's list is a union of the sets below; the table in
//! docs/security.md ("seccomp filters") says what each set is for.
//!
//! Spawn rules shape them: a thread's filter is inherited by the threads it starts and
//! stacked filters intersect, so a kind that starts threads lazily allows everything its
//! children need (vCPUs activate devices, whose workers start then: the vCPU list includes
//! every worker's; the 9p dispatcher starts its pool; the control thread resumes parked
//! workers and maps pmem overlays). No thread starts programs: clones are started by the
//! clone launcher, a process forked before any filter (densevm's `cmd/launcher.rs`).

use crate::tree::{self, Entry};
use crate::ThreadKind;
use libc::*;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompRule,
};
use std::collections::BTreeMap;

/// Process-wide choices the lists depend on.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// `--seccomp log`: a call outside a list is allowed and logged by the kernel's audit
    /// (`SECCOMP_RET_LOG`, `type=1326` lines in dmesg when audit is on) instead of killing
    /// the process: for finding what a list lacks on a new kernel or C library.
    pub log_only: bool,
}

/// ioctl type bytes (`_IOC_TYPE`): the families an ioctl filter admits.
const KVMIO: u64 = 0xAE;
const UFFDIO: u64 = 0xAA;
const TUNIO: u64 = b'T' as u64;
/// `PAGEMAP_SCAN` (`_IOWR('f', 16, struct pm_scan_arg)`, 96 bytes; Linux ≥ 6.7): which
/// pages of guest RAM the VMM holds privately, asked of `/proc/self/pagemap` by snapshots
/// and templates (densevm-vmm's `snapshot::pagemap`).
const PAGEMAP_SCAN: u64 = 0xC060_6610;

/// A kind's rules under construction: syscall → rules (empty: unconditional).
struct Rules(BTreeMap<i64, Vec<SeccompRule>>);

impl Rules {
    fn allow(&mut self, calls: &[c_long]) {
        for &nr in calls {
            self.0.insert(nr, Vec::new());
        }
    }

    /// Allows `nr` when `cond` holds (unless it is already unconditional).
    fn allow_if(&mut self, nr: c_long, conds: Vec<Cond>) -> Result<(), seccompiler::BackendError> {
        let rule = SeccompRule::new(conds)?;
        match self.0.get_mut(&nr) {
            Some(rules) if rules.is_empty() => {}
            Some(rules) => rules.push(rule),
            None => {
                self.0.insert(nr, vec![rule]);
            }
        }
        Ok(())
    }

    fn ioctl_family(&mut self, ty: u64) -> Result<(), seccompiler::BackendError> {
        self.allow_if(
            SYS_ioctl,
            vec![Cond::new(1, Len::Dword, Op::MaskedEq(0xff00), ty << 8)?],
        )
    }
}

/// Calls every thread makes: memory without PROT_EXEC, futexes, signals (a panic's abort,
/// the vCPU kick), time, logging to stderr, eventfd and epoll waits, reading and writing
/// descriptors it already holds, thread exit, and narrowing its own filter (`prctl`
/// NO_NEW_PRIVS / thread names, `seccomp` SET_MODE_FILTER) for threads it starts.
fn base(r: &mut Rules) -> Result<(), seccompiler::BackendError> {
    r.allow(&[
        SYS_read,
        SYS_write,
        SYS_readv,
        SYS_writev,
        SYS_pread64,
        SYS_pwrite64,
        SYS_lseek,
        SYS_close,
        SYS_fstat,
        SYS_newfstatat,
        SYS_statx,
        SYS_fcntl,
        SYS_futex,
        SYS_sched_yield,
        SYS_sched_getaffinity,
        SYS_nanosleep,
        SYS_clock_nanosleep,
        SYS_clock_gettime,
        SYS_gettimeofday,
        SYS_munmap,
        SYS_mremap,
        SYS_madvise,
        SYS_brk,
        SYS_rt_sigprocmask,
        SYS_rt_sigreturn,
        SYS_rt_sigaction,
        SYS_sigaltstack,
        SYS_restart_syscall,
        SYS_exit,
        SYS_exit_group,
        SYS_getrandom,
        SYS_gettid,
        SYS_getpid,
        SYS_epoll_wait,
        SYS_epoll_pwait,
        SYS_poll,
        SYS_ppoll,
        SYS_set_robust_list,
        SYS_rseq,
        SYS_getuid,
        SYS_geteuid,
        SYS_getgid,
        SYS_getegid,
    ]);
    // Signals only to threads of this process (abort, the vCPU kick).
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { getpid() } as u64;
    r.allow_if(SYS_tgkill, vec![Cond::new(0, Len::Dword, Op::Eq, pid)?])?;
    for call in [SYS_mmap, SYS_mprotect] {
        r.allow_if(
            call,
            vec![Cond::new(2, Len::Dword, Op::MaskedEq(PROT_EXEC as u64), 0)?],
        )?;
    }
    for op in [PR_SET_NAME, PR_GET_NAME, PR_SET_NO_NEW_PRIVS] {
        r.allow_if(
            SYS_prctl,
            vec![Cond::new(0, Len::Dword, Op::Eq, op as u64)?],
        )?;
    }
    // std's own descriptor ioctls: set_nonblocking (FIONBIO), close-on-exec (FIOCLEX,
    // FIONCLEX), is_terminal (TCGETS).
    for req in [FIONBIO, FIOCLEX, FIONCLEX, TCGETS] {
        r.allow_if(SYS_ioctl, vec![Cond::new(1, Len::Dword, Op::Eq, req)?])?;
    }
    r.allow_if(
        SYS_seccomp,
        vec![Cond::new(
            0,
            Len::Dword,
            Op::Eq,
            SECCOMP_SET_MODE_FILTER as u64,
        )?],
    )
}

/// Starting threads: `clone` with CLONE_THREAD only (`clone3`, whose flags a filter
/// cannot read, is answered ENOSYS, see [`compile`], so glibc falls back to `clone`).
fn spawn_threads(r: &mut Rules) -> Result<(), seccompiler::BackendError> {
    r.allow(&[SYS_clone3]);
    r.allow_if(
        SYS_clone,
        vec![Cond::new(
            0,
            Len::Qword,
            Op::MaskedEq(CLONE_THREAD as u64),
            CLONE_THREAD as u64,
        )?],
    )
}

/// New descriptors a worker's start-up and a device activation make.
fn fds(r: &mut Rules) {
    r.allow(&[
        SYS_eventfd2,
        SYS_epoll_create1,
        SYS_epoll_ctl,
        SYS_dup,
        SYS_pipe2,
    ]);
}

/// Files: block backends, pcow images, pmem flushes, tier swap.
fn file_io(r: &mut Rules) {
    r.allow(&[
        SYS_preadv,
        SYS_pwritev,
        SYS_preadv2,
        SYS_pwritev2,
        SYS_fsync,
        SYS_fdatasync,
        SYS_fallocate,
        SYS_ftruncate,
        SYS_fstatfs,
        SYS_flock,
        SYS_fadvise64,
        SYS_msync,
        SYS_sync_file_range,
    ]);
}

/// The 9p server's descriptor-relative file system calls.
fn ninep(r: &mut Rules) {
    file_io(r);
    r.allow(&[
        SYS_openat,
        SYS_openat2,
        SYS_getdents64,
        SYS_mkdirat,
        SYS_mknodat,
        SYS_unlinkat,
        SYS_renameat,
        SYS_renameat2,
        SYS_linkat,
        SYS_symlinkat,
        SYS_readlinkat,
        SYS_fchownat,
        SYS_fchown,
        SYS_fchmod,
        SYS_fchmodat,
        SYS_utimensat,
        SYS_faccessat,
        SYS_faccessat2,
        SYS_statfs,
        SYS_fgetxattr,
        SYS_fsetxattr,
        SYS_flistxattr,
        SYS_fremovexattr,
        SYS_getxattr,
        SYS_setxattr,
        SYS_listxattr,
        SYS_removexattr,
        SYS_lgetxattr,
        SYS_lsetxattr,
        SYS_llistxattr,
        SYS_lremovexattr,
        SYS_setfsuid,
        SYS_setfsgid,
        SYS_copy_file_range,
        SYS_sendfile,
        SYS_sync_file_range,
        SYS_dup3,
    ]);
}

/// Unix sockets: accept, talk, and (vsock) connect to AF_UNIX only.
fn unix_sockets(r: &mut Rules, connect: bool) -> Result<(), seccompiler::BackendError> {
    r.allow(&[
        SYS_accept4,
        SYS_accept,
        SYS_recvfrom,
        SYS_sendto,
        SYS_recvmsg,
        SYS_sendmsg,
        SYS_shutdown,
        SYS_getsockopt,
        SYS_setsockopt,
        SYS_getsockname,
        SYS_getpeername,
    ]);
    if connect {
        r.allow(&[SYS_connect]);
        r.allow_if(
            SYS_socket,
            vec![Cond::new(0, Len::Dword, Op::Eq, AF_UNIX as u64)?],
        )?;
    }
    Ok(())
}

/// userfaultfd service: the UFFDIO ioctls, files behind the faults.
fn fault_service(r: &mut Rules) -> Result<(), seccompiler::BackendError> {
    file_io(r);
    r.ioctl_family(UFFDIO)
}

/// What one kind's thread may do (besides [`base`]).
fn kind_rules(kind: ThreadKind, r: &mut Rules) -> Result<(), seccompiler::BackendError> {
    use ThreadKind::*;
    match kind {
        Blk | VirtioPmem => file_io(r),
        Net | Rng => {}
        P9 | P9Io => {
            ninep(r);
            spawn_threads(r)?;
        }
        Vsock => {
            unix_sockets(r, true)?;
            // Each host connection joins the muxer's epoll set.
            r.allow(&[SYS_epoll_ctl]);
        }
        Balloon => {
            // Released pages: holes in the RAM file, through the tier when there is one.
            file_io(r);
            r.ioctl_family(UFFDIO)?;
        }
        VirtioWorker => {
            for k in [Blk, Net, Rng, P9, Vsock, Balloon, VirtioPmem] {
                kind_rules(k, r)?;
            }
        }
        Vcpu => {
            // KVM_RUN and the vCPU's state; KVM_SET_GSI_ROUTING etc. on the VM fd when the
            // guest reprograms MSI-X; TUNSETOFFLOAD when virtio-net activates.
            r.ioctl_family(KVMIO)?;
            r.ioctl_family(TUNIO)?;
            fds(r);
            spawn_threads(r)?;
            // Device activation starts the worker, which inherits this filter.
            kind_rules(VirtioWorker, r)?;
        }
        Api => {
            unix_sockets(r, false)?;
            // `kill` for clones that failed to start. Threads: the clone reaper (and its
            // `wait4`) of clones started directly; a filtered VMM's clones are the clone
            // launcher's children, which reaps them.
            spawn_threads(r)?;
            r.allow(&[SYS_wait4, SYS_kill, SYS_unlink, SYS_unlinkat]);
            // Balloon and tier requests act on guest memory.
            file_io(r);
            r.ioctl_family(UFFDIO)?;
        }
        Console => unix_sockets(r, false)?,
        CloneReaper => r.allow(&[SYS_wait4]),
        PmemFaults | PmemPool => fault_service(r)?,
        Tier => {
            fault_service(r)?;
            // The swap file, made on first use: an unlinked new file (O_TMPFILE) only.
            r.allow_if(
                SYS_openat,
                vec![Cond::new(
                    2,
                    Len::Dword,
                    Op::MaskedEq(O_TMPFILE as u64),
                    O_TMPFILE as u64,
                )?],
            )?;
        }
        Vmm => {
            for k in [Vcpu, Api, Console, PmemFaults, Tier] {
                kind_rules(k, r)?;
            }
            ninep(r);
            fds(r);
            // Snapshots and templates: files and directories; the RAM memfd; pmem overlays
            // (a new userfaultfd); the pages of RAM the VM wrote (PAGEMAP_SCAN); the
            // sockets' and console's cleanup; --report reads /proc/self/smaps.
            r.allow(&[
                SYS_open,
                SYS_mkdir,
                SYS_unlink,
                SYS_rename,
                SYS_readlink,
                SYS_memfd_create,
                SYS_userfaultfd,
                SYS_wait4,
                SYS_kill,
                SYS_uname,
            ]);
            r.ioctl_family(UFFDIO)?;
            r.allow_if(
                SYS_ioctl,
                vec![Cond::new(1, Len::Dword, Op::Eq, PAGEMAP_SCAN)?],
            )?;
        }
    }
    Ok(())
}

/// The syscalls `kind` may make (for tests and docs).
pub(crate) fn rules(
    kind: ThreadKind,
) -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut r = Rules(BTreeMap::new());
    base(&mut r)?;
    kind_rules(kind, &mut r)?;
    Ok(r.0)
}

/// `kind`'s program: its allow-list (anything else traps, or is logged under
/// `--seccomp log`), with `clone3` answered ENOSYS where the list has it (and under
/// `--seccomp log`, where it would otherwise pass with flags no filter can read).
pub(crate) fn compile(kind: ThreadKind, policy: &Policy) -> Result<BpfProgram, String> {
    let rules = rules(kind).map_err(|e| e.to_string())?;
    let mut calls: BTreeMap<i64, Entry> = rules
        .into_iter()
        .map(|(nr, rules)| (nr, Entry::Rules(rules)))
        .collect();
    if calls.contains_key(&SYS_clone3) || policy.log_only {
        calls.insert(
            SYS_clone3,
            Entry::Action(SeccompAction::Errno(ENOSYS as u32)),
        );
    }
    let mismatch = if policy.log_only {
        SeccompAction::Log
    } else {
        SeccompAction::Trap
    };
    tree::compile(calls, mismatch, SeccompAction::Allow).map_err(|e| e.to_string())
}
