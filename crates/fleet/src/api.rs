//! The fleet's REST API on a unix socket, served by `densevm-api`'s HTTP code
//! ([`densevm_api::ApiServer::spawn_router`]) with this route table:
//!
//! | method   | path         | body          | answer                        |
//! |----------|--------------|---------------|-------------------------------|
//! | `GET`    | `/`          | —             | 200 [`FleetInfo`]             |
//! | `GET`    | `/vms`       | —             | 200 `[VmInfo]`                |
//! | `POST`   | `/vms`       | [`VmCreate`]  | 201 [`VmInfo`]                |
//! | `GET`    | `/vms/{id}`  | —             | 200 [`VmInfo`]                |
//! | `PATCH`  | `/vms/{id}`  | [`VmPatch`]   | 200 [`VmInfo`]                |
//! | `DELETE` | `/vms/{id}`  | —             | 200 [`VmInfo`] (how it ended) |
//! | `POST`   | `/vms/{id}/exec` | [`VmExec`] | 200 [`ExecResult`] (crate::exec) |
//! | `GET`    | `/metrics`   | —             | 200 Prometheus text           |
//!
//! Errors are `{"fault_message": "..."}` with a 4xx/5xx status, as on a VM's own socket.

use densevm_api::http::HttpRequest;
use densevm_api::request::{check_method, json, known_routes, normalize, quote, ApiErrorResponse};
use densevm_api::{ApiResponse, Reply};

use crate::daemon::Fleet;
use crate::metrics::{all_kinds, direction_label, Exposition, CONTENT_TYPE};
use crate::policy::{budget_kinds, HostMode};
use crate::registry::valid_id;
use crate::types::{FleetInfo, VmCreate, VmExec, VmInfo, VmPatch, VmStatus};

/// Every resource and the methods it takes (`{id}` is a VM id); docs/api/openapi.yaml
/// documents each, and a test checks that it does.
pub const ROUTES: &[(&str, &[&str])] = &[
    ("/", &["GET"]),
    ("/vms", &["GET", "POST"]),
    ("/vms/{id}", &["GET", "PATCH", "DELETE"]),
    ("/vms/{id}/exec", &["POST"]),
    ("/metrics", &["GET"]),
];

/// A request whose route is decided and whose body is parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetRequest {
    /// `GET /`.
    Info,
    /// `GET /vms`.
    List,
    /// `POST /vms`.
    Create(Box<VmCreate>),
    /// `GET /vms/{id}`.
    Get(String),
    /// `PATCH /vms/{id}`.
    Patch(String, VmPatch),
    /// `DELETE /vms/{id}`.
    Delete(String),
    /// `POST /vms/{id}/exec`.
    Exec(String, VmExec),
    /// `GET /metrics`.
    Metrics,
}

