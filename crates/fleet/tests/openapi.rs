//! docs/api/openapi.yaml documents exactly the routes of both route tables (the per-VM
//! API's and the fleet's), so neither can drift from the file.

use std::collections::BTreeSet;

/// (path, method) pairs under `paths:` (keys at two spaces, methods at four).
fn documented(yaml: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut in_paths = false;
    let mut path = None;
    for line in yaml.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            in_paths = line == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':')) {
            if p.starts_with('/') {
                path = Some(p.to_owned());
                continue;
            }
        }
        if let Some(m) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')) {
            if ["get", "put", "post", "patch", "delete"].contains(&m) {
                let p = path.clone().expect("a method before any path");
                out.insert((p, m.to_uppercase()));
            }
        }
    }
    out
}

#[test]
fn every_route_is_documented_and_nothing_else() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api/openapi.yaml");
    let yaml = std::fs::read_to_string(file).expect("docs/api/openapi.yaml");
    let docs = documented(&yaml);
    let mut routes = BTreeSet::new();
    for table in [densevm_api::request::ROUTES, densevm_fleet::api::ROUTES] {
        for (path, methods) in table {
            for m in *methods {
                routes.insert((path.to_string(), m.to_string()));
            }
        }
    }
    let missing: Vec<_> = routes.difference(&docs).collect();
    assert!(
        missing.is_empty(),
        "routes missing from {file}: {missing:?}"
    );
    let extra: Vec<_> = docs.difference(&routes).collect();
    assert!(
        extra.is_empty(),
        "{file} documents routes no parser has: {extra:?}"
    );
    assert!(docs.len() >= 15, "{docs:?}");
}

#[test]
fn the_scanner_reads_paths_and_methods() {
    let yaml = "openapi: 3.0.3\npaths:\n  /a:\n    get:\n      x: 1\n    parameters:\n  /b/{id}:\n    delete:\ncomponents:\n  /c:\n    get:\n";
    let got = documented(yaml);
    let want: BTreeSet<(String, String)> = [("/a", "GET"), ("/b/{id}", "DELETE")]
        .iter()
        .map(|(p, m)| (p.to_string(), m.to_string()))
        .collect();
    assert_eq!(got, want);
}
