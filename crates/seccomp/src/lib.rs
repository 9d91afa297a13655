//! seccomp filters per thread kind (issue #16; docs/security.md, "seccomp filters").
//!
//! Every thread densevm starts calls [`enter`] with its [`ThreadKind`] first thing. Until
//! the process has called [`enable`] (only `densevm run` does, unless `--seccomp off`),
//! `enter` does nothing, so unit tests and library users are unaffected. Once enabled,
//! `enter` installs the kind's allow-list on the calling thread (seccomp filters are per
//! thread and inherited by the threads it spawns; stacked filters intersect), and a call
//! outside it raises `SIGSYS` (`SECCOMP_RET_TRAP`): the handler installed by `enable`
//! writes one line naming the thread kind and the system call to stderr and ends the
//! process with [`EXIT_CODE`].
//!
//! The allow-lists are in `filters.rs`; this crate depends on `seccompiler` and `libc`
//! only, so the device crates can call it without seeing VMM types.

mod filters;
mod names;
mod prestart;
mod sigsys;
mod tree;

use seccompiler::BpfProgram;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

pub use filters::Policy;
pub use prestart::{Prestarted, Work};

/// The exit code of a process killed for a denied system call: 128 + SIGSYS (31).
pub const EXIT_CODE: i32 = 159;

macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// The kinds of thread densevm runs; each has its own allow-list.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum ThreadKind {
            $($(#[$doc])* $variant,)*
        }

        impl ThreadKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [ThreadKind] = &[$(ThreadKind::$variant,)*];

            /// The kind's name, as messages, `--seccomp-test-violation` and the docs spell it.
            pub fn name(self) -> &'static str {
                match self {
                    $(ThreadKind::$variant => $name,)*
                }
            }
        }
    };
}

kinds! {
    /// The VMM's control thread (`main`): builds the VM, runs the event loop, writes
    /// snapshots, starts clones, tears down.
    Vmm = "vmm",
    /// A vCPU thread (`KVM_RUN`, device MMIO/PIO, device activation).
    Vcpu = "vcpu",
    /// The per-VM HTTP API server thread.
    Api = "api",
    /// The console socket thread (`--console-sock`).
    Console = "console",
    /// The thread that reaps clone processes.
    CloneReaper = "clone-reaper",
    /// A pmem region's userfaultfd fault service.
    PmemFaults = "pmem-faults",
    /// A pmem region's cluster pool refill thread.
    PmemPool = "pmem-pool",
    /// The memory tier's service thread (`--memory-budget`).
    Tier = "tier",
    /// The virtio-blk worker.
    Blk = "virtio-blk",
    /// The virtio-net worker.
    Net = "virtio-net",
    /// The virtio-rng worker.
    Rng = "virtio-rng",
    /// The virtio-9p dispatcher (worker).
    P9 = "virtio-9p",
    /// A virtio-9p request pool thread.
    P9Io = "virtio-9p-io",
    /// The virtio-vsock worker.
    Vsock = "virtio-vsock",
    /// The virtio-balloon worker.
    Balloon = "virtio-balloon",
    /// The virtio-pmem worker.
    VirtioPmem = "virtio-pmem",
    /// A virtio worker of a device not named above (the union of the workers' lists).
    VirtioWorker = "virtio-worker",
}

impl ThreadKind {
    /// The kind named `name` ([`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<ThreadKind> {
        Self::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The kind of a virtio worker thread called `thread_name` (`virtio-blk`, ...);
    /// [`ThreadKind::VirtioWorker`] for any other name.
    pub fn virtio_worker(thread_name: &str) -> ThreadKind {
        match Self::from_name(thread_name) {
            Some(
                k @ (ThreadKind::Blk
                | ThreadKind::Net
                | ThreadKind::Rng
                | ThreadKind::P9
                | ThreadKind::Vsock
                | ThreadKind::Balloon
                | ThreadKind::VirtioPmem),
            ) => k,
            _ => ThreadKind::VirtioWorker,
        }
    }
}

