//! The policy against simulated hosts: guests whose use, cache and CPU are set by the test,
//! a host whose `MemAvailable` follows what the guests keep resident, and balloons that
//! reach their target at once (or do not, where a test says so).

use super::*;

#[derive(Clone)]
struct SimVm {
    id: &'static str,
    priority: Priority,
    memory: u64,
    min: u64,
    max: u64,
    balloon: u64,
    /// What the guest uses besides page cache.
    need: u64,
    /// How much page cache it would keep if it could.
    cache_want: u64,
    cpu: f64,
    has_stats: bool,
    /// Its balloon has deflate-on-OOM: Linux keeps inflated pages in the guest's total.
    doo: bool,
}

fn vm(id: &'static str, priority: Priority, memory: u64) -> SimVm {
    SimVm {
        id,
        priority,
        memory,
        min: memory / 4,
        max: memory,
        balloon: 0,
        need: 64,
        cache_want: 0,
        cpu: 0.0,
        has_stats: true,
        doo: false,
    }
}

struct Sim {
    cfg: PolicyConfig,
    total: u64,
    /// Host memory used by everything but the guests.
    base: u64,
    vms: Vec<SimVm>,
    state: PolicyState,
    tick: u64,
    log: Vec<(u64, Action)>,
    mode: HostMode,
}

const FREE_MIN: u64 = 4;

impl Sim {
    fn new(total: u64, base: u64, vms: Vec<SimVm>) -> Self {
        let mut cfg = PolicyConfig::for_host(total);
        cfg.low_watermark_mib = 400;
        cfg.high_watermark_mib = 600;
        Self {
            cfg,
            total,
            base,
            vms,
            state: PolicyState::default(),
            tick: 0,
            log: Vec::new(),
            mode: HostMode::Hold,
        }
    }

    fn vm(&self, id: &str) -> &SimVm {
        self.vms.iter().find(|v| v.id == id).unwrap()
    }

    fn vm_mut(&mut self, id: &str) -> &mut SimVm {
        self.vms.iter_mut().find(|v| v.id == id).unwrap()
    }

    fn caches(v: &SimVm) -> u64 {
        let eff = v.memory - v.balloon;
        v.cache_want
            .min(eff.saturating_sub(v.need.min(eff)).saturating_sub(FREE_MIN))
    }

    fn stats(v: &SimVm) -> GuestStats {
        let eff = v.memory - v.balloon;
        let need = v.need.min(eff);
        let caches = Self::caches(v);
        let free = eff - need - caches;
        GuestStats {
            balloon_actual_mib: v.balloon,
            total_mib: if v.doo { v.memory } else { eff },
            free_mib: free,
            available_mib: free + caches,
            caches_mib: caches,
            // A guest that does not fit pages in and out.
            major_faults_delta: if v.need + 8 > eff { 500 } else { 0 },
            swap_in_delta_kib: 0,
        }
    }

    /// Host memory a guest holds: what it uses and caches (free pages were reported back).
    fn resident(v: &SimVm) -> u64 {
        v.need.min(v.memory - v.balloon) + Self::caches(v)
    }

    fn available(&self) -> u64 {
        let used: u64 = self.vms.iter().map(Self::resident).sum();
        self.total.saturating_sub(self.base + used)
    }

    fn input(&self) -> PolicyInput {
        PolicyInput {
            tick: self.tick,
            host: HostSample {
                mem_total_mib: self.total,
                mem_available_mib: self.available(),
                psi_some_avg10: 0.0,
                psi_full_avg10: 0.0,
            },
            vms: self
                .vms
                .iter()
                .map(|v| VmInput {
                    id: v.id.into(),
                    priority: v.priority,
                    memory_mib: v.memory,
                    min_mib: v.min,
                    max_mib: v.max,
                    balloon_mib: v.balloon,
                    cpu_pct: Some(v.cpu),
                    stats: v.has_stats.then(|| Self::stats(v)),
                    tier: None,
                })
                .collect(),
        }
    }

