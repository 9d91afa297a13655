# Generates the named seeds of fuzz/corpus/virtqueue (layout documented in
# crates/virtio/src/block/fuzz.rs):
#   python3 fuzz/make_virtqueue_seeds.py fuzz/corpus/virtqueue
import struct, sys, os
out = sys.argv[1]
R, NEXT, W, IND = 0, 1, 2, 4
def hdr(kind, sector): return struct.pack('<IIQ', kind, 0, sector)
def seg(sector, n, flags): return struct.pack('<QII', sector, n, flags)
def seed(flags, qexp, descs, heads, data, avail=None):
    b = bytes([flags, qexp, len(descs)])
    for (addr, ln, fl, nx) in descs:
        b += struct.pack('<QIHH', addr, ln, fl, nx)
    b += bytes([len(heads)]) + b''.join(struct.pack('<H', h) for h in heads)
    b += bytes([0x80]) + struct.pack('<H', avail) if avail is not None else bytes([0])
    return b + data
# data area offsets: header at 0, data at 0x100, status at 0x2000 ...
def area(parts):
    buf = bytearray(0x2100)
    for off, by in parts: buf[off:off+len(by)] = by
    return bytes(buf)
seeds = {}
# 1: write 2 sectors at 4, then read them back, then flush, then get-id (mem disk, FLUSH acked).
seeds['write_read_flush_id'] = seed(8, 4, [
    (0x0, 16, R|NEXT, 1), (0x100, 1024, R|NEXT, 2), (0x2000, 1, W, 0),
    (0x20, 16, R|NEXT, 4), (0x800, 1024, W|NEXT, 5), (0x2001, 1, W, 0),
    (0x40, 16, R|NEXT, 7), (0x2002, 1, W, 0),
    (0x60, 16, R|NEXT, 9), (0x1000, 20, W|NEXT, 10), (0x2003, 1, W, 0),
], [0, 3, 6, 8], area([(0, hdr(1, 4)), (0x100, bytes(range(256))*4), (0x20, hdr(0, 4)), (0x40, hdr(4, 0)), (0x60, hdr(8, 0))]))
# 2: a descriptor loop.
seeds['loop'] = seed(0, 3, [(0x0, 16, R|NEXT, 1), (0x800, 512, W|NEXT, 0)], [0], area([(0, hdr(0, 0))]))
# 3: a read through an indirect table at 0x1800.
table = struct.pack('<QIHH', (1 << 20) + 0x0, 16, R|NEXT, 1) + struct.pack('<QIHH', (1 << 20) + 0x800, 512, W|NEXT, 2) + struct.pack('<QIHH', (1 << 20) + 0x2000, 1, W, 0)
seeds['indirect_read'] = seed(4, 3, [(0x1800, len(table), IND, 0)], [0], area([(0, hdr(0, 3)), (0x1800, table)]))
# 4: the available index far ahead of the queue.
seeds['avail_ahead'] = seed(0, 2, [(0x0, 16, R|NEXT, 1), (0x2000, 1, W, 0)], [0], area([(0, hdr(4, 0))]), avail=0x4000)
# 5: pcow backend: write, discard, write-zeroes with unmap.
seeds['pcow_discard_zeroes'] = seed(2 | 8, 4, [
    (0x0, 16, R|NEXT, 1), (0x100, 4096, R|NEXT, 2), (0x2000, 1, W, 0),
    (0x20, 16, R|NEXT, 4), (0x1400, 32, R|NEXT, 5), (0x2001, 1, W, 0),
    (0x40, 16, R|NEXT, 7), (0x1500, 16, R|NEXT, 8), (0x2002, 1, W, 0),
], [0, 3, 6], area([(0, hdr(1, 0)), (0x100, b'\x5a'*4096), (0x20, hdr(11, 0)), (0x1400, seg(0, 8, 0) + seg(16, 8, 0)), (0x40, hdr(13, 0)), (0x1500, seg(8, 4, 1))]))
# 6: a read-only disk asked to write and discard.
seeds['readonly_write'] = seed(1, 3, [
    (0x0, 16, R|NEXT, 1), (0x100, 512, R|NEXT, 2), (0x2000, 1, W, 0),
    (0x20, 16, R|NEXT, 4), (0x1400, 16, R|NEXT, 5), (0x2001, 1, W, 0),
], [0, 3], area([(0, hdr(1, 0)), (0x100, b'\x11'*512), (0x20, hdr(11, 0)), (0x1400, seg(0, 8, 0))]))
# 7: out-of-range and wrong-direction requests, and an out-of-memory buffer (bit 63).
seeds['hostile_mix'] = seed(8, 4, [
    (0x0, 16, R|NEXT, 1), (0x800, 512, W|NEXT, 2), (0x2000, 1, W, 0),
    (0x20, 16, R|NEXT, 4), (0x800, 512, W|NEXT, 5), (0x2001, 1, W, 0),
    (0x0, 16, R|NEXT, 7), ((1 << 63) | (1 << 40), 512, W|NEXT, 8), (0x2002, 1, W, 0),
], [0, 3, 6], area([(0, hdr(0, 0xffffffffffffff00)), (0x20, hdr(1, 0))]))
# 8: virtio-rng (device bits 4-5 = 1): two chains of writable buffers, one also readable.
seeds['rng_fill'] = seed(0x10, 3, [
    (0x800, 64, W, 0),
    (0x0, 16, R|NEXT, 2), (0x900, 4096, W|NEXT, 3), (0x2000, 1, W, 0),
], [0, 1], area([]))
# 9: virtio-9p (device bits 4-5 = 2): version, attach, walk, open, read.
def s9(t): return struct.pack('<H', len(t)) + t
def msg(kind, tag, body):
    return struct.pack('<IBH', 7 + len(body), kind, tag) + body
p9 = [
    msg(100, 0xffff, struct.pack('<I', 8192) + s9(b'9P2000.L')),
    msg(104, 1, struct.pack('<II', 0, 0xffffffff) + s9(b'root') + s9(b'') + struct.pack('<I', 0)),
    msg(110, 2, struct.pack('<IIH', 0, 1, 1) + s9(b'f')),
    msg(12, 3, struct.pack('<II', 1, 0)),
    msg(116, 4, struct.pack('<IQI', 1, 0, 64)),
]
descs, heads, parts = [], [], []
for i, m in enumerate(p9):
    heads.append(len(descs))
    descs.append((0x100 * i, len(m), R|NEXT, len(descs) + 1))
    descs.append((0x1000 + 0x200 * i, 0x200, W, 0))
    parts.append((0x100 * i, m))
seeds['p9_session'] = seed(0x20, 4, descs, heads, area(parts))
os.makedirs(out, exist_ok=True)
for name, b in seeds.items():
    open(os.path.join(out, name), 'wb').write(b)
    print(name, len(b))