/// Routes one request (pure: no I/O). 404 for an unknown path or a VM id that cannot
/// exist, 405 naming the methods a path takes, 400 for a body that is not what the route
/// takes.
pub fn parse_request(
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<FleetRequest, ApiErrorResponse> {
    let path = normalize(path);
    let (route, id) = match path.strip_prefix("/vms/") {
        Some(rest) => match rest.strip_suffix("/exec") {
            Some(id) => ("/vms/{id}/exec", Some(id)),
            None => ("/vms/{id}", Some(rest)),
        },
        None => (path, None),
    };
    let Some(&(route, allowed)) = ROUTES.iter().find(|(p, _)| *p == route) else {
        return Err(ApiErrorResponse::new(
            404,
            format!(
                "no resource at {}; the fleet API has: {}",
                quote(path),
                known_routes(ROUTES)
            ),
        ));
    };
    check_method(method, route, allowed)?;
    if let Some(id) = id {
        if !valid_id(id) {
            return Err(ApiErrorResponse::new(
                404,
                format!(
                    "no VM {}: VM ids are 1 to 64 letters, digits, '.', '_' or '-'",
                    quote(id)
                ),
            ));
        }
        let id = id.to_owned();
        if route == "/vms/{id}/exec" {
            return Ok(FleetRequest::Exec(
                id,
                json::<VmExec>(
                    method,
                    path,
                    body,
                    r#"{"argv": ["uname", "-r"], "timeout_s": 10}"#,
                )?,
            ));
        }
        return Ok(match method {
            "GET" => FleetRequest::Get(id),
            "DELETE" => FleetRequest::Delete(id),
            _ => FleetRequest::Patch(
                id,
                json::<VmPatch>(
                    method,
                    path,
                    body,
                    r#"{"priority": "high", "max_mib": 512}"#,
                )?,
            ),
        });
    }
    Ok(match (method, route) {
        ("GET", "/") => FleetRequest::Info,
        ("GET", "/vms") => FleetRequest::List,
        ("POST", "/vms") => FleetRequest::Create(Box::new(json::<VmCreate>(
            method,
            path,
            body,
            r#"{"kernel": "/boot/vmlinux", "memory_mib": 256, "priority": "low"}"#,
        )?)),
        _ => FleetRequest::Metrics,
    })
}

/// Answers one HTTP request: at once, or for `exec` on a thread of its own once the
/// command ends.
pub fn handle(fleet: &Fleet, req: &HttpRequest) -> Reply {
    let request = match parse_request(&req.method, &req.path, &req.body) {
        Ok(r) => r,
        Err(e) => return ApiResponse::from(e).into(),
    };
    if let FleetRequest::Exec(id, exec) = request {
        return start_exec(fleet, &id, exec);
    }
    let answer = |r: Result<VmInfo, ApiErrorResponse>, status: u16| match r {
        Ok(info) => ApiResponse::json(status, &info),
        Err(e) => e.into(),
    };
    match request {
        FleetRequest::Info => ApiResponse::ok(&fleet.info()),
        FleetRequest::List => ApiResponse::ok(&fleet.lock().registry.list()),
        FleetRequest::Create(spec) => answer(fleet.lock().registry.create(*spec), 201),
        FleetRequest::Get(id) => answer(fleet.lock().registry.get(&id), 200),
        FleetRequest::Patch(id, p) => answer(fleet.lock().registry.patch(&id, p), 200),
        FleetRequest::Delete(id) => answer(fleet.lock().registry.delete(&id), 200),
        FleetRequest::Metrics => ApiResponse::text(CONTENT_TYPE, metrics_text(fleet)),
        FleetRequest::Exec(..) => unreachable!("answered above"),
    }
    .into()
}

/// Checks an exec request and the VM (it exists and runs), then runs the command on a
/// thread of its own: the fleet stays unlocked and its API free meanwhile.
fn start_exec(fleet: &Fleet, id: &str, exec: VmExec) -> Reply {
    let timeout = match crate::exec::check(&exec) {
        Ok(t) => t,
        Err(e) => return ApiResponse::from(e).into(),
    };
    let control = {
        let mut s = fleet.lock();
        match s.registry.get(id) {
            Err(e) => return ApiResponse::from(e).into(),
            Ok(info) if info.status == VmStatus::Exited => {
                return ApiResponse::error(
                    409,
                    format!(
                        "VM {id} has exited ({}); a command runs only in a running VM",
                        info.exit.unwrap_or_default()
                    ),
                )
                .into()
            }
            Ok(_) => match s.registry.vm_mut(id) {
                Some(vm) => vm.control(),
                None => return ApiResponse::error(404, format!("no VM {id}")).into(),
            },
        }
    };
    let id = id.to_owned();
    Reply::Later(Box::new(move || {
        crate::exec::run(control, &id, exec, timeout)
    }))
}

/// The Prometheus exposition of the fleet.
pub fn metrics_text(fleet: &Fleet) -> String {
    let info: FleetInfo = fleet.info();
    let mut s = fleet.lock();
    let vms = s.registry.list();
    let oom: Vec<(String, Option<u64>)> = s
        .registry
        .vms()
        .map(|v| (v.id.clone(), v.cgroup().and_then(|c| c.oom_kills())))
        .collect();
    let counters = s.counters.clone();
    let exits = s.registry.exits_total;
    drop(s);
    let mib = |m: u64| (m << 20) as f64;
    let mut e = Exposition::new();
    if let Some(h) = info.host {
        e.single(
            "densevm_fleet_host_memory_total_bytes",
            "gauge",
            "Host MemTotal.",
            mib(h.mem_total_mib),
        );
        e.single(
            "densevm_fleet_host_memory_available_bytes",
            "gauge",
            "Host MemAvailable at the last tick.",
            mib(h.mem_available_mib),
        );
        e.family(
            "densevm_fleet_host_memory_pressure_avg10",
            "gauge",
            "Host memory PSI avg10 (percent of time stalled), from /proc/pressure/memory.",
        )
        .sample(
            "densevm_fleet_host_memory_pressure_avg10",
            &[("kind", "some")],
            h.psi_some_avg10,
        )
        .sample(
            "densevm_fleet_host_memory_pressure_avg10",
            &[("kind", "full")],
            h.psi_full_avg10,
        );
    }
    let name = "densevm_fleet_watermark_bytes";
    e.family(name, "gauge", "The policy's MemAvailable watermarks.")
        .sample(
            name,
            &[("level", "low")],
            mib(info.policy.low_watermark_mib),
        )
        .sample(
            name,
            &[("level", "high")],
            mib(info.policy.high_watermark_mib),
        );
    let name = "densevm_fleet_policy_mode";
    e.family(name, "gauge", "1 for the host's band at the last tick.");
    for (label, mode) in [
        ("reclaim", HostMode::Reclaim),
        ("hold", HostMode::Hold),
        ("grow", HostMode::Grow),
    ] {
        e.sample(
            name,
            &[("mode", label)],
            f64::from(u8::from(info.mode == Some(mode))),
        );
    }
    e.single(
        "densevm_fleet_cgroup_enabled",
        "gauge",
        "1 when each VM runs under its own cgroup memory.max (the hard stop).",
        f64::from(u8::from(info.cgroup.enabled)),
    );
    let name = "densevm_fleet_vms";
    e.family(name, "gauge", "VMs by status.")
        .sample(name, &[("status", "running")], info.running as f64)
        .sample(name, &[("status", "exited")], info.exited as f64);
    e.single(
        "densevm_fleet_vm_exits_total",
        "counter",
        "VM processes that ended on their own (not through DELETE).",
        exits as f64,
    );
    e.single(
        "densevm_fleet_ticks_total",
        "counter",
        "Policy ticks run.",
        counters.ticks as f64,
    );
    let name = "densevm_fleet_policy_actions_total";
    e.family(
        name,
        "counter",
        "Balloon targets set by the policy, by direction and reason.",
    );
    for k in all_kinds() {
        let n = counters.actions.get(&k).copied().unwrap_or(0);
        e.sample(
            name,
            &[
                ("direction", direction_label(k.0)),
                ("reason", k.1.as_str()),
            ],
            n as f64,
        );
    }
    let name = "densevm_fleet_policy_action_errors_total";
    e.family(
        name,
        "counter",
        "Policy actions a VM refused, by direction and reason.",
    );
    for k in all_kinds() {
        let n = counters.action_errors.get(&k).copied().unwrap_or(0);
        e.sample(
            name,
            &[
                ("direction", direction_label(k.0)),
                ("reason", k.1.as_str()),
            ],
            n as f64,
        );
    }
    for (name, help, map) in [
        (
            "densevm_fleet_policy_budget_actions_total",
            "DRAM budgets set by the policy, by direction and reason.",
            &counters.budget_actions,
        ),
        (
            "densevm_fleet_policy_budget_action_errors_total",
            "Policy DRAM budgets a VM refused, by direction and reason.",
            &counters.budget_action_errors,
        ),
    ] {
        e.family(name, "counter", help);
        for k in budget_kinds() {
            let n = map.get(&k).copied().unwrap_or(0);
            e.sample(
                name,
                &[("direction", k.0.as_str()), ("reason", k.1.as_str())],
                n as f64,
            );
        }
    }
    let running: Vec<&VmInfo> = vms
        .iter()
        .filter(|v| v.status == VmStatus::Running)
        .collect();
    type Getter = fn(&VmInfo) -> Option<f64>;
    let per_vm: [(&str, &str, Getter); 19] = [
        (
            "densevm_fleet_vm_rss_bytes",
            "VMM process RSS (smaps_rollup).",
            |v| Some((v.rss_kib << 10) as f64),
        ),
        (
            "densevm_fleet_vm_pss_bytes",
            "VMM process PSS (smaps_rollup).",
            |v| Some((v.pss_kib << 10) as f64),
        ),
        ("densevm_fleet_vm_memory_bytes", "Guest RAM.", |v| {
            Some((v.memory_mib << 20) as f64)
        }),
        (
            "densevm_fleet_vm_min_bytes",
            "Least guest memory the policy leaves.",
            |v| Some((v.min_mib << 20) as f64),
        ),
        ("densevm_fleet_vm_max_bytes", "Most guest memory.", |v| {
            Some((v.max_mib << 20) as f64)
        }),
        (
            "densevm_fleet_vm_balloon_target_bytes",
            "Balloon target last set.",
            |v| Some((v.balloon_mib << 20) as f64),
        ),
        (
            "densevm_fleet_vm_balloon_actual_bytes",
            "Balloon size the guest reached.",
            |v| v.guest.map(|g| (g.balloon_actual_mib << 20) as f64),
        ),
        (
            "densevm_fleet_vm_guest_free_bytes",
            "Guest free memory.",
            |v| v.guest.map(|g| (g.free_mib << 20) as f64),
        ),
        (
            "densevm_fleet_vm_guest_available_bytes",
            "Guest available memory.",
            |v| v.guest.map(|g| (g.available_mib << 20) as f64),
        ),
        (
            "densevm_fleet_vm_guest_caches_bytes",
            "Guest page cache.",
            |v| v.guest.map(|g| (g.caches_mib << 20) as f64),
        ),
        (
            "densevm_fleet_vm_cpu_percent",
            "VMM CPU over the last tick, percent of one CPU.",
            |v| v.cpu_pct,
        ),
        (
            "densevm_fleet_vm_memory_budget_bytes",
            "DRAM budget of the VM's RAM now (the policy may have lowered it).",
            |v| v.memory_budget_mib.map(|m| (m << 20) as f64),
        ),
        (
            "densevm_fleet_vm_memory_budget_user_bytes",
            "DRAM budget the user set.",
            |v| v.memory_budget_user_mib.map(|m| (m << 20) as f64),
        ),
        (
            "densevm_fleet_vm_tier_resident_bytes",
            "Guest RAM resident in DRAM (the tier's count, last tick).",
            |v| v.tier.map(|t| (t.resident_kib << 10) as f64),
        ),
        (
            "densevm_fleet_vm_tier_compressed_bytes",
            "DRAM the tier's compressed store takes.",
            |v| v.tier.map(|t| (t.compressed_kib << 10) as f64),
        ),
        (
            "densevm_fleet_vm_tier_swap_bytes",
            "Guest RAM in the tier's swap file.",
            |v| v.tier.map(|t| (t.swap_pages << 12) as f64),
        ),
        (
            "densevm_fleet_vm_tier_missing_faults_total",
            "Accesses to guest pages out of DRAM, served by the tier.",
            |v| v.tier.map(|t| t.missing_faults as f64),
        ),
        (
            "densevm_fleet_vm_tier_evictions_total",
            "Guest pages that left DRAM (zero, compressed or to the swap file).",
            |v| v.tier.map(|t| t.evicted as f64),
        ),
        (
            "densevm_fleet_vm_tier_service_cpu_seconds_total",
            "CPU time of the tier's service thread.",
            |v| v.tier.map(|t| t.service_cpu_us as f64 / 1e6),
        ),
    ];
    for (name, help, get) in per_vm {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let samples: Vec<(&VmInfo, f64)> = running
            .iter()
            .filter_map(|v| get(v).map(|x| (*v, x)))
            .collect();
        if samples.is_empty() {
            continue;
        }
        e.family(name, kind, help);
        for (v, x) in samples {
            e.sample(name, &[("vm", &v.id), ("priority", v.priority.as_str())], x);
        }
    }
    let ooms: Vec<(String, u64)> = oom
        .into_iter()
        .filter_map(|(id, n)| Some((id, n?)))
        .collect();
    if !ooms.is_empty() {
        let name = "densevm_fleet_vm_oom_kills_total";
        e.family(
            name,
            "counter",
            "OOM kills in the VM's cgroup (memory.events oom_kill).",
        );
        for (id, n) in ooms {
            e.sample(name, &[("vm", &id)], n as f64);
        }
    }
    e.finish()
}