    fn step(&mut self) -> Vec<Action> {
        let d = decide(&self.cfg, &self.state, &self.input());
        for a in &d.actions {
            let free = Self::stats(self.vm(&a.vm)).free_mib;
            let v = self.vm_mut(&a.vm);
            assert_eq!(v.balloon, a.from_mib);
            v.balloon = a.balloon_mib;
            // Invariants of every action.
            let eff = v.memory - v.balloon;
            assert!(eff >= v.min, "{a:?} puts {} under its min {}", v.id, v.min);
            assert!(eff <= v.max, "{a:?} puts {} over its max {}", v.id, v.max);
            // A step, plus (inflating) what the guest had free.
            let step = self.cfg.step_mib
                + if a.direction == Direction::Inflate {
                    free
                } else {
                    0
                };
            assert!(a.from_mib.abs_diff(a.balloon_mib) <= step, "{a:?}");
            assert!(!a.detail.is_empty());
            self.log.push((self.tick, a.clone()));
        }
        self.state = d.state;
        self.mode = d.mode;
        self.tick += 1;
        d.actions
    }

    fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.step();
        }
    }

    fn eff(&self, id: &str) -> u64 {
        let v = self.vm(id);
        v.memory - v.balloon
    }
}

fn idle(mut v: SimVm) -> SimVm {
    v.cpu = 0.5;
    v
}

fn busy(mut v: SimVm) -> SimVm {
    v.cpu = 80.0;
    v
}

#[test]
fn defaults_follow_the_host_and_are_consistent() {
    let cfg = PolicyConfig::for_host(2048);
    assert_eq!((cfg.low_watermark_mib, cfg.high_watermark_mib), (204, 409));
    cfg.check().unwrap();
    let small = PolicyConfig::for_host(512);
    assert_eq!(
        (small.low_watermark_mib, small.high_watermark_mib),
        (128, 256)
    );
    small.check().unwrap();
    let mut bad = cfg.clone();
    bad.low_watermark_mib = bad.high_watermark_mib;
    assert!(bad
        .check()
        .unwrap_err()
        .contains("under the high watermark"));
    let mut bad = cfg.clone();
    bad.step_mib = 0;
    assert!(bad.check().is_err());
    for pct in [0.0, -1.0, 100.5, f64::NAN] {
        let mut bad = cfg.clone();
        bad.idle_cpu_pct = pct;
        assert!(bad.check().unwrap_err().contains("idle CPU"), "{pct}");
    }
    let mut lab = cfg;
    lab.idle_cpu_pct = 5.0;
    lab.check().unwrap();
}

#[test]
fn low_memory_inflates_idle_low_priority_first() {
    // Each guest keeps 100 MiB used + 380 MiB cache resident: 3 x 480 + 400 = 1840 of 2048.
    let mut vms = Vec::new();
    for (id, prio) in [
        ("hi", Priority::High),
        ("lo", Priority::Low),
        ("no", Priority::Normal),
    ] {
        let mut v = idle(vm(id, prio, 512));
        v.need = 100;
        v.cache_want = 380;
        vms.push(v);
    }
    let mut sim = Sim::new(2048, 400, vms);
    sim.run(10);
    // The first ticks already reclaim (none is idle yet), in priority order.
    let first = &sim.log[0].1;
    assert_eq!(first.vm, "lo", "{:?}", sim.log);
    assert_eq!(first.reason, Reason::HostLowMemory);
    assert_eq!(first.direction, Direction::Inflate);
    // Within one tick the order is low, normal, high.
    let tick0: Vec<&str> = sim
        .log
        .iter()
        .filter(|(t, _)| *t == 0)
        .map(|(_, a)| a.vm.as_str())
        .collect();
    assert_eq!(tick0[0], "lo");
    if tick0.len() > 1 {
        assert_eq!(tick0[1], "no");
    }
    assert!(!tick0.contains(&"hi") || tick0.len() == 3);
    sim.run(100);
    assert!(
        sim.available() >= sim.cfg.low_watermark_mib,
        "{}",
        sim.available()
    );
    // The low-priority VM gave the most.
    assert!(sim.eff("lo") <= sim.eff("no") && sim.eff("no") <= sim.eff("hi"));
}

