//! A VM's create request: its checks and the `densevm run` arguments it becomes.

use std::path::Path;

use densevm_api::request::ApiErrorResponse;

use crate::types::VmCreate;

/// The vsock device's host socket, in the VM's directory.
pub const VSOCK_SOCKET: &str = "vsock.sock";

/// The smallest DRAM budget densevm takes (docs/tiering.md).
pub const MIN_BUDGET_MIB: u64 = 4;

pub(crate) fn bad(msg: impl Into<String>) -> ApiErrorResponse {
    ApiErrorResponse::bad_request(msg)
}

/// Whether `id` may name a VM: 1–64 of letters, digits, `.`, `_`, `-`, not starting with `.`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The `densevm run` arguments for a VM (sockets and id included).
pub fn run_args(spec: &VmCreate, id: &str, dir: &Path) -> Vec<String> {
    let mut a = Vec::new();
    let mut push = |k: &str, v: &str| {
        a.push(k.to_owned());
        a.push(v.to_owned());
    };
    if let Some(b) = spec.memory_budget_mib {
        push("--memory-budget", &format!("{b}M"));
    }
    if let Some(r) = &spec.restore {
        push("--restore", r);
        for o in &spec.network_overrides {
            push(
                "--net-override",
                &format!("{}={}", o.iface_id, o.host_dev_name),
            );
        }
    } else {
        push("--memory", &format!("{}M", spec.memory_mib));
        push("--cpus", &spec.vcpus.unwrap_or(1).to_string());
        if let Some(k) = &spec.kernel {
            push("--kernel", k);
        }
        if let Some(i) = &spec.initrd {
            push("--initrd", i);
        }
        if let Some(c) = &spec.cmdline {
            push("--cmdline", c);
        }
        if let Some(p) = &spec.probe {
            push("--probe", p);
        }
        for d in &spec.disks {
            push("--disk", d);
        }
        for s in &spec.shares {
            push("--share", s);
        }
        for n in &spec.nets {
            push("--net", n);
        }
        if let Some(cid) = spec.vsock_cid {
            push(
                "--vsock",
                &format!("cid={cid},uds={}", dir.join(VSOCK_SOCKET).display()),
            );
        }
        if spec.kernel.is_some() {
            // The balloon the policy drives: statistics every tick, freed pages back to
            // the host, and the guest may deflate rather than OOM-kill. It starts empty;
            // a max under the RAM is sent as the first target once the VM answers.
            push(
                "--balloon",
                "amount_mib=0,deflate_on_oom,stats_interval_s=1,free_page_reporting=on",
            );
        }
    }
    push("--api-sock", &dir.join("api.sock").display().to_string());
    push(
        "--console-sock",
        &dir.join("console.sock").display().to_string(),
    );
    push("--id", id);
    if spec.rng && spec.restore.is_none() {
        a.push("--rng".into());
    }
    a
}

/// Checks `network_overrides`: only with a restore, each `netN` once, a tap name the
/// kernel would take (1–15 bytes, no `/`, `=`, `,`, blank or NUL).
fn check_overrides(spec: &VmCreate) -> Result<(), ApiErrorResponse> {
    if spec.network_overrides.is_empty() {
        return Ok(());
    }
    if spec.restore.is_none() {
        return Err(bad(
            "network_overrides go with restore (a booted VM names its taps in nets)",
        ));
    }
    let mut seen = Vec::new();
    for o in &spec.network_overrides {
        let index = o
            .iface_id
            .strip_prefix("net")
            .and_then(|n| n.parse::<u32>().ok());
        if index.is_none() || seen.contains(&o.iface_id) {
            return Err(bad(format!(
                "network_overrides: iface_id {:?} must be net0 for the snapshot's first net, net1 for the second, ..., each once",
                o.iface_id
            )));
        }
        seen.push(o.iface_id.clone());
        let tap = &o.host_dev_name;
        let ok = !tap.is_empty()
            && tap.len() < 16
            && !tap
                .bytes()
                .any(|b| b.is_ascii_whitespace() || matches!(b, b'/' | b'=' | b',' | 0));
        if !ok {
            return Err(bad(format!(
                "network_overrides: host_dev_name {tap:?} is not a tap name (1-15 bytes, no '/', '=', ',' or blanks)"
            )));
        }
    }
    Ok(())
}

