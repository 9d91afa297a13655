//! Builds the freestanding probe guest (C + asm, linked at its load address with
//! `guest/probe.ld`) into a flat binary that the VMM embeds.

use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("failed to start {cmd:?}: {e} (is build-essential installed?)"));
    assert!(status.success(), "{cmd:?} failed with {status}");
}

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let guest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("guest");
    for f in ["abi.h", "start.S", "probe.c", "probe.ld"] {
        println!("cargo:rerun-if-changed=guest/{f}");
    }
    // Let the cc crate pick the host C compiler (honours CC / TARGET settings).
    let compiler = cc::Build::new().get_compiler();
    let elf = out.join("probe.elf");
    let mut cmd = compiler.to_command();
    cmd.args([
        "-O2",
        "-ffreestanding",
        "-fno-pic",
        "-fno-pie",
        "-no-pie",
        "-nostdlib",
        "-static",
        "-mno-red-zone",
        "-mgeneral-regs-only",
        "-fno-stack-protector",
        "-fno-asynchronous-unwind-tables",
        "-fcf-protection=none",
        "-mcmodel=small",
        "-Wall",
        "-Werror",
        "-Wl,--build-id=none",
        "-Wl,-z,noexecstack",
        "-Wl,--no-warn-rwx-segments",
    ])
    .arg(format!("-Wl,-T,{}", guest.join("probe.ld").display()))
    .arg(guest.join("start.S"))
    .arg(guest.join("probe.c"))
    .arg("-o")
    .arg(&elf);
    // The compiler's own flags from the environment (e.g. CFLAGS=-fsanitize) must not leak in.
    cmd.env_remove("CFLAGS");
    run(&mut cmd);
    run(Command::new("objcopy")
        .args(["-O", "binary"])
        .arg(&elf)
        .arg(out.join("probe.bin")));
}