#[test]
fn idle_vms_give_before_busy_ones_whatever_their_priority() {
    let mut a = busy(vm("busy-low", Priority::Low, 512));
    a.need = 100;
    a.cache_want = 380;
    let mut b = idle(vm("idle-high", Priority::High, 512));
    b.need = 100;
    b.cache_want = 380;
    // 450 MiB available (between the watermarks) while the idle one becomes idle...
    let mut sim = Sim::new(2048, 2048 - 960 - 450, vec![a, b]);
    sim.run(10);
    assert!(sim.log.is_empty(), "{:?}", sim.log);
    // ...then under the low watermark.
    sim.base += 60;
    sim.step();
    assert_eq!(sim.log[0].1.vm, "idle-high", "{:?}", sim.log);
    assert_eq!(sim.log[1].1.vm, "busy-low", "{:?}", sim.log);
}

#[test]
fn reclaim_never_goes_under_min_or_what_the_guest_needs() {
    let mut a = idle(vm("a", Priority::Low, 1024));
    a.min = 300;
    a.need = 100;
    a.cache_want = 900;
    let mut b = idle(vm("b", Priority::Low, 1024));
    b.min = 128;
    b.need = 500;
    b.cache_want = 500;
    // 2 x 1000 resident on a 2048 host: far under the watermark whatever happens.
    let mut sim = Sim::new(2048, 1000, vec![a, b]);
    sim.run(200);
    assert_eq!(sim.mode, HostMode::Reclaim);
    assert_eq!(sim.eff("a"), 300, "min");
    // b: 500 MiB used leaves twice max(32, 10%) available: 500 * 100 / 80 = 625.
    assert_eq!(sim.eff("b"), 625, "guest floor");
    let stats = Sim::stats(sim.vm("b"));
    assert!(stats.available_mib >= 2 * short_threshold(&sim.cfg, sim.eff("b")));
    // No further actions once at the floors.
    sim.log.clear();
    sim.run(50);
    assert!(sim.log.is_empty(), "{:?}", sim.log);
}

#[test]
fn a_short_guest_is_not_inflated_even_when_the_host_is_low() {
    let mut a = idle(vm("a", Priority::Low, 512));
    a.need = 510; // does not fit: short
    let mut sim = Sim::new(1024, 400, vec![a]);
    sim.run(30);
    assert_eq!(sim.mode, HostMode::Reclaim);
    assert!(sim.log.is_empty(), "{:?}", sim.log);
}

#[test]
fn plenty_of_memory_deflates_short_guests_high_priority_first_up_to_max() {
    let mut h = busy(vm("h", Priority::High, 1024));
    h.balloon = 512;
    h.max = 900;
    h.need = 1000;
    let mut n = busy(vm("n", Priority::Normal, 1024));
    n.balloon = 512;
    n.need = 1000;
    let mut l = busy(vm("l", Priority::Low, 1024));
    l.balloon = 512;
    l.need = 1000;
    // Both hold 512 resident: 1024 + base. Room over the high watermark: 80 MiB.
    let mut sim = Sim::new(4096, 0, vec![l, n, h]);
    sim.base = 4096 - 1536 - 600 - 80;
    let acts = sim.step();
    assert_eq!(acts.len(), 2, "{acts:?}");
    assert_eq!((acts[0].vm.as_str(), acts[0].balloon_mib), ("h", 448));
    assert_eq!(acts[0].reason, Reason::GuestShort);
    assert_eq!(acts[0].direction, Direction::Deflate);
    // The rest of the budget (16 MiB) goes to the next in line.
    assert_eq!((acts[1].vm.as_str(), acts[1].balloon_mib), ("n", 496));
    // With a large host everything short grows up to its max, no further.
    sim.base = 0;
    sim.run(50);
    assert_eq!(sim.eff("h"), 900);
    assert_eq!(sim.eff("n"), 1024);
    assert_eq!(sim.eff("l"), 1024);
}