/// Whether this process filters its threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Neither [`enable`] nor [`disable`] was called (a library user, a client command).
    Unset,
    /// [`enable`] was called: [`enter`] installs filters.
    On,
    /// `--seccomp off`: [`disable`] was called; processes this one starts should be told.
    Off,
    /// [`enable`] was called with [`Policy::log_only`] (`--seccomp log`): [`enter`]
    /// installs filters that log what they would deny; processes this one starts should
    /// be told.
    Log,
}

static MODE: AtomicU8 = AtomicU8::new(0);
/// 0: none, else the kind's discriminant + 1.
static VIOLATION: AtomicU8 = AtomicU8::new(0);
/// The number of kinds.
const KINDS: usize = ThreadKind::ALL.len();
/// The policy [`enable`] was given.
static POLICY: OnceLock<Policy> = OnceLock::new();
/// Each kind's program (`filters::compile`), by discriminant, or why it could not be
/// compiled: compiled by the first thread of the kind to [`enter`] (a VM uses a handful of
/// the kinds; compiling all of them at start took ~0.3 ms of CPU beside the build).
static PROGRAMS: [OnceLock<Result<BpfProgram, String>>; KINDS] = [const { OnceLock::new() }; KINDS];
/// The thread [`enable`] starts to prime glibc beside the VM's start-up; the first
/// [`enter`] waits for it (the others find it gone).
static SETUP: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);
static ENABLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The kind whose filter the current thread installed last (discriminant + 1; 0 none),
    /// read by the SIGSYS handler.
    static KIND: Cell<u8> = const { Cell::new(0) };
}

/// The current thread's kind as set by [`enter`], if any. Async-signal-safe (a
/// const-initialised thread-local without destructor).
fn current_kind() -> Option<ThreadKind> {
    let k = KIND.with(|c| c.get());
    (k > 0).then(|| ThreadKind::ALL[usize::from(k - 1)])
}

/// How the process filters, as set by [`enable`] or [`disable`].
pub fn mode() -> Mode {
    match MODE.load(Ordering::Acquire) {
        1 => Mode::On,
        2 => Mode::Off,
        3 => Mode::Log,
        _ => Mode::Unset,
    }
}

/// What [`enable`] may fail with.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Turns filtering on for this process: installs the SIGSYS handler, and makes [`enter`]
/// install filters from now on (each kind's compiled by the first thread to enter it,
/// ~20 µs). glibc is primed on a thread of its own meanwhile, off the VM's start-up path;
/// the first [`enter`] waits for it. Call it once, before the process starts any thread
/// that calls [`enter`].
pub fn enable(policy: Policy, test_violation: Option<ThreadKind>) -> Result<(), Error> {
    if ENABLED.swap(true, Ordering::AcqRel) {
        return Err(Error("seccomp filtering is already enabled".into()));
    }
    let log_only = policy.log_only;
    let _ = POLICY.set(policy);
    sigsys::install().map_err(|e| Error(format!("installing the SIGSYS handler: {e}")))?;
    fix_malloc_arena_limit();
    // A thread of its own: glibc gives each new thread an arena (until the arena limit),
    // which the priming needs.
    let spawned = std::thread::Builder::new()
        .name("seccomp-setup".into())
        .spawn(prime_heap_shrink_check);
    // Without a thread, no priming either: the VM's own threads will not start.
    if let Ok(handle) = spawned {
        *SETUP.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
    }
    VIOLATION.store(test_violation.map_or(0, |k| k as u8 + 1), Ordering::Release);
    MODE.store(if log_only { 3 } else { 1 }, Ordering::Release);
    Ok(())
}

/// Waits for [`enable`]'s setup thread if it still runs, then returns `kind`'s program,
/// compiling it if no thread of the kind has yet. The lock is held while joining, so a
/// second thread waits too.
fn program(kind: ThreadKind) -> Result<&'static BpfProgram, &'static str> {
    let mut setup = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(handle) = setup.take() {
        let _ = handle.join();
    }
    drop(setup);
    let policy = POLICY.get().ok_or("filtering was not enabled")?;
    PROGRAMS[kind as usize]
        .get_or_init(|| filters::compile(kind, policy))
        .as_ref()
        .map_err(String::as_str)
}

