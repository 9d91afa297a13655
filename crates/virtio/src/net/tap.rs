//! A tap device opened through `/dev/net/tun`: Ethernet frames, each preceded by a
//! virtio-net header (`IFF_VNET_HDR`, set to the 12-byte virtio 1.x header), read and
//! written without blocking.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use thiserror::Error;

/// Bytes of an interface name, with its terminating NUL (`IFNAMSIZ`).
const IFNAMSIZ: usize = 16;

/// `struct ifreq` as TUNSETIFF reads it: the name and the flags (the rest of the 40-byte
/// union is unused).
#[repr(C)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// Why a tap cannot be used.
#[derive(Debug, Error)]
pub enum TapError {
    /// The name cannot be an interface name.
    #[error("'{0}' is not a valid interface name (1 to 15 bytes, no '/', spaces or NUL)")]
    InvalidName(String),
    /// No interface of that name.
    #[error(
        "there is no network interface '{0}': create the tap first, e.g. \
         `ip tuntap add {0} mode tap && ip addr add 192.168.100.1/24 dev {0} && ip link set {0} up`"
    )]
    NoSuchTap(String),
    /// The interface exists but is not a tap.
    #[error(
        "network interface '{0}' is not a tun/tap device; give a tap made with \
         `ip tuntap add NAME mode tap`"
    )]
    NotATap(String),
    /// `/dev/net/tun` is missing.
    #[error("cannot open /dev/net/tun ({0}): load the tun module (`modprobe tun`)")]
    NoTunDevice(io::Error),
    /// Not allowed to attach.
    #[error(
        "no permission to use tap '{name}' ({source}): run densevm as root or with \
         CAP_NET_ADMIN, or create the tap for your user: `ip tuntap add {name} mode tap user $USER`"
    )]
    Permission {
        /// Tap name.
        name: String,
        /// What failed.
        source: io::Error,
    },
    /// Another process holds it.
    #[error(
        "tap '{0}' is in use by another process (a tap serves one VM): give this VM its own tap"
    )]
    Busy(String),
    /// Any other failure.
    #[error("cannot set up tap '{name}': {op}: {source}")]
    Setup {
        /// Tap name.
        name: String,
        /// The step that failed.
        op: &'static str,
        /// What failed.
        source: io::Error,
    },
}

/// An open tap, nonblocking, with virtio-net headers on every frame.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
    /// A real tap (offload ioctls apply); false for a datagram socket standing in for one
    /// in tests.
    is_tap: bool,
}

/// Checks an interface name.
fn check_name(name: &str) -> Result<(), TapError> {
    let ok = !name.is_empty()
        && name.len() < IFNAMSIZ
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == 0 || b == b'/' || b == b':' || b.is_ascii_whitespace());
    if ok {
        Ok(())
    } else {
        Err(TapError::InvalidName(name.to_string()))
    }
}

/// Runs a TUN ioctl that takes a pointer to `arg`.
fn ioctl_ptr<T>(fd: &OwnedFd, req: libc::Ioctl, arg: &mut T) -> io::Result<()> {
    // SAFETY: `fd` is an open descriptor; every request passed here (TUNSETIFF,
    // TUNSETVNETHDRSZ, TUNSETOFFLOAD) reads at most `size_of::<T>()` bytes from `arg`, which
    // is a valid, exclusively borrowed value for the duration of the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg as *mut T) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Tap {
    /// Opens the existing tap `name` (never creates one: a VM on a tap nobody configured
    /// would have a network that goes nowhere).
    pub fn open(name: &str) -> Result<Self, TapError> {
        check_name(name)?;
        let sys = Path::new("/sys/class/net").join(name);
        if !sys.exists() {
            return Err(TapError::NoSuchTap(name.to_string()));
        }
        if !sys.join("tun_flags").exists() {
            return Err(TapError::NotATap(name.to_string()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| match e.kind() {
                io::ErrorKind::PermissionDenied => TapError::Permission {
                    name: name.to_string(),
                    source: e,
                },
                _ => TapError::NoTunDevice(e),
            })?;
        let fd = OwnedFd::from(file);
        let mut req = IfReq {
            name: [0; IFNAMSIZ],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
            _rest: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        ioctl_ptr(&fd, libc::TUNSETIFF, &mut req).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => TapError::Permission {
                name: name.to_string(),
                source: e,
            },
            Some(libc::EBUSY) => TapError::Busy(name.to_string()),
            Some(libc::EINVAL) => TapError::Setup {
                name: name.to_string(),
                op: "TUNSETIFF (a tun device, or a multi-queue tap, is not supported)",
                source: e,
            },
            _ => TapError::Setup {
                name: name.to_string(),
                op: "TUNSETIFF",
                source: e,
            },
        })?;
        let mut hdr_len = super::HDR_LEN as libc::c_int;
        ioctl_ptr(&fd, libc::TUNSETVNETHDRSZ, &mut hdr_len).map_err(|source| TapError::Setup {
            name: name.to_string(),
            op: "TUNSETVNETHDRSZ",
            source,
        })?;
        let tap = Tap {
            fd,
            name: name.to_string(),
            is_tap: true,
        };
        tap.set_offload(0).map_err(|source| TapError::Setup {
            name: name.to_string(),
            op: "TUNSETOFFLOAD",
            source,
        })?;
        Ok(tap)
    }

    /// A nonblocking datagram socket standing in for a tap (tests): each datagram is one
    /// frame with its header; offloads are not applied.
    pub fn from_socket(fd: OwnedFd, name: &str) -> Self {
        Tap {
            fd,
            name: name.to_string(),
            is_tap: false,
        }
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tells the tap which offloads the guest takes on receive (`TUN_F_*`): the kernel then
    /// hands over frames with partial checksums or GSO only as these allow.
    pub fn set_offload(&self, flags: u32) -> io::Result<()> {
        if !self.is_tap {
            return Ok(());
        }
        // TUNSETOFFLOAD takes the flags by value, not through a pointer.
        // SAFETY: `fd` is an open tap; TUNSETOFFLOAD reads no memory (its argument is the
        // flag word itself).
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(flags),
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Reads one frame (header first) into `buf`; `WouldBlock` when none is waiting.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid and writable for `buf.len()` bytes during the call.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Writes one frame (header first).
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid and readable for `buf.len()` bytes during the call.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for bad in ["", "a/b", "with space", "0123456789abcdef", "..", "x:1"] {
            assert!(
                matches!(check_name(bad), Err(TapError::InvalidName(_))),
                "{bad}"
            );
        }
        check_name("tap0").unwrap();
    }

    #[test]
    fn a_missing_tap_says_how_to_create_it() {
        let e = Tap::open("dvmnosuchtap9").unwrap_err();
        assert!(matches!(e, TapError::NoSuchTap(_)), "{e}");
        assert!(
            e.to_string()
                .contains("ip tuntap add dvmnosuchtap9 mode tap"),
            "{e}"
        );
    }

    #[test]
    fn an_interface_that_is_not_a_tap_is_refused() {
        let e = Tap::open("lo").unwrap_err();
        assert!(matches!(e, TapError::NotATap(_)), "{e}");
    }
}