#[test]
fn growing_stops_at_the_high_watermark() {
    let mut h = busy(vm("h", Priority::High, 2048));
    h.balloon = 1024;
    h.need = 4000; // always short, uses whatever it gets
    let mut sim = Sim::new(4096, 0, vec![h]);
    sim.base = 4096 - 1024 - 900;
    sim.run(100);
    // Host available never falls under the high watermark through the policy's deflates.
    assert!(
        sim.available() >= sim.cfg.high_watermark_mib,
        "{}",
        sim.available()
    );
    assert!(sim.available() < sim.cfg.high_watermark_mib + sim.cfg.min_change_mib);
}

#[test]
fn between_the_watermarks_idle_lower_priority_vms_make_room_for_a_short_one() {
    let mut h = busy(vm("h", Priority::High, 1024));
    h.balloon = 512;
    h.need = 900;
    let mut l1 = idle(vm("l1", Priority::Low, 1024));
    l1.need = 100;
    l1.cache_want = 800;
    let mut l2 = idle(vm("l2", Priority::Normal, 1024));
    l2.need = 100;
    l2.cache_want = 800;
    // A 2.5 GiB host holding 512 + 2 x 900 + 100: 212 MiB available, under the low
    // watermark at first; the sum of the VMs' sizes (3 GiB) is more than the host.
    let mut sim = Sim::new(2560, 100, vec![h, l1, l2]);
    sim.cfg.squeeze_period_ticks = 10_000;
    let mut under_low = 0;
    for _ in 0..300 {
        sim.step();
        if sim.available() < sim.cfg.low_watermark_mib {
            under_low += 1;
        }
    }
    // The high-priority VM got what it needs (short no more) and its memory came from the
    // idle ones.
    assert!(sim.eff("h") >= 900 + 8, "h has {}", sim.eff("h"));
    assert!(Sim::stats(sim.vm("h")).major_faults_delta == 0);
    assert!(sim.eff("l1") < 1024 && sim.eff("l2") < 1024);
    assert!(sim.eff("l1") <= sim.eff("l2"), "low gives before normal");
    assert!(sim.log.iter().any(|(_, a)| a.reason == Reason::MakeRoom));
    assert!(under_low <= 10, "{under_low} ticks under the low watermark");
    assert!(sim.available() >= sim.cfg.low_watermark_mib);
}

#[test]
fn idle_vms_are_squeezed_periodically_toward_their_use_without_cache() {
    let mut a = idle(vm("a", Priority::Normal, 1024));
    a.need = 200;
    a.cache_want = 700;
    let mut b = busy(vm("b", Priority::Normal, 1024));
    b.need = 200;
    b.cache_want = 700;
    // A large host: neither reclaim nor grow has anything to do.
    let mut sim = Sim::new(16384, 0, vec![a, b]);
    sim.cfg.squeeze_period_ticks = 60;
    sim.run(59);
    assert!(sim.log.is_empty(), "{:?}", sim.log);
    sim.run(30);
    let squeezes: Vec<_> = sim.log.iter().map(|(_, a)| a).collect();
    assert!(!squeezes.is_empty());
    assert!(squeezes
        .iter()
        .all(|a| a.vm == "a" && a.reason == Reason::StaleCache));
    // 200 MiB used: floor max(min 256, 200 + 2 x 32, 200 * 100 / 80) = 264; the cache
    // went back to the host.
    assert_eq!(sim.eff("a"), 264);
    assert_eq!(sim.eff("b"), 1024, "a busy VM is not squeezed");
    let n = sim.log.len();
    // Nothing more to squeeze in later periods while nothing changes.
    sim.run(300);
    assert_eq!(sim.log.len(), n, "{:?}", &sim.log[n..]);
}

