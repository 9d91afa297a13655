#!/usr/bin/env python3
"""Writes the named seeds of the codec fuzz target (9P2000.L request frames):

    python3 fuzz/make_codec_seeds.py fuzz/corpus/codec

Fid 0 is attached to the export's root by the target before each input; the export holds
a file `f` and a directory `d`.
"""
import os
import struct
import sys


def s(x):
    b = x.encode()
    return struct.pack("<H", len(b)) + b


def frame(typ, body, tag=7):
    return struct.pack("<IBH", 7 + len(body), typ, tag) + body


u32 = lambda v: struct.pack("<I", v)
u64 = lambda v: struct.pack("<Q", v)

seeds = {
    "version": frame(100, u32(8192) + s("9P2000.L"), tag=0xFFFF),
    "attach": frame(104, u32(1) + u32(0xFFFFFFFF) + s("root") + s("") + u32(0)),
    "walk_f": frame(110, u32(0) + u32(1) + struct.pack("<H", 1) + s("f")),
    "walk_deep": frame(110, u32(0) + u32(2) + struct.pack("<H", 3) + s("d") + s("..") + s("f")),
    "walk_clone": frame(110, u32(0) + u32(3) + struct.pack("<H", 0)),
    "lopen_root": frame(12, u32(0) + u32(0)),
    "getattr": frame(24, u32(0) + u64(0x3FFF)),
    "readdir": frame(40, u32(0) + u64(0) + u32(4096)),
    "read": frame(116, u32(0) + u64(0) + u32(4096)),
    "write": frame(118, u32(0) + u64(0) + u32(4) + b"data"),
    "clunk": frame(120, u32(0)),
    "statfs": frame(8, u32(0)),
    "readlink": frame(22, u32(0)),
    "xattrwalk": frame(30, u32(0) + u32(5) + s("user.x")),
    "lcreate": frame(14, u32(0) + s("new") + u32(0o102) + u32(0o644) + u32(0)),
    "mkdir": frame(72, u32(0) + s("dir") + u32(0o755) + u32(0)),
    "unlinkat": frame(76, u32(0) + s("f") + u32(0)),
    "renameat": frame(74, u32(0) + s("f") + u32(0) + s("g")),
    "setattr": frame(26, u32(0) + u32(0x7F) + u32(0o600) + u32(0) + u32(0) + u64(1) + u64(0) * 4),
    "fsync": frame(50, u32(0) + u32(1)),
    "flush": frame(108, struct.pack("<H", 3)),
    "lock": frame(52, u32(0) + struct.pack("<B", 1) + u32(0) + u64(0) + u64(10) + u32(1) + s("c")),
    "getlock": frame(54, u32(0) + struct.pack("<B", 0) + u64(0) + u64(10) + u32(1) + s("c")),
    "symlink": frame(16, u32(0) + s("l") + s("f") + u32(0)),
    "mknod": frame(18, u32(0) + s("n") + u32(0o10644) + u32(0) + u32(0) + u32(0)),
    "link": frame(70, u32(0) + u32(0) + s("h")),
    "xattrcreate": frame(32, u32(0) + s("user.y") + u64(4) + u32(0)),
    "unknown_type": frame(99, b"\x00" * 8),
    "bad_size": b"\xff\xff\x00\x00" + bytes([100, 0, 0]) + u32(8192) + s("9P2000.L"),
    "string_overrun": frame(110, u32(0) + u32(1) + struct.pack("<H", 1) + struct.pack("<H", 500) + b"f"),
}

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
