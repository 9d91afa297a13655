//! The route table: method + path + body to a typed [`ApiRequest`], or the error response
//! to send. Pure (no I/O), so it is fuzzed together with the HTTP reader.

use serde::de::DeserializeOwned;

use crate::types::{
    Balloon, BalloonStatsUpdate, BalloonUpdate, CloneRequest, MemoryTierUpdate, SnapshotCreate,
    VmStateChange, MAX_CLONES,
};

/// A request whose route is decided and whose body is parsed and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiRequest {
    /// `GET /`: answer with an [`InstanceInfo`](crate::InstanceInfo).
    GetInfo,
    /// `PATCH /vm`: pause or resume.
    PatchVm(VmStateChange),
    /// `PUT /snapshot/create`.
    CreateSnapshot(SnapshotCreate),
    /// `POST /clones`.
    CreateClones(CloneRequest),
    /// `PUT /balloon`: set up the balloon (target and options).
    PutBalloon(Balloon),
    /// `PATCH /balloon`: a new balloon target.
    PatchBalloon(BalloonUpdate),
    /// `GET /balloon`: answer with the balloon's [`Balloon`] settings.
    GetBalloon,
    /// `GET /balloon/statistics`: answer with a [`BalloonStats`](crate::BalloonStats).
    GetBalloonStats,
    /// `PATCH /balloon/statistics`: a new statistics polling interval.
    PatchBalloonStats(BalloonStatsUpdate),
    /// `GET /memory-tier`: answer with a [`MemoryTierInfo`](crate::MemoryTierInfo).
    GetMemoryTier,
    /// `PATCH /memory-tier`: a new DRAM budget.
    PatchMemoryTier(MemoryTierUpdate),
    /// `GET /vsock`: answer with a [`VsockInfo`](crate::VsockInfo).
    GetVsock,
}

/// An error to answer with: status and the `fault_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiErrorResponse {
    /// HTTP status (400, 404, 405, ...).
    pub status: u16,
    /// What went wrong and what to do about it.
    pub message: String,
}

impl ApiErrorResponse {
    /// An error with this status and message.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// A 400 with this message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
}

/// Every resource and the methods it takes (docs/api/openapi.yaml documents each; a test
/// checks that it does).
pub const ROUTES: &[(&str, &[&str])] = &[
    ("/", &["GET"]),
    ("/vm", &["PATCH"]),
    ("/snapshot/create", &["PUT"]),
    ("/clones", &["POST"]),
    ("/balloon", &["PUT", "PATCH", "GET"]),
    ("/balloon/statistics", &["GET", "PATCH"]),
    ("/memory-tier", &["GET", "PATCH"]),
    ("/vsock", &["GET"]),
];

/// Longest piece of a client's path quoted back in a message.
const MAX_QUOTED_PATH: usize = 128;