#[test]
fn a_squeeze_stops_when_the_vm_wakes_up() {
    let mut a = idle(vm("a", Priority::Normal, 1024));
    a.need = 100;
    a.cache_want = 900;
    let mut sim = Sim::new(16384, 0, vec![a]);
    sim.cfg.squeeze_period_ticks = 20;
    sim.run(22);
    assert!(sim.state.vms["a"].squeezing);
    sim.vm_mut("a").cpu = 50.0;
    let n = sim.log.len();
    sim.run(20);
    assert_eq!(sim.log.len(), n);
    assert!(!sim.state.vms["a"].squeezing);
}

#[test]
fn steady_state_does_not_oscillate() {
    let mut vms = Vec::new();
    for (i, id) in ["v0", "v1", "v2", "v3", "v4", "v5"].into_iter().enumerate() {
        let prio = [Priority::Low, Priority::Normal, Priority::High][i % 3];
        let mut v = if i % 2 == 0 {
            idle(vm(id, prio, 512))
        } else {
            busy(vm(id, prio, 512))
        };
        v.need = 120 + 40 * i as u64;
        v.cache_want = 300;
        vms.push(v);
    }
    let mut sim = Sim::new(3072, 300, vms);
    sim.cfg.squeeze_period_ticks = 120;
    sim.run(600);
    let n = sim.log.len();
    sim.run(1200);
    assert_eq!(sim.log.len(), n, "still acting: {:?}", &sim.log[n..]);
    // Over the whole run, no VM was deflated within the cooldown of an inflate or the
    // reverse.
    for id in ["v0", "v1", "v2", "v3", "v4", "v5"] {
        let mine: Vec<&(u64, Action)> = sim.log.iter().filter(|(_, a)| a.vm == id).collect();
        for w in mine.windows(2) {
            if w[0].1.direction != w[1].1.direction {
                assert!(w[1].0 - w[0].0 >= sim.cfg.reverse_cooldown_ticks, "{w:?}");
            }
        }
    }
    assert!(sim.available() >= sim.cfg.low_watermark_mib);
}

#[test]
fn a_vm_with_no_stats_yet_is_left_alone() {
    let mut a = idle(vm("a", Priority::Low, 1024));
    a.has_stats = false;
    a.need = 100;
    a.cache_want = 900;
    let mut sim = Sim::new(1200, 0, vec![a]);
    sim.cfg.squeeze_period_ticks = 5;
    sim.run(100);
    assert_eq!(sim.mode, HostMode::Reclaim);
    assert!(sim.log.is_empty(), "{:?}", sim.log);
    // Once it reports, it takes part.
    sim.vm_mut("a").has_stats = true;
    sim.step();
    assert_eq!(sim.log.len(), 1);
}

