//! DRAM budgets through the fleet, with the fake launcher (no /dev/kvm): a budget at
//! creation becomes `--memory-budget`, `PATCH` forwards it to the VM, a tick reads the
//! tier's counters into `GET /vms/{id}` and the metrics, and the policy lowers a budget
//! when the host runs low and raises it back when it has room.

mod common;

use common::TestFleet;
use densevm_api::{ClientError, MemoryTierInfo};
use densevm_fleet::metrics::parse::{parse, Series};
use densevm_fleet::types::{VmCreate, VmPatch};

fn probe(id: &str, memory_mib: u64, budget: Option<u64>) -> VmCreate {
    VmCreate {
        id: Some(id.into()),
        probe: Some("sleep 100000; exit 0".into()),
        memory_mib,
        memory_budget_mib: budget,
        ..Default::default()
    }
}

fn api_err<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Api { status, message }) => (status, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn budget(mib: u64) -> VmPatch {
    VmPatch {
        memory_budget_mib: Some(mib),
        ..Default::default()
    }
}

fn value(m: &Series, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    *m.get(&(name.to_string(), l))
        .unwrap_or_else(|| panic!("no {name}{labels:?} in {m:?}"))
}

/// The tier of a VM holding `resident_mib` in DRAM under `budget_mib`.
fn tier(budget_mib: u64, resident_mib: u64) -> MemoryTierInfo {
    MemoryTierInfo {
        budget_mib,
        resident_kib: resident_mib << 10,
        compressed_pages: 100,
        compressed_kib: 200,
        swap_pages: 1000,
        evicted_zero: 1,
        evicted_compressed: 2,
        evicted_swap: 3,
        missing_faults: 42,
        minor_faults: 7,
        service_cpu_us: 1_500_000,
        ..Default::default()
    }
}

#[test]
fn a_budget_is_set_at_creation_or_restore_changed_by_patch_and_checked() {
    let t = TestFleet::new(false);
    let vm = t.client.create(&probe("p", 64, Some(32))).unwrap();
    assert_eq!(
        (vm.memory_budget_mib, vm.memory_budget_user_mib),
        (Some(32), Some(32))
    );
    let args = t.fake("p").plan_args;
    let at = args.iter().position(|a| a == "--memory-budget").unwrap();
    assert_eq!(args[at + 1], "32M");

    // A restore gets its budget too (RAM of its own, read from the snapshot); a budget
    // may not be under 4 MiB or over the RAM.
    let restore = VmCreate {
        id: Some("r".into()),
        restore: Some("/snap".into()),
        memory_mib: 64,
        memory_budget_mib: Some(32),
        ..Default::default()
    };
    let vm = t.client.create(&restore).unwrap();
    assert_eq!(vm.memory_budget_mib, Some(32));
    let args = t.fake("r").plan_args;
    let at = args.iter().position(|a| a == "--memory-budget").unwrap();
    assert_eq!(args[at + 1], "32M");
    assert!(args.iter().any(|a| a == "--restore"), "{args:?}");
    for b in [3, 65] {
        let (status, msg) = api_err(t.client.create(&probe("q", 64, Some(b))));
        assert_eq!(status, 400, "{b}");
        assert!(msg.contains("4 to the VM's memory (64 MiB)"), "{msg}");
    }

    t.with_fake("p", |v| v.tier = Some(tier(32, 30)));
    let vm = t.client.patch("p", &budget(16)).unwrap();
    assert_eq!(t.fake("p").budget_sets, [16]);
    assert_eq!(
        (vm.memory_budget_mib, vm.memory_budget_user_mib),
        (Some(16), Some(16))
    );
    let (status, _) = api_err(t.client.patch("p", &budget(2)));
    assert_eq!(status, 400);
    assert_eq!(t.fake("p").budget_sets, [16], "nothing sent");

    // A VM started without a budget has no tier to change.
    t.client.create(&probe("plain", 64, None)).unwrap();
    let (status, msg) = api_err(t.client.patch("plain", &budget(16)));
    assert_eq!(status, 409);
    assert!(msg.contains("memory_budget_mib in POST /vms"), "{msg}");
    // A VM that refuses: the answer says why.
    t.with_fake("p", |v| v.tier = None);
    let (status, msg) = api_err(t.client.patch("p", &budget(20)));
    assert_eq!(status, 409);
    assert!(msg.contains("no memory tier"), "{msg}");
}

#[test]
fn a_tick_reads_the_tier_into_the_vm_and_the_metrics() {
    let t = TestFleet::new(false);
    t.client.create(&probe("p", 64, Some(16))).unwrap();
    t.client.create(&probe("plain", 64, None)).unwrap();
    t.with_fake("p", |v| v.tier = Some(tier(16, 15)));
    // Between the watermarks: no action, only measurements.
    t.set_host(4096, 600);
    t.fleet.tick();
    let vm = t.client.get("p").unwrap();
    let tm = vm.tier.unwrap();
    assert_eq!(tm.resident_kib, 15 << 10);
    assert_eq!(
        (tm.swap_pages, tm.missing_faults, tm.evicted),
        (1000, 42, 6)
    );
    assert!(vm.tier_error.is_none());
    assert!(t.client.get("plain").unwrap().tier.is_none());

    let text = t.client.metrics().unwrap();
    let m = parse(&text);
    let l = [("vm", "p"), ("priority", "normal")];
    assert_eq!(
        value(&m, "densevm_fleet_vm_memory_budget_bytes", &l),
        (16u64 << 20) as f64
    );
    assert_eq!(
        value(&m, "densevm_fleet_vm_tier_resident_bytes", &l),
        (15u64 << 20) as f64
    );
    assert_eq!(
        value(&m, "densevm_fleet_vm_tier_swap_bytes", &l),
        (1000u64 << 12) as f64
    );
    assert_eq!(
        value(&m, "densevm_fleet_vm_tier_missing_faults_total", &l),
        42.0
    );
    assert_eq!(value(&m, "densevm_fleet_vm_tier_evictions_total", &l), 6.0);
    assert_eq!(
        value(&m, "densevm_fleet_vm_tier_service_cpu_seconds_total", &l),
        1.5
    );
    assert!(text.contains("# TYPE densevm_fleet_vm_tier_missing_faults_total counter"));
    assert!(!text.contains("densevm_fleet_vm_memory_budget_bytes{vm=\"plain\""));
    assert_eq!(
        value(
            &m,
            "densevm_fleet_policy_budget_actions_total",
            &[("direction", "lower"), ("reason", "host_low_memory")]
        ),
        0.0
    );

    // A tier that cannot be read is shown as such.
    t.with_fake("p", |v| v.tier = None);
    t.fleet.tick();
    let vm = t.client.get("p").unwrap();
    assert!(vm.tier_error.unwrap().contains("no memory tier"));
}

#[test]
fn the_policy_lowers_a_budget_when_the_host_is_low_and_raises_it_back_with_room() {
    let t = TestFleet::new(false);
    t.client.create(&probe("p", 1024, Some(1024))).unwrap();
    t.with_fake("p", |v| v.tier = Some(tier(1024, 1000)));
    // Under the low watermark (400 MiB): the probe VM has no balloon, its budget gives.
    t.set_host(4096, 300);
    t.fleet.tick();
    // It holds 1000 MiB resident + 200 KiB compressed: 1001 MiB; one step (64) less.
    assert_eq!(t.fake("p").budget_sets, [1001 - 64]);
    let vm = t.client.get("p").unwrap();
    assert_eq!(
        (vm.memory_budget_mib, vm.memory_budget_user_mib),
        (Some(937), Some(1024))
    );
    let m = parse(&t.client.metrics().unwrap());
    assert_eq!(
        value(
            &m,
            "densevm_fleet_policy_budget_actions_total",
            &[("direction", "lower"), ("reason", "host_low_memory")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "densevm_fleet_vm_memory_budget_user_bytes",
            &[("vm", "p"), ("priority", "normal")]
        ),
        (1024u64 << 20) as f64
    );
    // The tier has not got down to its budget yet: not lowered again.
    t.fleet.tick();
    assert_eq!(t.fake("p").budget_sets.len(), 1);

    // Room over the high watermark (800): raised back after the cooldown, to the user's.
    t.with_fake("p", |v| v.tier = Some(tier(937, 930)));
    t.set_host(4096, 2000);
    for _ in 0..30 {
        t.fleet.tick();
    }
    let sets = t.fake("p").budget_sets;
    assert_eq!(sets, [937, 1001, 1024], "{sets:?}");
    let vm = t.client.get("p").unwrap();
    assert_eq!(vm.memory_budget_mib, Some(1024));
    let m = parse(&t.client.metrics().unwrap());
    assert_eq!(
        value(
            &m,
            "densevm_fleet_policy_budget_actions_total",
            &[("direction", "raise"), ("reason", "host_recovered")]
        ),
        2.0
    );

    // A user's PATCH resets what the policy works toward.
    t.client.patch("p", &budget(512)).unwrap();
    let vm = t.client.get("p").unwrap();
    assert_eq!(
        (vm.memory_budget_mib, vm.memory_budget_user_mib),
        (Some(512), Some(512))
    );
}
