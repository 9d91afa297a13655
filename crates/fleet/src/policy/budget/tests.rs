//! The budget rules against a simulated host: tiered VMs whose DRAM is what they touch,
//! capped by their budget (the tier holds the rest), and a host whose `MemAvailable`
//! follows that DRAM.

use super::super::*;

#[derive(Clone)]
struct TierVm {
    id: &'static str,
    priority: Priority,
    memory: u64,
    budget: u64,
    user: u64,
    /// DRAM the guest would use without a budget.
    touched: u64,
    cpu: f64,
    /// Balloon statistics (a Linux guest with a balloon) or none (a probe VM).
    stats: Option<GuestStats>,
}

fn tiered(id: &'static str, priority: Priority, memory: u64, budget: u64) -> TierVm {
    TierVm {
        id,
        priority,
        memory,
        budget,
        user: budget,
        touched: budget,
        cpu: 90.0,
        stats: None,
    }
}

struct Sim {
    cfg: PolicyConfig,
    total: u64,
    base: u64,
    vms: Vec<TierVm>,
    state: PolicyState,
    tick: u64,
    log: Vec<(u64, BudgetAction)>,
    balloon_log: Vec<Action>,
    mode: HostMode,
}

impl Sim {
    fn new(total: u64, base: u64, vms: Vec<TierVm>) -> Self {
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
            balloon_log: Vec::new(),
            mode: HostMode::Hold,
        }
    }

    fn used(v: &TierVm) -> u64 {
        v.touched.min(v.budget)
    }

    fn available(&self) -> u64 {
        let used: u64 = self.vms.iter().map(Self::used).sum();
        self.total.saturating_sub(self.base + used)
    }

    fn vm(&self, id: &str) -> &TierVm {
        self.vms.iter().find(|v| v.id == id).unwrap()
    }

    fn input(&self) -> PolicyInput {
        PolicyInput {
            tick: self.tick,
            host: HostSample {
                mem_total_mib: self.total,
                mem_available_mib: self.available(),
                ..Default::default()
            },
            vms: self
                .vms
                .iter()
                .map(|v| VmInput {
                    id: v.id.into(),
                    priority: v.priority,
                    memory_mib: v.memory,
                    min_mib: v.memory / 4,
                    max_mib: v.memory,
                    balloon_mib: 0,
                    cpu_pct: Some(v.cpu),
                    stats: v.stats,
                    tier: Some(TierInput {
                        budget_mib: v.budget,
                        user_budget_mib: v.user,
                        used_mib: Self::used(v),
                    }),
                })
                .collect(),
        }
    }

    fn step(&mut self) -> Vec<BudgetAction> {
        let d = decide(&self.cfg, &self.state, &self.input());
        for a in &d.budgets {
            let cfg = self.cfg.clone();
            let v = self.vms.iter_mut().find(|v| v.id == a.vm).unwrap();
            assert_eq!(v.budget, a.from_mib, "{a:?}");
            // Invariants of every budget action.
            let floor = (v.memory * cfg.budget_floor_pct / 100)
                .max(cfg.budget_floor_mib)
                .min(v.user);
            assert!(a.budget_mib >= floor, "{a:?} under the floor {floor}");
            assert!(a.budget_mib <= v.user, "{a:?} over the user's {}", v.user);
            match a.direction {
                BudgetDirection::Lower => {
                    assert!(a.budget_mib < a.from_mib, "{a:?}");
                    let held = Self::used(v);
                    assert!(held - a.budget_mib <= cfg.budget_step_mib, "{a:?}");
                }
                BudgetDirection::Raise => {
                    assert!(a.budget_mib - a.from_mib <= cfg.budget_step_mib, "{a:?}");
                    assert_eq!(a.reason, Reason::HostRecovered);
                }
            }
            assert!(!a.detail.is_empty());
            v.budget = a.budget_mib;
            self.log.push((self.tick, a.clone()));
        }
        self.balloon_log.extend(d.actions);
        self.state = d.state;
        self.mode = d.mode;
        self.tick += 1;
        d.budgets
    }

    fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.step();
        }
    }
}