/// Checks a create request: what to run, sizes and bounds. Returns (min, max).
pub(crate) fn check_create(spec: &VmCreate) -> Result<(u64, u64), ApiErrorResponse> {
    let sources = [&spec.kernel, &spec.probe, &spec.restore]
        .iter()
        .filter(|s| s.is_some())
        .count();
    if sources != 1 {
        return Err(bad(
            "give exactly one of kernel (a Linux guest), probe (the probe guest's script) or \
             restore (a snapshot directory)",
        ));
    }
    if spec.kernel.is_none() && (spec.initrd.is_some() || spec.cmdline.is_some()) {
        return Err(bad("initrd and cmdline go with kernel"));
    }
    let devices = !spec.disks.is_empty()
        || !spec.shares.is_empty()
        || !spec.nets.is_empty()
        || spec.rng
        || spec.vsock_cid.is_some();
    if spec.kernel.is_none() && devices {
        return Err(bad(
            "disks, shares, nets, rng and vsock_cid are devices of a Linux guest (kernel); a \
             restored VM reopens the devices its snapshot names",
        ));
    }
    if spec.vsock_cid.is_some_and(|c| !(3..u32::MAX).contains(&c)) {
        return Err(bad(
            "vsock_cid must be 3 or more (0-2 are reserved) and below 4294967295",
        ));
    }
    if spec.memory_mib == 0 || spec.memory_mib > 1 << 20 {
        return Err(bad(format!(
            "memory_mib {} is out of range: 1 to 1048576 (for a restore, the snapshot's RAM)",
            spec.memory_mib
        )));
    }
    if spec.vcpus.is_some_and(|n| n == 0 || n > 254) {
        return Err(bad("vcpus must be 1 to 254"));
    }
    check_overrides(spec)?;
    let strings = [
        &spec.kernel,
        &spec.initrd,
        &spec.cmdline,
        &spec.probe,
        &spec.restore,
    ];
    let all = strings
        .into_iter()
        .flatten()
        .chain(&spec.disks)
        .chain(&spec.shares)
        .chain(&spec.nets);
    if all.clone().any(|s| s.contains('\0')) {
        return Err(bad("strings may not contain NUL bytes"));
    }
    if let Some(b) = spec.memory_budget_mib {
        // (a restored VM with a budget gets RAM of its own, filled from the snapshot)
        check_budget(spec.memory_mib, b)?;
    }
    let max = spec.max_mib.unwrap_or(spec.memory_mib);
    let min = spec
        .min_mib
        .unwrap_or((spec.memory_mib / 4).max(1).min(max));
    check_bounds(spec.memory_mib, min, max)?;
    Ok((min, max))
}

pub(crate) fn check_budget(memory: u64, budget: u64) -> Result<(), ApiErrorResponse> {
    if !(MIN_BUDGET_MIB..=memory).contains(&budget) {
        return Err(bad(format!(
            "memory_budget_mib {budget} is out of range: {MIN_BUDGET_MIB} to the VM's memory \
             ({memory} MiB)"
        )));
    }
    Ok(())
}