/// Decides the route of one request and parses its body. Query strings are ignored and a
/// trailing `/` is dropped (`/vm/` is `/vm`). 404 for an unknown path (naming the known
/// ones), 405 for a known path with another method (naming the one that works), 400 for
/// a body that is not the JSON the route takes (with serde's message) or whose values are
/// out of range.
pub fn parse_route(method: &str, path: &str, body: &[u8]) -> Result<ApiRequest, ApiErrorResponse> {
    let path = normalize(path);
    let Some(&(path, allowed)) = ROUTES.iter().find(|(p, _)| *p == path) else {
        return Err(ApiErrorResponse::new(
            404,
            format!(
                "no resource at {}; densevm's API has: {}",
                quote(path),
                known_routes(ROUTES)
            ),
        ));
    };
    check_method(method, path, allowed)?;
    match (method, path) {
        ("GET", "/") => Ok(ApiRequest::GetInfo),
        ("PATCH", "/vm") => json::<VmStateChange>(method, path, body, r#"{"state": "Paused"}"#)
            .map(ApiRequest::PatchVm),
        ("PUT", "/snapshot/create") => {
            let s = json::<SnapshotCreate>(method, path, body, r#"{"snapshot_path": "DIR"}"#)?;
            check_snapshot(&s)?;
            Ok(ApiRequest::CreateSnapshot(s))
        }
        ("POST", "/clones") => {
            let c = json::<CloneRequest>(
                method,
                path,
                body,
                r#"{"count": 4, "snapshot_path": "DIR"}"#,
            )?;
            check_clones(&c)?;
            Ok(ApiRequest::CreateClones(c))
        }
        ("PUT", "/balloon") => json::<Balloon>(
            method,
            path,
            body,
            r#"{"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#,
        )
        .map(ApiRequest::PutBalloon),
        ("PATCH", "/balloon") => json::<BalloonUpdate>(method, path, body, r#"{"amount_mib": 64}"#)
            .map(ApiRequest::PatchBalloon),
        ("GET", "/balloon") => Ok(ApiRequest::GetBalloon),
        ("GET", "/balloon/statistics") => Ok(ApiRequest::GetBalloonStats),
        ("GET", "/memory-tier") => Ok(ApiRequest::GetMemoryTier),
        ("GET", "/vsock") => Ok(ApiRequest::GetVsock),
        ("PATCH", "/memory-tier") => {
            let u = json::<MemoryTierUpdate>(method, path, body, r#"{"budget_mib": 128}"#)?;
            if u.budget_mib < 4 {
                return Err(ApiErrorResponse::bad_request(format!(
                    "budget_mib {} is below the 4 MiB minimum of a memory budget",
                    u.budget_mib
                )));
            }
            Ok(ApiRequest::PatchMemoryTier(u))
        }
        _ => json::<BalloonStatsUpdate>(method, path, body, r#"{"stats_polling_interval_s": 1}"#)
            .map(ApiRequest::PatchBalloonStats),
    }
}

/// 405 unless `method` is one of `allowed` (the methods `path` takes), naming those.
pub fn check_method(method: &str, path: &str, allowed: &[&str]) -> Result<(), ApiErrorResponse> {
    if allowed.contains(&method) {
        return Ok(());
    }
    Err(ApiErrorResponse::new(
        405,
        format!(
            "{} {} is not allowed: {path} takes {} only",
            quote(method),
            path,
            allowed.join(", ")
        ),
    ))
}

fn check_snapshot(s: &SnapshotCreate) -> Result<(), ApiErrorResponse> {
    if s.mem_file_path.is_some() {
        return Err(ApiErrorResponse::bad_request(
            "densevm keeps the memory file inside snapshot_path (a directory holding `state` \
             and `memory`); Firecracker users: pass only snapshot_path, without mem_file_path",
        ));
    }
    if s.snapshot_path.is_empty() {
        return Err(ApiErrorResponse::bad_request(
            "snapshot_path is empty: name the directory the snapshot goes to",
        ));
    }
    Ok(())
}

fn check_clones(c: &CloneRequest) -> Result<(), ApiErrorResponse> {
    if c.count == 0 || c.count > MAX_CLONES {
        return Err(ApiErrorResponse::bad_request(format!(
            "count is {}: ask for 1 to {MAX_CLONES} clones per request",
            c.count
        )));
    }
    if c.snapshot_path.is_empty() {
        return Err(ApiErrorResponse::bad_request(
            "snapshot_path is empty: name a directory made by PUT /snapshot/create with \
             \"snapshot_type\": \"Template\"",
        ));
    }
    for (i, o) in c.network_overrides.iter().enumerate() {
        if c.network_overrides[..i]
            .iter()
            .any(|p| p.iface_id == o.iface_id)
        {
            return Err(ApiErrorResponse::bad_request(format!(
                "network_overrides names {} twice",
                quote(&o.iface_id)
            )));
        }
        if c.count > 1 && !o.host_dev_name.contains("{index}") {
            return Err(ApiErrorResponse::bad_request(format!(
                "network_overrides: {} would put all {} clones on tap {}, and a tap serves \
                 one VM: put {{index}} in host_dev_name (e.g. \"tap-c{{index}}\")",
                quote(&o.iface_id),
                c.count,
                quote(&o.host_dev_name)
            )));
        }
        let longest = o.for_clone(c.count.saturating_sub(1));
        if o.host_dev_name.is_empty() || longest.len() > 15 || longest.contains(['/', ' ', '\0']) {
            return Err(ApiErrorResponse::bad_request(format!(
                "network_overrides: host_dev_name {} is not a tap name (1 to 15 bytes once \
                 {{index}} is replaced, no '/' or spaces)",
                quote(&o.host_dev_name)
            )));
        }
    }
    Ok(())
}

/// Parses a request body as `T`: 400 for an empty body (showing `example`) or JSON that is
/// not a `T` (with serde's message).
pub fn json<T: DeserializeOwned>(
    method: &str,
    path: &str,
    body: &[u8],
    example: &str,
) -> Result<T, ApiErrorResponse> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiErrorResponse::bad_request(format!(
            "{method} {path} needs a JSON body, e.g. {example}"
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiErrorResponse::bad_request(format!(
            "bad JSON body for {method} {path}: {e} (e.g. {example})"
        ))
    })
}

/// The path without its query string or fragment, and without one trailing `/`.
pub fn normalize(path: &str) -> &str {
    let end = path.find(['?', '#']).unwrap_or(path.len());
    let path = &path[..end];
    match path.strip_suffix('/') {
        Some(p) if !p.is_empty() => p,
        _ => path,
    }
}

/// "GET /, PATCH /vm, ...": every route of a table, for a 404's message.
pub fn known_routes(routes: &[(&str, &[&str])]) -> String {
    let list: Vec<String> = routes
        .iter()
        .flat_map(|(p, ms)| ms.iter().map(move |m| format!("{m} {p}")))
        .collect();
    list.join(", ")
}

/// A client-chosen string cut to a sane length for a message.
pub fn quote(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED_PATH) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_strips_query_fragment_and_trailing_slash() {
        assert_eq!(normalize("/vm?x=1"), "/vm");
        assert_eq!(normalize("/vm/"), "/vm");
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize("/?a"), "/");
        assert_eq!(normalize("/clones#f"), "/clones");
        assert_eq!(normalize(""), "");
    }

    #[test]
    fn quote_cuts_long_strings_on_a_char_boundary() {
        let long = "é".repeat(300);
        let q = quote(&long);
        assert!(q.ends_with("..."));
        assert_eq!(q.chars().count(), MAX_QUOTED_PATH + 3);
    }
}
