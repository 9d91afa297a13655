#!/usr/bin/env python3
"""Where a tier fault's time goes in the nested lab: reads the trace that
lab/bench/redis-tier.sh prints with BENCH_REDIS_TRACE=MODE@SHARE (perf script
lines of L1's scheduler, KVM, IPI and workqueue events and the tier thread's
system calls, gzipped, base64, between TRACE-BEGIN and TRACE-END) and prints,
for the vCPU thread's waits in the kernel, how they split between the threads
that take part in serving a fault. A diagnosis aid, not a result.

usage: scripts/redis-tier-trace.py BENCH_OUTPUT [--block N] [--dump FILE]
(block N: the Nth trace in the output, from 0, in the order the windows ran)
"""
import base64
import bisect
import gzip
import re
import statistics
import sys
from collections import Counter, defaultdict

LINE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<t>\d+\.\d+):\s+(?P<ev>[\w:]+):\s*(?P<rest>.*)$")
SYSCALLS = {0: "read", 7: "poll", 16: "ioctl", 17: "pread64", 18: "pwrite64", 24: "sched_yield",
            28: "madvise", 202: "futex", 232: "epoll_wait", 271: "ppoll", 285: "fallocate",
            230: "clock_nanosleep", 35: "nanosleep", 228: "clock_gettime"}


def load(path, block):
    text = open(path, errors="replace").read()
    blocks = list(re.finditer(r"TRACE-BEGIN([^\n]*)\n(.*?)\nTRACE-END", text, re.S))
    if len(blocks) <= block:
        sys.exit(f"{path}: {len(blocks)} TRACE-BEGIN ... TRACE-END blocks, no block {block}")
    m = blocks[block]
    b64 = "".join(l.strip() for l in m.group(2).splitlines() if re.fullmatch(r"[A-Za-z0-9+/=]+", l.strip()))
    return m.group(1).strip(), gzip.decompress(base64.b64decode(b64)).decode(errors="replace").splitlines()


