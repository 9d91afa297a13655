//! Helpers shared by the CLI integration tests.

#![allow(dead_code)]

use std::process::{Command, Output};

/// Path of the densevm binary under test.
pub fn densevm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_densevm"))
}

/// Fails (never skips) when /dev/kvm is unusable, saying what is missing.
pub fn require_kvm() {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => {}
        Err(e) => panic!(
            "this test needs a usable /dev/kvm ({e}); load the kvm module (kvm_intel, kvm_amd or \
             kvm_pvm) and run as a user with access to /dev/kvm"
        ),
    }
}

/// Runs `densevm run` with a timeout guard and returns its output.
pub fn run_probe(args: &[&str]) -> Output {
    require_kvm();
    let mut cmd = densevm();
    cmd.arg("run").arg("--timeout").arg("600").args(args);
    cmd.output().expect("densevm binary runs")
}

/// Stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts that `densevm image check PATH` finds the image clean (exit 0); `context`
/// prefixes the failure message.
pub fn assert_image_clean(path: &std::path::Path, context: &str) {
    let out = densevm()
        .args(["image", "check", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{context}check {}: {}{}",
        path.display(),
        stdout(&out),
        stderr(&out)
    );
}

/// A directory under the system temp dir, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);
impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("densevm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}
impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

/// Waits until `file` contains `text` (at most 180 s: on a PVM host the probe's 16 MiB
/// write or sum alone take about 10 s, and over 60 s at load 7, seen in a CI run while other
/// builds and benchmarks shared the two cores).
pub fn wait_for(file: &std::path::Path, text: &str) {
    let t0 = std::time::Instant::now();
    loop {
        let got = std::fs::read_to_string(file).unwrap_or_default();
        if got.contains(text) {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(180),
            "no `{text}` in {} after 180 s:\n{got}",
            file.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Runs `densevm vm ARGS --api-sock SOCK`, asserting success; returns stdout.
pub fn vm(args: &[&str], sock: &std::path::Path) -> String {
    let out = densevm()
        .arg("vm")
        .args(args)
        .arg("--api-sock")
        .arg(sock)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "densevm vm {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// Waits until `console` holds `text` and the rest of its line (the console is written
/// as the guest prints: the checksum after `text` may not be there yet).
pub fn wait_for_line(console: &std::path::Path, text: &str) {
    wait_for(console, text);
    let t = std::time::Instant::now();
    loop {
        let all = std::fs::read_to_string(console).unwrap();
        let rest = &all[all.find(text).unwrap_or(0)..];
        if rest.contains('\n') {
            return;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{}: the line starting with `{text}` never ended: {rest}",
            console.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
