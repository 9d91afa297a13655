//! Error paths of the CLI: each bad input ends with one `densevm: error: ...` line that
//! names the problem and says each cause once (issue #15: causes were printed twice, e.g.
//! "No such file or directory (os error 2): No such file or directory (os error 2)").

mod common;

use common::{densevm, stderr};

/// Runs `densevm ARGS`, expects failure, returns its error line.
fn error_line(args: &[&str]) -> String {
    let out = densevm().args(args).output().unwrap();
    assert!(!out.status.success(), "densevm {args:?} succeeded");
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("densevm: error: "))
        .unwrap_or_else(|| panic!("densevm {args:?}: no error line in {err:?}"))
        .to_string();
    let segments: Vec<&str> = line["densevm: error: ".len()..].split(": ").collect();
    for (i, a) in segments.iter().enumerate() {
        for b in &segments[i + 1..] {
            assert!(
                a.len() < 4 || a != b,
                "densevm {args:?} repeats `{a}`: {line}"
            );
        }
    }
    line
}

#[test]
fn every_cause_is_said_once() {
    let dir = std::env::temp_dir().join(format!("densevm-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.pcow");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    let junk = junk.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--probe", "exit 0", "--pmem", "/nonexistent"],
            "cannot open --pmem image /nonexistent",
        ),
        (&["run", "--kernel", "/dev/null"], "kernel /dev/null"),
        (
            &["run", "--kernel", "/nonexistent"],
            "No such file or directory",
        ),
        (&["image", "info", "/nonexistent"], "/nonexistent"),
        (&["image", "info", junk], "junk.pcow"),
        (&["image", "check", junk], "junk.pcow"),
        (
            &["image", "create", "/nonexistent/x.pcow", "1M"],
            "/nonexistent/x.pcow",
        ),
        (&["run", "--restore", "/nonexistent"], "/nonexistent/state"),
        (
            &["vm", "info", "--api-sock", "/nonexistent.sock"],
            "no API socket",
        ),
        (
            &["run", "--kernel", "/dev/null", "--disk", "/nonexistent"],
            "disk image /nonexistent does not exist",
        ),
    ];
    for (args, names) in cases {
        let line = error_line(args);
        assert!(
            line.contains(names),
            "densevm {args:?}: `{names}` not in: {line}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