#[test]
fn low_memory_lowers_the_budget_of_a_low_priority_vm_first_by_bounded_steps() {
    let lo = tiered("lo", Priority::Low, 1024, 1024);
    let hi = tiered("hi", Priority::High, 1024, 1024);
    // 2 x 1024 DRAM + 1700 base on 4096: 348 available, under the low watermark (400).
    let mut sim = Sim::new(4096, 1700, vec![hi, lo]);
    let first = sim.step();
    assert_eq!(sim.mode, HostMode::Reclaim);
    assert_eq!(first.len(), 2, "{first:?}");
    // The host needs 500 - 348 = 152 MiB: 64 from lo, then hi (a step each is not enough).
    assert_eq!(first[0].vm, "lo", "{first:?}");
    assert_eq!((first[0].from_mib, first[0].budget_mib), (1024, 1024 - 64));
    assert_eq!(first[0].reason, Reason::HostLowMemory);
    assert_eq!(first[0].direction, BudgetDirection::Lower);
    assert!(
        first[0].detail.contains("floor 256 MiB"),
        "{}",
        first[0].detail
    );
    assert_eq!(first[1].vm, "hi", "{first:?}");
    // Back at the middle of the band in a few ticks, then nothing more.
    sim.run(20);
    assert!(
        sim.available() >= sim.cfg.low_watermark_mib,
        "{}",
        sim.available()
    );
    let n = sim.log.len();
    sim.run(20);
    assert_eq!(sim.log.len(), n, "{:?}", &sim.log[n..]);
    // The low-priority VM gave at least as much as the high one.
    assert!(sim.vm("lo").budget <= sim.vm("hi").budget);
}

#[test]
fn budgets_stop_at_their_floor_a_quarter_of_ram_or_the_configured_minimum() {
    let a = tiered("a", Priority::Low, 1024, 1024);
    let mut b = tiered("b", Priority::Low, 32, 32);
    b.touched = 32;
    // Far under the low watermark whatever the budgets do.
    let mut sim = Sim::new(2048, 2000, vec![a, b]);
    sim.run(100);
    assert_eq!(sim.mode, HostMode::Reclaim);
    assert_eq!(sim.vm("a").budget, 256, "a quarter of its RAM");
    // A quarter of 32 MiB is 8: the configured minimum (16) holds.
    assert_eq!(sim.vm("b").budget, 16);
    let n = sim.log.len();
    sim.run(10);
    assert_eq!(sim.log.len(), n, "nothing under the floors");
}

#[test]
fn a_budget_above_what_the_vm_holds_is_lowered_from_what_it_holds() {
    // The VM touches 600 MiB of a 900 MiB budget: lowering it to 836 would free nothing.
    let mut a = tiered("a", Priority::Normal, 1024, 900);
    a.touched = 600;
    let mut sim = Sim::new(2048, 2048 - 600 - 350, vec![a]);
    let acts = sim.step();
    assert_eq!(acts.len(), 1, "{acts:?}");
    assert_eq!((acts[0].from_mib, acts[0].budget_mib), (900, 600 - 64));
    assert!(sim.available() >= 350 + 64);
}

#[test]
fn a_tier_that_has_not_reached_its_budget_is_not_lowered_again() {
    let a = tiered("a", Priority::Low, 1024, 1024);
    let sim = Sim::new(2048, 1024 + 800, vec![a]);
    let input = {
        let mut i = sim.input();
        // The tier still holds 200 MiB over its budget (it evicts meanwhile).
        let t = i.vms[0].tier.as_mut().unwrap();
        t.budget_mib = 800;
        t.used_mib = 1000;
        i
    };
    let d = decide(&sim.cfg, &sim.state, &input);
    assert_eq!(d.mode, HostMode::Reclaim);
    assert!(d.budgets.is_empty(), "{:?}", d.budgets);
    // Within its slack (1/32 of the budget, +1 MiB of rounding) it is lowered again.
    let mut input = input;
    input.vms[0].tier.as_mut().unwrap().used_mib = 800 + 25 + 1;
    let d = decide(&sim.cfg, &sim.state, &input);
    assert_eq!(d.budgets.len(), 1, "{:?}", d.budgets);
}

#[test]
fn a_vm_whose_balloon_the_policy_inflates_keeps_its_budget_and_a_busy_one_gives_dram() {
    // "idle": an idle Linux guest with a balloon and 400 MiB of page cache to give.
    let mut idle = tiered("idle", Priority::Low, 1024, 1024);
    idle.cpu = 0.0;
    idle.stats = Some(GuestStats {
        balloon_actual_mib: 0,
        total_mib: 1000,
        free_mib: 0,
        available_mib: 500,
        caches_mib: 400,
        ..Default::default()
    });
    // "busy": a busy guest short of memory: its balloon is left alone, its budget is not.
    let mut busy = tiered("busy", Priority::Normal, 1024, 1024);
    busy.stats = Some(GuestStats {
        balloon_actual_mib: 0,
        total_mib: 1000,
        free_mib: 0,
        available_mib: 10,
        caches_mib: 10,
        major_faults_delta: 1000,
        ..Default::default()
    });
    let mut sim = Sim::new(4096, 4096 - 2048 - 200, vec![idle, busy]);
    sim.cfg.idle_after_ticks = 0;
    let acts = sim.step();
    assert_eq!(sim.mode, HostMode::Reclaim);
    assert_eq!(sim.balloon_log.len(), 1, "{:?}", sim.balloon_log);
    assert_eq!(sim.balloon_log[0].vm, "idle");
    assert_eq!(acts.len(), 1, "{acts:?}");
    assert_eq!(acts[0].vm, "busy", "{acts:?}");
    assert!(acts[0].detail.contains("busy"), "{}", acts[0].detail);
}

