#!/usr/bin/env python3
"""l1-cpus.py MONITOR_SOCKET FULL_OUT: where L1's vCPUs are, asked of QEMU's HMP monitor.

Writes the full `info registers -a` (three samples, 1 s apart) and each vCPU's
`info lapic` to FULL_OUT and prints one line per vCPU and sample: RIP, RFLAGS with its IF
bit spelled out, HLT; then one per vCPU: its local APIC's timer, ISR, IRR and priorities.
lab/run calls it when L1 stalls or times out, before it stops QEMU, so that a CI log tells
an L1 spinning with interrupts off from an idle one. Exits 0 even when the monitor does
not answer.
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


def lapic(sock, cpu):
    sock.sendall(f"info lapic {cpu}\n".encode())
    return read_until(sock, lambda t: "PPR" in t and t.rstrip().endswith("(qemu)"))


def lapic_summary(text):
    """The local APIC's timer and pending/in-service vectors, one line: an L1 halted with
    interrupts on that never wakes has either no timer armed or a vector stuck in service
    (ISR) that masks the timer's."""
    def field(name):
        m = re.search(rf"^{name}\s+(.*)$", text, re.M)
        return re.sub(r"\s+", " ", m.group(1)).strip() if m else "?"
    return (f"LVTT {field('LVTT')}; Timer {field('Timer')}; ISR {field('ISR')}; "
            f"IRR {field('IRR')}; APR {field('APR')}")


def main():
    path, full_out = sys.argv[1], sys.argv[2]
    lapics = {}
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        read_until(sock, lambda t: t.rstrip().endswith("(qemu)"))  # the banner
        samples = []
        for _ in range(3):
            samples.append(registers(sock))
            time.sleep(1)
        for cpu in sorted(set(re.findall(r"CPU#(\d+)", samples[-1])), key=int):
            lapics[cpu] = lapic(sock, cpu)
    except OSError as e:
        print(f"lab: L1 vCPU state: QEMU monitor {path} did not answer: {e}")
        return
    with open(full_out, "w") as f:
        f.write("\n".join(samples + list(lapics.values())))
    for n, text in enumerate(samples, 1):
        for cpu, rip, rfl, hlt in re.findall(
            r"CPU#(\d+).*?RIP=([0-9a-f]+) RFL=([0-9a-f]+).*?HLT=(\d)", text, re.S
        ):
            flags = int(rfl, 16)
            irqs = "on" if flags & 0x200 else "off"
            print(f"lab: L1 vCPU {cpu} (sample {n}): RIP={rip} RFLAGS={rfl} (interrupts {irqs}) HLT={hlt}")
    for cpu, text in lapics.items():
        print(f"lab: L1 vCPU {cpu} local APIC: {lapic_summary(text)}")
    print(f"lab: full L1 register and local APIC dumps in {full_out}")


if __name__ == "__main__":
    main()
