#!/usr/bin/env bash
# `make test-kernel-real`: checks densevm-kernel against the real Debian kernel in
# build/guest/: header fields, an extraction identical to xz(1)'s, segment layout, PVH entry.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
densevm="${1:-$LAB_ROOT/target/release/densevm}"
[ -x "$densevm" ] || die "missing densevm binary $densevm; run 'make build'"
for f in vmlinuz vmlinux; do
  [ -s "$GUEST_DIR/$f" ] || die "missing $GUEST_DIR/$f; run 'make guest' first"
done
command -v python3 >/dev/null || die "python3 not found; run 'make deps'"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$densevm" kernel info --json "$GUEST_DIR/vmlinuz" > "$work/bz.json"
"$densevm" kernel info --json "$GUEST_DIR/vmlinux" > "$work/elf.json"
"$densevm" kernel extract --json "$GUEST_DIR/vmlinuz" -o "$work/vmlinux" > "$work/extract.json"

# An independent extraction: cut the payload at the header's offset and run xz.
python3 - "$work" "$GUEST_DIR/vmlinuz" <<'PY'
import json, sys
work, bz = sys.argv[1], sys.argv[2]
h = json.load(open(f"{work}/bz.json"))["bzimage"]
data = open(bz, "rb").read()
open(f"{work}/payload.xz", "wb").write(data[h["payload_offset"]:h["payload_offset"] + h["payload_length"]])
PY
xz -dc --single-stream "$work/payload.xz" > "$work/vmlinux.xz-ref" 2>/dev/null || true
cmp "$work/vmlinux" "$work/vmlinux.xz-ref" || die "densevm's vmlinux differs from xz -dc of the payload"
cmp "$work/vmlinux" "$GUEST_DIR/vmlinux" || die "build/guest/vmlinux is stale; rerun 'make guest'"

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
bz = json.load(open(f"{work}/bz.json"))["bzimage"]
elf = json.load(open(f"{work}/elf.json"))["elf"]
ex = json.load(open(f"{work}/extract.json"))
errors = []
def check(cond, what):
    if not cond:
        errors.append(what)
check(bz["compression"] == "xz", f"compression {bz['compression']} (expected xz)")
check(bz["protocol_version"] >= 0x020F, f"protocol {bz['protocol_version']:#x} < 2.15")
check(bz["xloadflags"] & 1, "XLF_KERNEL_64 not set")
check(bz["relocatable"], "bzImage not relocatable")
check(bz["pref_address"] == 0x1000000, f"pref_address {bz['pref_address']:#x}")
segs = elf["segments"]
check(len(segs) >= 3, f"only {len(segs)} PT_LOAD segments")
check(all(s["offset"] % 4096 == s["paddr"] % 4096 for s in segs), "a segment is not mmap-able (offset/paddr page offsets differ)")
pvh = elf["pvh_entry"]
check(pvh is not None, "no PVH entry note")
if pvh is not None:
    text = min(segs, key=lambda s: s["paddr"])
    check(text["paddr"] <= pvh < text["paddr"] + text["filesz"], f"PVH entry {pvh:#x} outside the text segment")
check(ex["pvh_entry"] == pvh and ex["load_segments"] == len(segs), "extract summary disagrees with info")
if errors:
    print("test-kernel-real: FAIL: " + "; ".join(errors))
    sys.exit(1)
print(f"test-kernel-real: ok: xz bzImage {bz['payload_length']} B -> vmlinux {ex['output_bytes']} B "
      f"identical to xz(1); {len(segs)} mappable PT_LOAD segments; PVH entry {pvh:#x}")
PY