def kv(rest):
    return dict(re.findall(r"(\w+)=(\S+)", rest))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(name, xs, unit=1e6):
    if not xs:
        print(f"  {name:44s} n=0")
        return
    print(f"  {name:44s} n={len(xs):6d} mean={statistics.mean(xs) * unit:9.1f} µs  "
          f"p50={pct(xs, .5) * unit:9.1f}  p90={pct(xs, .9) * unit:9.1f}  sum={sum(xs):7.3f} s")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    block = int(sys.argv[sys.argv.index("--block") + 1]) if "--block" in sys.argv else 0
    head, lines = load(sys.argv[1], block)
    if "--dump" in sys.argv:
        open(sys.argv[sys.argv.index("--dump") + 1], "w").write("\n".join(lines) + "\n")
    print(f"trace: {head}, {len(lines)} lines")
    evs = []
    bad = 0
    for l in lines:
        m = LINE.match(l)
        if not m:
            bad += 1
            continue
        evs.append((float(m["t"]), int(m["tid"]), m["comm"].strip(), int(m["cpu"]), m["ev"], m["rest"]))
    evs.sort(key=lambda e: e[0])
    print(f"events: {len(evs)} ({bad} lines not parsed), span {evs[-1][0] - evs[0][0]:.3f} s")
    print("by event:", ", ".join(f"{k} {v}" for k, v in Counter(e[4] for e in evs).most_common()))
    names = {}
    for e in evs:
        if e[4] == "sched:sched_switch":
            a = kv(e[5])
            names[int(a["prev_pid"])] = a["prev_comm"]
            m = re.search(r"next_comm=(.*?) next_pid=(\d+)", e[5])
            if m:
                names[int(m.group(2))] = m.group(1)
    vcpus = [t for t, n in names.items() if n.startswith("vcpu")]
    tiers = [t for t, n in names.items() if n == "tier"]
    print("threads: vcpu", vcpus, "tier", tiers)
    if not vcpus:
        sys.exit("no vcpu thread in the trace")
    vcpu = vcpus[0]
    tier = tiers[0] if tiers else -1

    # Per-thread running intervals and wake-up latencies (sched_wakeup to switch-in).
    running = defaultdict(list)  # tid -> [(start, end, cpu)]
    on = {}  # tid -> (start, cpu)
    woken = {}  # tid -> wakeup time
    wake_lat = defaultdict(list)
    wakers = defaultdict(Counter)
    for t, tid, comm, cpu, ev, rest in evs:
        if ev == "sched:sched_switch":
            a = kv(rest)
            prev = int(a["prev_pid"])
            nxt = int(re.search(r"next_pid=(\d+)", rest).group(1))
            if prev in on:
                s, c = on.pop(prev)
                running[prev].append((s, t, c))
            on[nxt] = (t, cpu)
            if nxt in woken:
                wake_lat[nxt].append(t - woken.pop(nxt))
        elif ev == "sched:sched_wakeup":
            a = kv(rest)
            p = int(a["pid"])
            woken[p] = t
            wakers[p][names.get(tid, comm)] += 1
    span = evs[-1][0] - evs[0][0]
    print("\nCPU time by thread over the span (share of one CPU):")
    tot = Counter()
    for tid, iv in running.items():
        tot[names.get(tid, str(tid))] += sum(e - s for s, e, _ in iv)
    for n, v in tot.most_common(12):
        print(f"  {n:24s} {v / span * 100:6.1f} %")
    print("\nwake-up latency (sched_wakeup to running), by thread:")
    for tid in [vcpu, tier] + [t for t in wake_lat if names.get(t, "").startswith("kworker")][:4]:
        summary(f"{names.get(tid, tid)} ({tid})", wake_lat.get(tid, []))
        if tid in wakers:
            print("     woken by:", dict(wakers[tid].most_common(5)))

    # The vCPU's waits: switch-out with prev_state S/D to the next switch-in.
    waits = []
    for (s0, e0, c0), (s1, e1, c1) in zip(running[vcpu], running[vcpu][1:]):
        waits.append((e0, s1))
    print(f"\nvCPU thread: {len(running[vcpu])} runs, waits between them:")
    summary("all waits", [b - a for a, b in waits])

    # Guest time: kvm_entry to kvm_exit on the vCPU thread.
    guest = 0.0
    entry = None
    exits = Counter()
    for t, tid, comm, cpu, ev, rest in evs:
        if tid != vcpu:
            continue
        if ev == "kvm:kvm_entry":
            entry = t
        elif ev == "kvm:kvm_exit":
            if entry is not None:
                guest += t - entry
                entry = None
            m = re.search(r"reason (\S+)", rest)
            exits[m.group(1) if m else rest[:30]] += 1
    print(f"vCPU in guest: {guest / span * 100:.1f} % of the span; exits: {dict(exits.most_common(8))}")

    # Each exit until the next entry, by reason: the vCPU thread running in L1's kernel
    # (KVM, and for the kernel's swap the reclaim it does inline) and switched out.
    host, blk, nexit = defaultdict(float), defaultdict(float), Counter()
    t_exit = reason = off = None
    blocked = 0.0
    for t, tid, comm, cpu, ev, rest in evs:
        if ev == "sched:sched_switch":
            if f"prev_pid={vcpu} " in rest:
                off = t
            elif f"next_pid={vcpu} " in rest and off is not None:
                if t_exit is not None:
                    blocked += t - off
                off = None
        elif tid == vcpu and ev == "kvm:kvm_exit":
            m = re.search(r"reason (\S+)", rest)
            t_exit, reason, blocked = t, (m.group(1) if m else "?"), 0.0
        elif tid == vcpu and ev == "kvm:kvm_entry" and t_exit is not None:
            host[reason] += t - t_exit - blocked
            blk[reason] += blocked
            nexit[reason] += 1
            t_exit = None
    print("exits until the next entry, by reason (per exit: running in L1's kernel; switched out):")
    for k in sorted(host, key=lambda k: -host[k] - blk[k]):
        print(f"  {k:12s} n={nexit[k]:6d}  running {host[k] / nexit[k] * 1e6:7.1f} µs  "
              f"switched out {blk[k] / nexit[k] * 1e6:7.1f} µs")

    # Each async page fault, followed through its events: the vCPU's exit and KVM's
    # fault (try_async_get_page, not_present), the worker (async_pf_execute) blocking
    # in the userfaultfd, the tier thread's UFFDIO_COPY/CONTINUE (its last ioctl before
    # the worker completes), the vCPU back in the guest, and the exit that follows at
    # the same address (KVM maps an async page fault's page ahead, access-tracked).
    by_tid = defaultdict(list)
    for e in evs:
        by_tid[e[1]].append(e)
    vk = [e for e in by_tid[vcpu] if e[4].startswith("kvm:")]
    vk_t = [e[0] for e in vk]
    comp = defaultdict(list)  # gva -> completed events
    for e in evs:
        if e[4] == "kvm:kvm_async_pf_completed":
            comp[re.search(r"gva (\S+)", e[5]).group(1)].append(e)
    ready = {}
    for e in evs:
        if e[4] == "kvm:kvm_async_pf_ready":
            ready.setdefault(re.search(r"token (\S+)", e[5]).group(1), []).append(e)
    # The tier thread's system calls: (enter, exit, name).
    sys_iv = []
    pending = None
    for e in evs:
        if e[1] != tier or not e[4].startswith("raw_syscalls"):
            continue
        if e[4].endswith("sys_enter"):
            m = re.search(r"NR (\d+)", e[5])
            pending = (e[0], SYSCALLS.get(int(m.group(1)), m.group(1)) if m else "?")
        elif pending:
            sys_iv.append((pending[0], e[0], pending[1]))
            pending = None
    sys_t = [a for a, _, _ in sys_iv]
    ioctls = [iv for iv in sys_iv if iv[2] == "ioctl"]
    io_t = [a for a, _, _ in ioctls]
    segs = defaultdict(list)
    c_parts = Counter()
    n_np = n_ok = 0
    second = 0
    for e in evs:
        if e[4] != "kvm:kvm_async_pf_not_present":
            continue
        n_np += 1
        t0 = e[0]
        tok = re.search(r"token (\S+)", e[5]).group(1)
        gva = re.search(r"gva (\S+)", e[5]).group(1)
        c = next((x for x in comp.get(gva, []) if x[0] > t0), None)
        r = next((x for x in ready.get(tok, []) if c and x[0] >= c[0]), None)
        if not c or not r:
            continue
        i = bisect.bisect_left(vk_t, t0)
        ex = next((x for x in reversed(vk[max(0, i - 6):i]) if x[4] == "kvm:kvm_exit"), None)
        ws = next((x for x in reversed(by_tid[c[1]]) if x[0] < c[0] and x[4].endswith("execute_start")), None)
        j = bisect.bisect_left(vk_t, r[0])
        ent = next((x for x in vk[j:j + 6] if x[4] == "kvm:kvm_entry"), None)
        k = bisect.bisect_left(io_t, c[0])
        io = ioctls[k - 1] if k > 0 and ws and io_t[k - 1] > ws[0] else None
        if not (ex and ws and ent):
            continue
        n_ok += 1
        segs["a exit -> KVM hands the fault to its worker"].append(t0 - ex[0])
        segs["b -> the worker starts"].append(ws[0] - t0)
        if io:
            segs["c worker starts -> tier's ioctl"].append(io[0] - ws[0])
            # what the tier thread did in c: its system calls, by name, and the rest
            lo, hi = bisect.bisect_left(sys_t, ws[0]), bisect.bisect_left(sys_t, io[0])
            inside = Counter()
            for (a0, a1, nm) in sys_iv[lo:hi]:
                inside[nm] += min(a1, io[0]) - a0
            for nm, v in inside.items():
                c_parts[nm] += v
            c_parts["(not in a system call)"] += (io[0] - ws[0]) - sum(inside.values())
            segs["d tier's ioctl (copy/continue)"].append(io[1] - io[0])
            segs["e ioctl done -> worker completes"].append(c[0] - io[1])
        else:
            segs["c' worker starts -> completes (no tier ioctl between)"].append(c[0] - ws[0])
        segs["f worker completes -> vCPU in guest"].append(ent[0] - c[0])
        segs["T exit -> vCPU in guest"].append(ent[0] - ex[0])
        q = bisect.bisect_right(vk_t, ent[0])
        nx = vk[q:q + 3]
        if len(nx) >= 2 and nx[0][4] == "kvm:kvm_exit" and "reason PF" in nx[0][5] and gva[2:].lstrip("0") in nx[0][5]:
            second += 1
            ent2 = next((x for x in nx[1:] + vk[q + 3:q + 8] if x[4] == "kvm:kvm_entry"), None)
            if ent2:
                segs["g the second exit at the same address"].append(ent2[0] - nx[0][0])
    print(f"\nasync page faults: {n_np} begun, {n_ok} followed through; {second} came back with a second exit")
    for k in sorted(segs):
        summary(k, segs[k])
    if n_ok:
        print("  c, per fault, by what the tier thread was in (system calls started within c):")
        for nm, v in c_parts.most_common():
            print(f"     {nm:28s} {v / n_ok * 1e6:8.1f} µs")

    sysd = defaultdict(list)
    for a, b, nm in sys_iv:
        sysd[nm].append(b - a)
    print("\ntier thread system calls (enter to exit):")
    for k, v in sorted(sysd.items(), key=lambda kv: -sum(kv[1])):
        summary(k, v)


if __name__ == "__main__":
    main()