pub(crate) fn check_bounds(memory: u64, min: u64, max: u64) -> Result<(), ApiErrorResponse> {
    if max > memory {
        return Err(bad(format!(
            "max_mib {max} is above the VM's memory ({memory} MiB): a balloon can only take \
             memory away"
        )));
    }
    if min > max {
        return Err(bad(format!("min_mib {min} is above max_mib {max}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux VMs get the balloon the policy drives; probe VMs (no PCI) and restored ones
    /// (their balloon comes from the snapshot) get no --balloon.
    #[test]
    fn linux_vms_get_a_balloon() {
        let dir = Path::new("/state/vms/a");
        let linux = VmCreate {
            kernel: Some("/k".into()),
            memory_mib: 256,
            ..Default::default()
        };
        let args = run_args(&linux, "a", dir);
        let at = args
            .iter()
            .position(|a| a == "--balloon")
            .expect("--balloon");
        assert_eq!(
            args[at + 1],
            "amount_mib=0,deflate_on_oom,stats_interval_s=1,free_page_reporting=on"
        );
        for other in [
            VmCreate {
                probe: Some("exit 0".into()),
                memory_mib: 64,
                ..Default::default()
            },
            VmCreate {
                restore: Some("/snap".into()),
                memory_mib: 256,
                ..Default::default()
            },
        ] {
            assert!(!run_args(&other, "a", dir).contains(&"--balloon".to_string()));
        }
    }

    /// Nets and a vsock device pass through to `densevm run` for Linux guests, the vsock
    /// socket in the VM's directory; bad CIDs and devices without a kernel are refused.
    #[test]
    fn nets_and_vsock_become_run_arguments() {
        let dir = Path::new("/state/vms/a");
        let spec = VmCreate {
            kernel: Some("/k".into()),
            memory_mib: 256,
            nets: vec!["tap=tap0,mac=02:00:00:00:00:01".into()],
            vsock_cid: Some(3),
            ..Default::default()
        };
        check_create(&spec).unwrap();
        let args = run_args(&spec, "a", dir);
        let after = |k: &str| args[args.iter().position(|a| a == k).unwrap() + 1].clone();
        assert_eq!(after("--net"), "tap=tap0,mac=02:00:00:00:00:01");
        assert_eq!(after("--vsock"), "cid=3,uds=/state/vms/a/vsock.sock");
        for cid in [0, 2, u32::MAX] {
            let bad = VmCreate {
                vsock_cid: Some(cid),
                ..spec.clone()
            };
            assert_eq!(check_create(&bad).unwrap_err().status, 400, "cid {cid}");
        }
        let probe = VmCreate {
            kernel: None,
            probe: Some("exit 0".into()),
            ..spec
        };
        let e = check_create(&probe).unwrap_err();
        assert!(e.message.contains("vsock_cid"), "{}", e.message);
    }

    /// A budget becomes `--memory-budget NM` for Linux, probe and restored VMs; a budget
    /// out of range is refused before anything starts.
    #[test]
    fn a_budget_is_passed_to_densevm_run_and_checked() {
        let dir = Path::new("/state/vms/a");
        for spec in [
            VmCreate {
                kernel: Some("/k".into()),
                memory_mib: 256,
                memory_budget_mib: Some(64),
                ..Default::default()
            },
            VmCreate {
                probe: Some("exit 0".into()),
                memory_mib: 64,
                memory_budget_mib: Some(64),
                ..Default::default()
            },
        ] {
            check_create(&spec).unwrap();
            let args = run_args(&spec, "a", dir);
            let at = args.iter().position(|a| a == "--memory-budget").unwrap();
            assert_eq!(
                args[at + 1],
                format!("{}M", spec.memory_budget_mib.unwrap())
            );
        }
        let restore = VmCreate {
            restore: Some("/snap".into()),
            memory_mib: 256,
            memory_budget_mib: Some(64),
            ..Default::default()
        };
        check_create(&restore).unwrap();
        let args = run_args(&restore, "a", dir);
        let at = args.iter().position(|a| a == "--memory-budget").unwrap();
        assert_eq!(args[at + 1], "64M");
        assert!(args.iter().any(|a| a == "--restore"), "{args:?}");
        for b in [0, 3, 257] {
            let spec = VmCreate {
                memory_budget_mib: Some(b),
                ..restore.clone()
            };
            assert_eq!(check_create(&spec).unwrap_err().status, 400, "budget {b}");
            let spec = VmCreate {
                restore: None,
                kernel: Some("/k".into()),
                ..spec
            };
            assert_eq!(check_create(&spec).unwrap_err().status, 400, "budget {b}");
        }
    }

    fn over(iface: &str, tap: &str) -> densevm_api::types::NetworkOverride {
        densevm_api::types::NetworkOverride {
            iface_id: iface.into(),
            host_dev_name: tap.into(),
        }
    }

    /// A restore's network overrides become `--net-override IFACE=TAP`; without a restore,
    /// with a bad interface, a repeated one or a bad tap name they are refused.
    #[test]
    fn network_overrides_go_with_a_restore_and_are_checked() {
        let spec = VmCreate {
            restore: Some("/snap".into()),
            memory_mib: 256,
            network_overrides: vec![over("net0", "tap7"), over("net1", "tap8")],
            ..Default::default()
        };
        check_create(&spec).unwrap();
        let args = run_args(&spec, "a", Path::new("/state/vms/a"));
        let got: Vec<&str> = args
            .windows(2)
            .filter(|w| w[0] == "--net-override")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(got, ["net0=tap7", "net1=tap8"]);
        let booted = VmCreate {
            restore: None,
            kernel: Some("/k".into()),
            ..spec.clone()
        };
        let e = check_create(&booted).unwrap_err();
        assert!(e.message.contains("go with restore"), "{}", e.message);
        for (bad, says) in [
            (vec![over("eth0", "tap1")], "iface_id"),
            (
                vec![over("net0", "tap1"), over("net0", "tap2")],
                "each once",
            ),
            (vec![over("net0", "")], "host_dev_name"),
            (vec![over("net0", "a/b")], "host_dev_name"),
            (vec![over("net0", "tap=1")], "host_dev_name"),
            (vec![over("net0", "sixteen-bytes-xx")], "host_dev_name"),
        ] {
            let spec = VmCreate {
                network_overrides: bad.clone(),
                ..spec.clone()
            };
            let e = check_create(&spec).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(says), "{bad:?}: {}", e.message);
        }
    }
}
