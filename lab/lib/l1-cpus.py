#!/usr/bin/env python3
"""l1-cpus.py MONITOR_SOCKET FULL_OUT: where L1's vCPUs are, asked of QEMU's HMP monitor.

Writes the full `info registers -a` (three samples, 1 s apart) to FULL_OUT and prints one
line per vCPU and sample: RIP, RFLAGS with its IF bit spelled out, HLT. lab/run calls it
when L1 stalls or times out, before it stops QEMU, so that a CI log tells an L1 spinning
with interrupts off from an idle one. Exits 0 even when the monitor does not answer.
"""
import re
import socket
import sys
import time


def clean(raw):
    # HMP echoes the typed command with cursor escapes; drop them.
    return re.sub(rb"\x1b\[[0-9;]*[A-Za-z]", b"", raw).decode(errors="replace")


def read_until(sock, done):
    """Reads until done(text) holds for what arrived, or 3 s pass without data."""
    out = b""
    sock.settimeout(3)
    try:
        while not done(clean(out)):
            data = sock.recv(65536)
            if not data:
                break
            out += data
    except OSError:
        pass
    return clean(out)


def registers(sock):
    sock.sendall(b"info registers -a\n")
    # The answer ends with a prompt after the last vCPU's registers.
    return read_until(sock, lambda t: "RIP=" in t and t.rstrip().endswith("(qemu)"))


def main():
    path, full_out = sys.argv[1], sys.argv[2]
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        read_until(sock, lambda t: t.rstrip().endswith("(qemu)"))  # the banner
        samples = []
        for _ in range(3):
            samples.append(registers(sock))
            time.sleep(1)
    except OSError as e:
        print(f"lab: L1 vCPU state: QEMU monitor {path} did not answer: {e}")
        return
    with open(full_out, "w") as f:
        f.write("\n".join(samples))
    for n, text in enumerate(samples, 1):
        for cpu, rip, rfl, hlt in re.findall(
            r"CPU#(\d+).*?RIP=([0-9a-f]+) RFL=([0-9a-f]+).*?HLT=(\d)", text, re.S
        ):
            flags = int(rfl, 16)
            irqs = "on" if flags & 0x200 else "off"
            print(f"lab: L1 vCPU {cpu} (sample {n}): RIP={rip} RFLAGS={rfl} (interrupts {irqs}) HLT={hlt}")
    print(f"lab: full L1 register dumps in {full_out}")


if __name__ == "__main__":
    main()
