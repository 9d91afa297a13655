//! The SIGSYS handler: a denied call (`SECCOMP_RET_TRAP`) lands here on the thread that
//! made it. It writes one line to stderr and ends the process with
//! [`EXIT_CODE`](crate::EXIT_CODE), using only async-signal-safe calls (`write`,
//! `_exit`) and no allocation: the message is assembled in a stack buffer.

use std::io;

/// Offset of `si_syscall` in `siginfo_t` for SIGSYS on x86_64: `si_signo`, `si_errno`,
/// `si_code` and padding (16 bytes), then `_sigsys { void *_call_addr; int _syscall;
/// unsigned _arch; }`.
const SI_SYSCALL_OFFSET: usize = 24;

/// A fixed-size line buffer that silently truncates.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn push(&mut self, s: &[u8]) {
        for &b in s {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    fn push_num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

/// The message for system call `nr` denied on a thread of kind `kind` named `thread`.
fn message(kind: Option<crate::ThreadKind>, thread: &[u8], nr: i64) -> Line {
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    line.push(b"densevm: seccomp: thread kind ");
    // A thread that never called `enter` runs under the filter it inherited.
    line.push(
        kind.map_or("none (inherited filter)", |k| k.name())
            .as_bytes(),
    );
    line.push(b" made a forbidden system call: ");
    match crate::syscall_name(nr) {
        Some(name) => line.push(name.as_bytes()),
        None => line.push(b"unknown"),
    }
    line.push(b" (");
    line.push_num(nr as u64);
    line.push(b"); exiting with code ");
    line.push_num(crate::EXIT_CODE as u64);
    line.push(b" (docs/security.md; thread '");
    line.push(thread);
    line.push(b"')\n");
    line
}

extern "C" fn handle(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler; for SIGSYS the
    // i32 at SI_SYSCALL_OFFSET is `si_syscall` (see the constant). read_unaligned copes
    // with any alignment.
    let nr = unsafe {
        std::ptr::read_unaligned((info as *const u8).add(SI_SYSCALL_OFFSET) as *const i32)
    };
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into `name`; prctl is
    // async-signal-safe and PR_GET_NAME is allowed by every filter.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let line = message(crate::current_kind(), &name[..len], i64::from(nr));
    // SAFETY: write and _exit are async-signal-safe and allowed by every filter; the
    // buffer is valid for `len` bytes. Nothing runs after _exit.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(crate::EXIT_CODE);
    }
}

/// Installs the handler for SIGSYS (process-wide).
pub fn install() -> io::Result<()> {
    // SAFETY: a zeroed sigaction is valid; the fields used are set below.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handle as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO;
    // SAFETY: sa_mask is a valid sigset_t owned by `act`.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    // SAFETY: `act` is fully initialised; the old action is not asked for.
    if unsafe { libc::sigaction(libc::SIGSYS, &act, std::ptr::null_mut()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn message_names_kind_and_call() {
        let line = super::message(Some(crate::ThreadKind::Vcpu), b"vcpu", 41);
        let text = std::str::from_utf8(&line.buf[..line.len]).unwrap();
        assert_eq!(
            text,
            "densevm: seccomp: thread kind vcpu made a forbidden system call: socket (41); exiting with code 159 (docs/security.md; thread 'vcpu')\n"
        );
        let line = super::message(None, b"x", 9999);
        let text = std::str::from_utf8(&line.buf[..line.len]).unwrap();
        assert!(
            text.contains("none (inherited filter) made a forbidden system call: unknown (9999)")
        );
    }
}
