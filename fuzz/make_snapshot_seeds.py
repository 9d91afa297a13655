#!/usr/bin/env python3
"""Writes the seed corpus of the snapshot_state fuzz target (fuzz/corpus/snapshot_state).

    python3 fuzz/make_snapshot_seeds.py [--densevm PATH] [--kernel VMLINUX --initrd INITRD] OUT_DIR

Needs /dev/kvm. It runs densevm VMs and snapshots them through their API socket; the state
files they write are the `valid-*` seeds: a 1-vCPU probe, a paused 3-vCPU probe and, when a
kernel is given (default build/guest/vmlinux and initrd.cpio.gz), a Linux guest with a
readonly virtio-blk disk and virtio-rng (irqchip, CMOS, PCI root, two virtio-pci
functions). Every other seed is derived from those: damaged containers (truncated, wrong
CRC, version, length, trailing bytes) and payloads edited as JSON and sealed behind a right
header, each aimed at one check of the decoder or of a restore.
"""
import argparse
import copy
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

MAGIC = b"DENSEVM-SNAPSHOT"
HEADER_LEN = 32


def crc32c(data):
    table = crc32c.table
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


crc32c.table = _table()


def seal(payload, version=1, length=None, crc=None):
    """`payload` behind a header; `version`, `length` and `crc` override the right values."""
    length = len(payload) if length is None else length
    crc = crc32c(payload) if crc is None else crc
    return MAGIC + struct.pack("<IQI", version, length, crc) + payload


def enc(state):
    return json.dumps(state, separators=(",", ":")).encode()


def wait_socket(path, proc, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"densevm exited ({proc.returncode}) before serving {path}")
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"no API socket at {path}")