/// glibc computes its malloc arena limit lazily: the thread that first needs a ninth
/// arena reads `/sys/devices/system/cpu/online` (`openat`), and in a filtered thread
/// without `openat` that call kills the process (seen in the nested lab: a Linux VM with
/// its workers, 9p pool and clone reaper passes eight arenas). Setting the limit now, while
/// nothing is filtered, to glibc's own default (8 per CPU on 64-bit) means it is never
/// computed later.
fn fix_malloc_arena_limit() {
    // glibc's own count (sysconf reads /sys/devices/system/cpu/online): unlike
    // available_parallelism, no cgroup files to read.
    // SAFETY: sysconf only reads a system value.
    let cpus = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) })
        .map_or(1, |n| n.max(1));
    let limit = libc::c_int::try_from(cpus.saturating_mul(8)).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only changes a malloc tunable; M_ARENA_MAX takes any positive count.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, limit) };
}

/// glibc decides lazily, the first time it shrinks the heap of a thread arena, whether it
/// may unmap the freed tail: it reads `/proc/sys/vm/overcommit_memory` (`openat`) then
/// and caches the answer for the process. In the nested lab that first shrink came when
/// the API thread dropped a memory tier's compressed store at the VM's end, and the API
/// thread has no `openat` (SIGSYS, exit 159). Shrinking a thread arena's heap once now,
/// while nothing is filtered, makes glibc read the file here. Called on a thread with an
/// arena of its own: four 100 KiB chunks (under the 128 KiB mmap threshold, so in the
/// arena's heap) freed last first merge into the heap's top, and once the top passes the
/// 128 KiB trim threshold the free trims it. The chunks are allocated, not written: glibc
/// touches only their headers, so the heap's growth costs no page fault per page. (Filling
/// them cost ~0.5 ms of the VM's start-up, in the build's memory registration, which ran
/// meanwhile; freeing 512 1 KiB chunks, before that, a page-by-page `mprotect` each.)
fn prime_heap_shrink_check() {
    let chunks: Vec<Vec<u8>> = (0..4)
        .map(|_| std::hint::black_box(Vec::with_capacity(100 << 10)))
        .collect();
    std::hint::black_box(&chunks);
    for c in chunks.into_iter().rev() {
        drop(std::hint::black_box(c));
    }
}

/// Records `--seccomp off`: [`mode`] answers [`Mode::Off`] and [`enter`] stays a no-op.
pub fn disable() {
    MODE.store(2, Ordering::Release);
}

/// Installs `kind`'s filter on the calling thread, if the process enabled filtering;
/// call it first thing in every thread. A failure to install is fatal: the thread would
/// otherwise run unconfined, so the process ends (exit code 1) with a message.
pub fn enter(kind: ThreadKind) {
    if !matches!(mode(), Mode::On | Mode::Log) {
        return;
    }
    let program = match program(kind) {
        Ok(program) => program,
        Err(e) => {
            eprintln!(
                "densevm: seccomp: cannot compile the filter of thread kind {}, so it cannot \
                 run confined: {e}",
                kind.name()
            );
            // SAFETY: _exit ends the process at once; nothing of this thread runs after it.
            unsafe { libc::_exit(1) };
        }
    };
    if let Err(e) = seccompiler::apply_filter(program) {
        eprintln!(
            "densevm: seccomp: cannot install the filter of thread kind {}: {e}",
            kind.name()
        );
        // SAFETY: _exit ends the process at once; nothing of this thread runs after it.
        unsafe { libc::_exit(1) };
    }
    KIND.with(|c| c.set(kind as u8 + 1));
    if VIOLATION.load(Ordering::Acquire) == kind as u8 + 1 {
        violate();
    }
}

/// The test hook (`--seccomp-test-violation KIND`): a call no kind may make, an IPv4
/// socket. The SIGSYS handler ends the process before it returns.
fn violate() {
    eprintln!("densevm: seccomp test: making a forbidden call (socket(AF_INET))");
    // SAFETY: socket takes no pointers; a descriptor it might return is closed at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if fd >= 0 {
        // SAFETY: `fd` was just returned to us and nothing else owns it.
        unsafe { libc::close(fd) };
    }
}

/// The name of x86_64 system call `nr`, if it has one.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    usize::try_from(nr)
        .ok()
        .and_then(|i| names::NAMES.get(i))
        .copied()
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests;