#[test]
fn a_balloon_that_has_not_reached_its_target_is_not_pushed_further() {
    let mut a = idle(vm("a", Priority::Low, 1024));
    a.need = 100;
    a.cache_want = 900;
    let sim = Sim::new(1200, 0, vec![a]);
    let mut input = sim.input();
    input.vms[0].balloon_mib = 128;
    input.vms[0].stats.as_mut().unwrap().balloon_actual_mib = 32;
    let d = decide(&sim.cfg, &PolicyState::default(), &input);
    assert_eq!(d.mode, HostMode::Reclaim);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn psi_over_its_limit_reclaims_even_with_memory_available() {
    let mut a = idle(vm("a", Priority::Low, 1024));
    a.need = 100;
    a.cache_want = 900;
    let sim = Sim::new(16384, 0, vec![a]);
    let mut input = sim.input();
    input.host.psi_some_avg10 = 25.0;
    let d = decide(&sim.cfg, &PolicyState::default(), &input);
    assert_eq!(d.mode, HostMode::Reclaim);
    assert_eq!(d.actions.len(), 1);
    assert_eq!(d.actions[0].reason, Reason::HostPressure);
    // A step for the host, over the 24 MiB the guest had free.
    assert_eq!(Sim::stats(sim.vm("a")).free_mib, 24);
    assert_eq!(d.actions[0].balloon_mib, sim.cfg.step_mib + 24);
}

#[test]
fn decisions_are_deterministic_and_independent_of_input_order() {
    let mut vms = Vec::new();
    for id in ["c", "a", "b"] {
        let mut v = idle(vm(id, Priority::Low, 512));
        v.need = 100;
        v.cache_want = 400;
        vms.push(v);
    }
    let sim = Sim::new(1500, 0, vms);
    let input = sim.input();
    let mut reversed = input.clone();
    reversed.vms.reverse();
    let a = decide(&sim.cfg, &sim.state, &input);
    let b = decide(&sim.cfg, &sim.state, &reversed);
    assert_eq!(a, b);
    assert_eq!(a, decide(&sim.cfg, &sim.state, &input));
    // Equal VMs are taken in id order.
    assert_eq!(a.actions[0].vm, "a");
}

#[test]
fn vms_that_left_are_forgotten() {
    let mut sim = Sim::new(4096, 0, vec![idle(vm("a", Priority::Low, 512))]);
    sim.run(3);
    assert!(sim.state.vms.contains_key("a"));
    sim.vms.clear();
    sim.step();
    assert!(sim.state.vms.is_empty());
}

/// With deflate-on-OOM (every fleet VM's balloon) the guest's total keeps its inflated
/// pages: they must not count as memory the guest uses, or each inflate raises the guest's
/// floor and reclaim stalls with the cache still in the guests (the nested lab: 512 MiB
/// guests stopped at ~290 MiB with 230 MiB of cache, the host under its low watermark).
#[test]
fn reclaim_takes_the_cache_of_guests_whose_total_holds_the_balloon() {
    let vms = (0..4)
        .map(|i| {
            let mut v = idle(vm(["a", "b", "c", "d"][i], Priority::Low, 512));
            v.need = 40;
            v.cache_want = 300;
            v.doo = true;
            v
        })
        .collect();
    // 4 x 340 MiB resident + 600: 88 MiB available, under the low watermark (400).
    let mut sim = Sim::new(2048, 600, vms);
    assert!(sim.available() < sim.cfg.low_watermark_mib);
    let s = Sim::stats(sim.vm("a"));
    assert_eq!(s.need_mib(512), 40);
    sim.run(100);
    assert!(
        sim.available() >= sim.cfg.low_watermark_mib,
        "reclaim stalled at {} MiB available: {:?}",
        sim.available(),
        sim.log
    );
    // What a guest uses is its need, whatever its balloon: inflated to 300 MiB, the
    // guest's total (512) holds the balloon and need_mib leaves it out.
    let mut v = vm("x", Priority::Low, 512);
    v.need = 40;
    v.doo = true;
    v.balloon = 300;
    assert_eq!(Sim::stats(&v).need_mib(512), 40);
    v.doo = false;
    assert_eq!(Sim::stats(&v).need_mib(512), 40);
}

/// A short guest that deflated on its own (deflate-on-OOM: its balloon under its target)
/// is deflated from its balloon's actual size, never to a target between the two, which
/// would make it inflate again while short.
#[test]
fn a_guest_that_deflated_on_its_own_is_grown_from_its_actual_balloon() {
    let mut cfg = PolicyConfig::for_host(2048);
    cfg.low_watermark_mib = 400;
    cfg.high_watermark_mib = 600;
    let input = PolicyInput {
        tick: 0,
        host: HostSample {
            mem_total_mib: 2048,
            mem_available_mib: 1000,
            ..Default::default()
        },
        vms: vec![VmInput {
            id: "hi".into(),
            priority: Priority::High,
            memory_mib: 512,
            min_mib: 128,
            max_mib: 512,
            balloon_mib: 256,
            cpu_pct: Some(80.0),
            stats: Some(GuestStats {
                balloon_actual_mib: 172,
                total_mib: 470,
                free_mib: 8,
                available_mib: 12,
                caches_mib: 4,
                ..Default::default()
            }),
            tier: None,
        }],
    };
    let d = decide(&cfg, &PolicyState::default(), &input);
    assert_eq!(d.mode, HostMode::Grow);
    assert_eq!(d.actions.len(), 1, "{:?}", d.actions);
    let a = &d.actions[0];
    assert_eq!(
        (a.direction, a.reason, a.from_mib, a.balloon_mib),
        (Direction::Deflate, Reason::GuestShort, 256, 172 - 64),
        "{a:?}"
    );
    assert!(
        a.detail.contains("deflated on its own to 172 MiB"),
        "{}",
        a.detail
    );
}

/// A guest's tmpfs is in its `caches` but not in its `available`: it is memory the guest
/// uses, not cache it could drop, and reclaim leaves it (plus headroom) to the guest.
#[test]
fn tmpfs_counts_as_used_not_as_cache() {
    let tmpfs = GuestStats {
        balloon_actual_mib: 0,
        total_mib: 470,
        free_mib: 20,
        available_mib: 60,
        // 200 MiB of file pages, 160 of them a tmpfs.
        caches_mib: 200,
        ..Default::default()
    };
    assert_eq!(tmpfs.need_mib(512), 410);
    let mut cfg = PolicyConfig::for_host(2048);
    cfg.low_watermark_mib = 400;
    cfg.high_watermark_mib = 600;
    let input = PolicyInput {
        tick: 0,
        host: HostSample {
            mem_total_mib: 2048,
            mem_available_mib: 100,
            ..Default::default()
        },
        vms: vec![VmInput {
            id: "hi".into(),
            priority: Priority::High,
            memory_mib: 512,
            min_mib: 128,
            max_mib: 512,
            balloon_mib: 0,
            cpu_pct: Some(0.0),
            stats: Some(tmpfs),
            tier: None,
        }],
    };
    let d = decide(&cfg, &PolicyState::default(), &input);
    assert_eq!(d.mode, HostMode::Reclaim);
    for a in &d.actions {
        assert!(512 - a.balloon_mib >= 410 + 64, "{a:?}");
    }
}

/// With free page reporting a guest's free memory is back on the host already, and an
/// inflate takes it first: an inflate by one step gained the host nothing from a guest with
/// more than a step free (the nested lab: four low VMs inflated by ~250 MiB each before the
/// host got anything back, and it stayed under its low watermark for 15 s). The balloon
/// grows by the free memory plus the step.
#[test]
fn an_inflate_covers_what_the_guest_has_free_before_it_gains_the_host_anything() {
    let mut a = idle(vm("a", Priority::Low, 512));
    a.need = 40;
    a.cache_want = 160;
    // 200 MiB resident (the 312 MiB free were reported), 1800 + 200 of 2048: 48 available.
    let mut sim = Sim::new(2048, 1800, vec![a]);
    assert_eq!(Sim::stats(sim.vm("a")).free_mib, 312);
    let before = sim.available();
    let actions = sim.step();
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert_eq!(
        actions[0].balloon_mib,
        312 + sim.cfg.step_mib,
        "{actions:?}"
    );
    assert!(
        sim.available() >= before + sim.cfg.step_mib,
        "the inflate gained the host {} MiB",
        sim.available() - before
    );
    assert!(actions[0].detail.contains("312 MiB the guest had free"));
}