#[test]
fn plenty_of_memory_raises_lowered_budgets_back_to_the_users_after_the_cooldown() {
    let mut lo = tiered("lo", Priority::Low, 1024, 512);
    lo.user = 1024;
    lo.touched = 1024;
    let mut hi = tiered("hi", Priority::High, 1024, 512);
    hi.user = 1024;
    hi.touched = 1024;
    let same = tiered("same", Priority::High, 1024, 300);
    // 1324 MiB of DRAM in use; 100 MiB over the high watermark.
    let mut sim = Sim::new(4096, 4096 - 1324 - 700, vec![lo, hi, same]);
    let acts = sim.step();
    assert_eq!(sim.mode, HostMode::Grow);
    // High priority first; the two share the 100 MiB of room; "same" is where its user
    // put it.
    assert_eq!(acts.len(), 2, "{acts:?}");
    assert_eq!((acts[0].vm.as_str(), acts[0].budget_mib), ("hi", 512 + 64));
    assert_eq!((acts[1].vm.as_str(), acts[1].budget_mib), ("lo", 512 + 36));
    assert!(sim.available() >= sim.cfg.high_watermark_mib);
    // More room: both back at the user's budget in bounded steps, never over it.
    sim.base -= 2000;
    sim.run(30);
    assert_eq!(sim.vm("hi").budget, 1024);
    assert_eq!(sim.vm("lo").budget, 1024);
    assert_eq!(sim.vm("same").budget, 300);
}

#[test]
fn a_lowered_budget_is_not_raised_within_the_cooldown_nor_between_the_watermarks() {
    let a = tiered("a", Priority::Low, 1024, 1024);
    let mut sim = Sim::new(2048, 640, vec![a]);
    // 384 available: lowered once to reach the middle of the band (500).
    let acts = sim.step();
    assert_eq!(acts.len(), 1, "{acts:?}");
    assert_eq!(acts[0].budget_mib, 1024 - 64);
    sim.run(3);
    // Between the watermarks: no raise.
    assert_eq!(sim.mode, HostMode::Hold);
    assert_eq!(sim.log.len(), 1, "{:?}", sim.log);
    // The host has room again at once: no raise before the cooldown.
    sim.base -= 500;
    let lowered_at = sim.log.last().unwrap().0;
    sim.run(30);
    let raise = sim
        .log
        .iter()
        .find(|(_, a)| a.direction == BudgetDirection::Raise)
        .expect("a raise once cooled");
    assert!(
        raise.0 - lowered_at >= sim.cfg.reverse_cooldown_ticks,
        "{:?}",
        sim.log
    );
    assert_eq!(sim.vm("a").budget, 1024);
}

#[test]
fn budgets_are_left_alone_between_the_watermarks_and_without_a_tier() {
    let a = tiered("a", Priority::Low, 1024, 512);
    let mut sim = Sim::new(2048, 2048 - 512 - 500, vec![a]);
    sim.vms[0].user = 1024;
    sim.run(50);
    assert_eq!(sim.mode, HostMode::Hold);
    assert!(sim.log.is_empty(), "{:?}", sim.log);
    // Under the low watermark, a VM without a tier gets no budget action.
    let mut input = sim.input();
    input.host.mem_available_mib = 10;
    input.vms[0].tier = None;
    let d = decide(&sim.cfg, &sim.state, &input);
    assert_eq!(d.mode, HostMode::Reclaim);
    assert!(d.budgets.is_empty());
}

#[test]
fn host_pressure_lowers_budgets_with_its_own_reason() {
    let a = tiered("a", Priority::Low, 1024, 1024);
    let sim = Sim::new(4096, 1000, vec![a]);
    let mut input = sim.input();
    input.host.psi_some_avg10 = 50.0;
    let d = decide(&sim.cfg, &sim.state, &input);
    assert_eq!(d.mode, HostMode::Reclaim);
    assert_eq!(d.budgets.len(), 1, "{:?}", d.budgets);
    assert_eq!(d.budgets[0].reason, Reason::HostPressure);
    assert_eq!(d.budgets[0].budget_mib, 1024 - 64);
}