def capture(densevm, work, name, run_args, settle, pause=False):
    """Runs a VM, snapshots it after `settle` seconds, returns its state file's bytes."""
    sock = os.path.join(work, name + ".sock")
    snap = os.path.join(work, name)
    proc = subprocess.Popen([densevm, "run", "--api-sock", sock] + run_args,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_socket(sock, proc)
        time.sleep(settle)
        if pause:
            subprocess.run([densevm, "vm", "pause", "--api-sock", sock], check=True,
                           stdout=subprocess.DEVNULL)
        subprocess.run([densevm, "vm", "snapshot", "--api-sock", sock, "--dir", snap],
                       check=True, stdout=subprocess.DEVNULL)
    finally:
        proc.kill()
        proc.wait()
    with open(os.path.join(snap, "state"), "rb") as f:
        return f.read()


def derived(valid):
    """name -> bytes of every seed derived from the valid states."""
    seeds = {}
    probe = valid["valid-probe-1cpu"]
    payload = probe[HEADER_LEN:]
    state = json.loads(payload)

    # The container.
    seeds["container-empty"] = b""
    seeds["container-magic-only"] = probe[:16]
    seeds["container-header-only"] = probe[:HEADER_LEN]
    seeds["container-truncated-payload"] = probe[: HEADER_LEN + len(payload) // 2]
    flipped = bytearray(probe)
    flipped[HEADER_LEN + len(payload) // 3] ^= 0x20
    seeds["container-crc-mismatch"] = bytes(flipped)
    seeds["container-version-99"] = seal(payload, version=99)
    seeds["container-length-huge"] = seal(payload, length=(1 << 64) - 1)
    seeds["container-length-short"] = seal(payload, length=len(payload) - 1)
    seeds["container-trailing-bytes"] = probe + b"\n"
    seeds["container-no-header"] = payload
    seeds["container-empty-payload"] = seal(b"")
    seeds["container-not-json"] = seal(b"\xff\xfe not json")

    # Payloads that decode but a restore refuses, or that push the decoder's edges.
    def edit(name, fn, base=state):
        s = copy.deepcopy(base)
        fn(s)
        seeds[name] = seal(enc(s))

    edit("json-zero-vcpus", lambda s: s.update(vcpus=[]))
    minimal_vcpu = [[], "", "", "", [], None, "", None, [], "", None]
    edit("json-255-minimal-vcpus", lambda s: s.update(vcpus=[minimal_vcpu] * 255))
    edit("json-linux-without-irqchip", lambda s: s.update(linux=True, irqchip=False))
    edit("json-no-ram-region",
         lambda s: s.update(regions=[{"name": "kernel.0", "gpa": 0, "size": 4096}]))
    edit("json-region-at-top",
         lambda s: s["regions"].append({"name": "ram.9", "gpa": (1 << 64) - 4096, "size": 1 << 63}))
    edit("json-other-cpu", lambda s: s["host_cpu"].update(vendor="AuthenticAMD", family=0x19))
    edit("json-memory-bytes-too-big", lambda s: s.update(memory_bytes=1 << 64))
    edit("json-memory-bytes-negative", lambda s: s.update(memory_bytes=-1))
    edit("json-missing-field", lambda s: s.pop("legacy"))
    edit("json-unknown-field", lambda s: s.update(extra={"a": [1, 2, 3]}))

    def kvm_as_strings(s):
        v = s["vcpus"][0]
        for k in ("regs", "sregs", "debugregs", "vcpu_events", "mp_state"):
            v[k] = ""
        v["cpuid"] = ["", "\u00ff\u0000"]
        v["msrs"] = [[16], ""]
    edit("json-kvm-structs-as-strings", kvm_as_strings)
    edit("json-kvm-struct-too-long", lambda s: s["vcpus"][0].update(regs=[0] * 200))
    edit("json-kvm-struct-byte-256", lambda s: s["vcpus"][0].update(regs=[256]))
    edit("json-xsave-huge-words", lambda s: s["vcpus"][0].update(xsave=[4294967295, 4294967296]))
    edit("json-serial-long-input", lambda s: s["legacy"]["serial"].update(in_buffer=[65] * 100))
    edit("json-serial-eight-registers", lambda s: s["legacy"]["serial"].update(registers=[0] * 8))
    edit("json-deep-device-specs", lambda s: s.update(device_specs=json.loads("[" * 200 + "]" * 200)))
    edit("json-name-escapes", lambda s: s["regions"][0].update(name="ram\u0000\ud7ff\"\\"))
    seeds["json-duplicate-field"] = seal(enc(state)[:-1] + b',"vcpus":[]}')
    seeds["json-struct-as-array"] = seal(enc([state[k] for k in state]))
    seeds["json-lone-surrogate"] = seal(enc(state).replace(b'"ram"', b'"ram\\ud800"', 1))

    linux = valid.get("valid-linux-blk-rng")
    if linux is not None:
        ls = json.loads(linux[HEADER_LEN:])
        edit("json-linux-cmos-short", lambda s: s["legacy"]["cmos"].update(nvram=[0] * 127), ls)
        edit("json-linux-cmos-index-high", lambda s: s["legacy"]["cmos"].update(index=255), ls)
        edit("json-linux-pci-host-bridge", lambda s: s["pci"]["host_bridge"].__setitem__(0, 0), ls)
        edit("json-linux-pci-no-slots", lambda s: s["pci"].update(slots=[], host_bridge=[0] * 65), ls)
        edit("json-linux-virtio-type", lambda s: s["virtio"][0].update(device_type=9), ls)
        edit("json-linux-virtio-dropped", lambda s: s.update(virtio=[]), ls)
        edit("json-linux-device-specs-junk",
             lambda s: s.update(device_specs={"disks": [{"path": 7}], "rng": "yes"}), ls)
    return seeds


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--densevm", default=os.path.join(root, "target/release/densevm"))
    ap.add_argument("--kernel", default=os.path.join(root, "build/guest/vmlinux"))
    ap.add_argument("--initrd", default=os.path.join(root, "build/guest/initrd.cpio.gz"))
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="densevm-seeds-")
    try:
        valid = {
            "valid-probe-1cpu": capture(
                args.densevm, work, "probe1",
                ["--memory", "64M", "--probe", "touch 8M; sleep 3000; exit 0"], 0.5),
            "valid-probe-3cpu-paused": capture(
                args.densevm, work, "probe3",
                ["--memory", "96M", "--cpus", "3", "--probe", "touch 4M; sleep 3000; exit 0"],
                0.5, pause=True),
        }
        if os.path.exists(args.kernel) and os.path.exists(args.initrd):
            disk = os.path.join(work, "disk.img")
            with open(disk, "wb") as f:
                f.truncate(4 << 20)
            valid["valid-linux-blk-rng"] = capture(
                args.densevm, work, "linux",
                ["--memory", "256M", "--kernel", args.kernel, "--initrd", args.initrd,
                 "--rng", "--disk", disk + ",readonly", "--timeout", "60"], 5)
        else:
            print(f"no {args.kernel}: no Linux seed", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    os.makedirs(args.out, exist_ok=True)
    seeds = dict(valid)
    seeds.update(derived(valid))
    for name, data in sorted(seeds.items()):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {args.out} ({sum(map(len, seeds.values()))} bytes)")


if __name__ == "__main__":
    main()
