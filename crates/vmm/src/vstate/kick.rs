//! Kicking vCPU threads out of `KVM_RUN`: a real-time signal whose handler sets the
//! thread's `kvm_run.immediate_exit`, so a kick is never lost even if it lands just
//! before the thread enters the guest.

use std::cell::Cell;
use std::sync::Once;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal used to kick vCPU threads.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

extern "C" fn handle_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let ptr = IMMEDIATE_EXIT.with(|p| p.get());
    if !ptr.is_null() {
        // SAFETY: the pointer was set by this thread to its own vCPU's kvm_run page,
        // which stays mapped until the thread clears it in `unbind` before dropping the vCPU.
        unsafe { std::ptr::write_volatile(ptr, 1) };
    }
}

/// Installs the kick handler once per process.
pub fn install() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_signal_handler(kick_signal(), handle_kick)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()));
    });
    result
}

/// Binds the calling thread to its vCPU's `immediate_exit` byte.
pub fn bind(immediate_exit: *mut u8) {
    IMMEDIATE_EXIT.with(|p| p.set(immediate_exit));
}

/// Unbinds the calling thread (before its vCPU is dropped).
pub fn unbind() {
    IMMEDIATE_EXIT.with(|p| p.set(std::ptr::null_mut()));
}

/// Sends the kick signal to a thread.
pub fn kick(thread: libc::pthread_t) {
    // SAFETY: pthread_kill only sends a signal; a thread that has exited but is not yet
    // joined still has a valid pthread_t (the caller joins after kicking).
    unsafe { libc::pthread_kill(thread, kick_signal()) };
}
