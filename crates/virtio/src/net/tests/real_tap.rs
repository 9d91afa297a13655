//! A real tap (needs root or CAP_NET_ADMIN and /dev/net/tun; fails, never skips, when
//! they are missing).

use super::*;
use std::process::Command;

/// A persistent tap created for one test and deleted at its end.
struct TestTap(String);

fn tun_ifreq(name: &str) -> [u8; 40] {
    let mut req = [0u8; 40];
    req[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
    req[16..18].copy_from_slice(&flags.to_ne_bytes());
    req
}

impl TestTap {
    fn create(tag: &str) -> Self {
        let name = format!("dvm{tag}{}", std::process::id() % 100_000);
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .unwrap_or_else(|e| {
                panic!("this test needs /dev/net/tun ({e}): run it as root with the tun module loaded (modprobe tun)")
            });
        let mut req = tun_ifreq(&name);
        // SAFETY: `tun` is open; TUNSETIFF reads and writes the 40-byte ifreq `req`.
        let r = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, req.as_mut_ptr()) };
        assert_eq!(
            r,
            0,
            "TUNSETIFF {name}: {} (this test needs root or CAP_NET_ADMIN)",
            std::io::Error::last_os_error()
        );
        // SAFETY: `tun` is an attached tap; TUNSETPERSIST takes its flag by value.
        let r = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) };
        assert_eq!(r, 0, "TUNSETPERSIST: {}", std::io::Error::last_os_error());
        TestTap(name)
    }

    fn delete(&self) {
        let out = Command::new("ip")
            .args(["link", "del", &self.0])
            .output()
            .expect("this test needs iproute2's `ip` to delete its tap (apt-get install iproute2)");
        assert!(out.status.success(), "ip link del {}: {:?}", self.0, out);
    }
}

impl Drop for TestTap {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

#[test]
fn a_real_tap_opens_takes_offloads_and_serves_one_vm() {
    let t = TestTap::create("a");
    let tap = Tap::open(&t.0).unwrap();
    assert_eq!(tap.name(), t.0);
    tap.set_offload(tap_offloads(net_features::OFFERED))
        .unwrap();
    let e = Tap::open(&t.0).unwrap_err();
    assert!(matches!(e, tap::TapError::Busy(_)), "{e}");
    assert!(e.to_string().contains("its own tap"), "{e}");
    // Nothing to read on a tap that is down.
    let mut buf = [0u8; 100];
    assert_eq!(
        tap.read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    drop(tap);
    // Free again once closed.
    Tap::open(&t.0).unwrap();
}

#[test]
fn a_tap_deleted_under_the_device_is_survived_link_down() {
    let t = TestTap::create("b");
    let mem = guest_memory(MEM);
    let rxq = MockQueue::new(mem.clone(), RX_BASE, QUEUE_SIZE);
    let mut txq = MockQueue::new(mem.clone(), TX_BASE, QUEUE_SIZE);
    let mut net = Net::new(Tap::open(&t.0).unwrap(), [6, 0, 0, 0, 0, 1]);
    net.ack_features(features::COMMON | net_features::OFFERED);
    let irq = Arc::new(RecordingInterrupt::default());
    let tx_dq = txq.device_queue();
    let tx_notify = tx_dq.event.try_clone().unwrap();
    net.activate(mem.clone(), irq.clone(), vec![rxq.device_queue(), tx_dq])
        .unwrap();
    let shared = net.shared();
    t.delete();
    tx_chain(&mut txq, &frame(60, 1));
    tx_notify.write(1).unwrap();
    let t0 = Instant::now();
    while txq.used().is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(txq.used().len(), 1, "the chain is completed");
    let t0 = Instant::now();
    while irq.config.load(std::sync::atomic::Ordering::SeqCst) == 0
        && t0.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(NetStats::get(&shared.stats.tap_errors) >= 1);
    assert_eq!(NetStats::get(&shared.stats.tx_packets), 0);
    let mut cfg = [0u8; 2];
    net.read_config(6, &mut cfg);
    assert_eq!(cfg, [0, 0], "link down");
    assert_eq!(irq.config.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Later frames are dropped without touching the dead tap.
    tx_chain(&mut txq, &frame(60, 2));
    tx_notify.write(1).unwrap();
    let t0 = Instant::now();
    while txq.used().len() < 2 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(txq.used().len(), 2);
    net.reset();
}
