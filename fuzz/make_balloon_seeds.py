# Generates the named seeds of fuzz/corpus/balloon (layout documented in
# crates/virtio/src/balloon/fuzz.rs):
#   python3 fuzz/make_balloon_seeds.py fuzz/corpus/balloon
import struct, sys, os
out = sys.argv[1]
R, NEXT, W, IND = 0, 1, 2, 4
STATS, REPORTING, EVENT_IDX, ASK = 1, 2, 4, 0x40
INFLATE, DEFLATE, STATSQ, REPORTQ = 0, 0x10, 0x20, 0x30
RAW_ADDR, RAW_LEN = 1 << 63, 1 << 31
def seed(flags, qexp, descs, heads, data, avail=None):
    b = bytes([flags, qexp, len(descs)])
    for (addr, ln, fl, nx) in descs:
        b += struct.pack('<QIHH', addr, ln, fl, nx)
    b += bytes([len(heads)]) + b''.join(struct.pack('<H', h) for h in heads)
    b += bytes([0x80]) + struct.pack('<H', avail) if avail is not None else bytes([0])
    return b + data
def area(parts, size=0x1000):
    buf = bytearray(size)
    for off, by in parts: buf[off:off+len(by)] = by
    return bytes(buf)
def pfns(*p): return b''.join(struct.pack('<I', x) for x in p)
def stat(*e): return b''.join(struct.pack('<HQ', t, v) for t, v in e)
# Data lives at DATA_BASE (1 MiB): PFNs 0x100-0x10f are the data area (the end of the first
# region), 0x110-0x11f the hole, 0x120-0x12f the second region, above: nothing.
seeds = {
    # Inflate: a run, a duplicate, a PFN in the hole, one in the second region, one far out.
    'inflate_mix': seed(INFLATE, 4, [(0x0, 32, R, 0)], [0],
                        area([(0, pfns(0x100, 0x101, 0x102, 0x101, 0x118, 0x120, 0xffffffff, 0x10f))])),
    # Deflate over two descriptors, one writable (skipped), one of odd length.
    'deflate_hostile': seed(DEFLATE | EVENT_IDX, 3, [(0x0, 8, R | NEXT, 1), (0x40, 4, W | NEXT, 2), (0x80, 6, R, 0)], [0],
                            area([(0, pfns(0x100, 0x101)), (0x40, pfns(0x105)), (0x80, pfns(0x106) + b'\xff\xff')])),
    # Statistics: a full buffer, an unknown tag, asked for again; then a truncated one.
    'stats_flow': seed(STATS | STATSQ | ASK, 3, [(0x0, 60, R, 0), (0x100, 9, R, 0)], [0, 1],
                       area([(0, stat((0, 1), (4, 2 << 20), (6, 3 << 20), (99, 7), (10, 1), (7, 5))), (0x100, stat((4, 1)))])),
    # Reporting (queue 2 without stats): aligned, misaligned, empty, readable, outside RAM.
    'report_mix': seed(REPORTING | REPORTQ, 4, [
        (RAW_ADDR | 0x100000, RAW_LEN | 0x4000, W | NEXT, 1),
        (RAW_ADDR | 0x100800, RAW_LEN | 0x2000, W | NEXT, 2),
        (0x0, 0, W | NEXT, 3),
        (0x0, 0x1000, R | NEXT, 4),
        (RAW_ADDR | 0x10f000, RAW_LEN | 0x40000, W, 0),
    ], [0], area([])),
    # Reporting with statistics (queue 3) through an indirect table.
    'report_indirect': seed(STATS | REPORTING | REPORTQ, 3, [(0x200, 32, IND, 0)], [0],
                            area([(0x200, struct.pack('<QIHH', 0x100000, 0x1000, W | NEXT, 1) + struct.pack('<QIHH', 0x120000, 0x2000, W, 0))])),
    # A descriptor loop and an available index far ahead.
    'loop_ahead': seed(INFLATE, 2, [(0x0, 4, R | NEXT, 1), (0x0, 4, R | NEXT, 0)], [0], area([(0, pfns(0x100))]), avail=0x4000),
    # One huge PFN buffer (the whole data area).
    'inflate_huge': seed(INFLATE, 1, [(0x0, 0x10000, R, 0)], [0], bytes(range(256)) * 16),
}
os.makedirs(out, exist_ok=True)
for name, b in seeds.items():
    open(os.path.join(out, name), 'wb').write(b)
    print(name, len(b))
