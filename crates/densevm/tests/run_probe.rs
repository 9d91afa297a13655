//! `densevm run --probe` on /dev/kvm: exit codes, SMP, serial output, memory contents,
//! failure exits, trace points and the memory report.

mod common;

use common::{densevm, run_probe, stderr, stdout};
use densevm_probe::probe_checksum;

#[test]
fn exits_with_the_code_the_guest_asked_for() {
    for code in [0, 7, 255] {
        let out = run_probe(&["--probe", &format!("exit {code}")]);
        assert_eq!(out.status.code(), Some(code), "stderr: {}", stderr(&out));
    }
}

#[test]
fn serial_output_carries_checksums_of_guest_writes() {
    let out = run_probe(&[
        "--memory",
        "64M",
        "--probe",
        "write ram 4K 8K 0xab; sum ram 4K 8K; sum ram 1M 4100; exit 0",
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    let written = probe_checksum(&[0xab; 8192]);
    assert!(
        text.contains(&format!("sum ram 4K 8K = {written:016x}")),
        "stdout: {text}"
    );
    let zeros = probe_checksum(&[0; 4100]);
    assert!(
        text.contains(&format!("sum ram 1M 4100 = {zeros:016x}")),
        "stdout: {text}"
    );
}

/// The guest's range loops (a `rep stosq`, 8 words a turn) and their ends: lengths that
/// are not multiples of 64 or 8, and a sum reaching past what was written.
#[test]
fn range_loops_are_exact_at_every_length() {
    use densevm_probe::abi::FILL_ADDR_MUL;
    let out = run_probe(&[
        "--memory",
        "64M",
        "--probe",
        "write ram 2M 4103 0x5c; sum ram 2M 4103; sum ram 2M 4200; \
         fill-addr ram 3M 4104; sum ram 3M 4104; sum ram 3M 4101; exit 0",
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    let mut written = vec![0x5c; 4103];
    let expect = |line: String| assert!(text.contains(&line), "no `{line}` in: {text}");
    expect(format!(
        "sum ram 2M 4103 = {:016x}",
        probe_checksum(&written)
    ));
    written.resize(4200, 0);
    expect(format!(
        "sum ram 2M 4200 = {:016x}",
        probe_checksum(&written)
    ));
    let base = densevm_vmm::boot::probe::WORKLOAD_BASE + (3 << 20);
    let words: Vec<u8> = (base..base + 4104)
        .step_by(8)
        .flat_map(|a| a.wrapping_mul(FILL_ADDR_MUL).to_le_bytes())
        .collect();
    expect(format!("sum ram 3M 4104 = {:016x}", probe_checksum(&words)));
    expect(format!(
        "sum ram 3M 4101 = {:016x}",
        probe_checksum(&words[..4101])
    ));
}

#[test]
fn smp_guest_runs_on_every_vcpu() {
    let out = run_probe(&[
        "--cpus",
        "3",
        "--memory",
        "64M",
        "--probe",
        "touch 12M; read ram 0 12M; exit 5",
    ]);
    assert_eq!(out.status.code(), Some(5), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("probe: 3 cpu(s) online"), "stdout: {text}");
    assert!(
        text.contains("touch ram 0 12M: 3072 pages"),
        "stdout: {text}"
    );
}

#[test]
fn all_vcpus_halting_ends_the_vm_cleanly() {
    let out = run_probe(&["--cpus", "2", "--probe", "touch 1M"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
}

#[test]
fn i8042_reset_ends_the_vm() {
    let out = run_probe(&["--probe", "touch 1M; reset; exit 9", "--json"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    assert_eq!(doc["end"], "guest requested a reset");
}

#[test]
fn triple_fault_is_a_clear_error() {
    let out = run_probe(&["--probe", "crash triple-fault; exit 0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("triple-faulted (KVM_EXIT_SHUTDOWN)"),
        "stderr: {}",
        stderr(&out)
    );
}

#[test]
fn unhandled_instruction_is_a_clear_error() {
    // Executing from guest-physical memory with nothing behind it: KVM cannot emulate
    // the instruction fetch and reports KVM_EXIT_INTERNAL_ERROR.
    let out = run_probe(&["--probe", "crash mmio-exec; exit 0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("KVM internal error"),
        "stderr: {}",
        stderr(&out)
    );
}

#[test]
fn guest_exceptions_are_reported_with_their_vector() {
    // int3 with the probe's IDT: on hardware KVM the probe's #BP handler reports it; on
    // PVM, KVM refuses to emulate int3 at CPL0. Either way a clear error, exit code 1.
    let out = run_probe(&["--probe", "crash int3; exit 0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("#BP") || err.contains("KVM internal error"),
        "stderr: {err}"
    );
}

#[test]
fn trace_and_memory_report_json() {
    let dir = std::env::temp_dir().join(format!("densevm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("report.json");
    let out = run_probe(&[
        "--memory",
        "128M",
        "--probe",
        "touch 16M; exit 0",
        "--trace",
        "--report",
        "--report-json",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("vcpu0_first_entry") && err.contains("VMM overhead"),
        "stderr: {err}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    for key in ["rss_kib", "uss_kib", "pss_kib"] {
        assert!(doc[key].as_u64().unwrap() > 0, "{key} missing in {doc}");
    }
    // 16 MiB touched by the guest must show up as guest memory, not VMM overhead.
    let guest_rss = doc["guest"]["rss_kib"].as_u64().unwrap();
    assert!(guest_rss >= 16 * 1024, "guest rss {guest_rss} KiB");
    assert!(doc["uss_kib"].as_u64().unwrap() >= guest_rss);
    // The VMM's own anonymous memory (heap, stacks) is part of its overhead, guest RAM not.
    let anon = doc["vmm_overhead"]["anon_kib"].as_u64().unwrap();
    assert!(anon > 0 && anon < 16 * 1024, "vmm anon {anon} KiB: {doc}");
    let trace = doc["trace_ms"].as_object().unwrap();
    let t = |k: &str| {
        trace[k]
            .as_f64()
            .unwrap_or_else(|| panic!("trace point {k} missing: {doc}"))
    };
    assert!(t("vmm_start") <= t("build_start"));
    assert!(t("build_start") <= t("vm_ready"));
    assert!(t("vm_ready") <= t("vcpu0_first_entry"));
    assert!(t("vcpu0_first_entry") <= t("probe_start"));
    assert!(t("probe_start") <= t("probe_done"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn memory_flag_errors_are_clear() {
    for (arg, needle) in [
        ("12Q", "not a size"),
        ("100", "too small"),
        ("10000001", "multiple of 4K"),
        ("4097K", "multiple of 4K"),
        ("2T", "not supported"),
    ] {
        let out = densevm()
            .args(["run", "--memory", arg, "--probe"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--memory {arg}");
        let err = stderr(&out);
        assert!(
            err.contains("--memory") && err.contains(needle),
            "--memory {arg}: {err}"
        );
    }
}

#[test]
fn script_and_layout_errors_are_clear() {
    let out = run_probe(&["--probe", "touch 1M; frobnicate"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unknown command `frobnicate`"),
        "{}",
        stderr(&out)
    );
    let out = run_probe(&["--memory", "16M", "--probe", "touch 64M"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("outside region `ram`"),
        "{}",
        stderr(&out)
    );
    let out = run_probe(&["--memory", "2M", "--probe"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("at least"), "{}", stderr(&out));
}
