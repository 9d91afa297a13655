#!/usr/bin/env bash
# CLI-level tests of `densevm image` (run by `make test-pcow`). Needs DENSEVM (the binary)
# and qemu-img (Debian qemu-utils). Fails loudly when either is missing.
set -euo pipefail
D="${DENSEVM:?set DENSEVM to the densevm binary}"
[ -x "$D" ] || { echo "FAIL: densevm binary $D not found (run make build)"; exit 1; }
command -v qemu-img >/dev/null || { echo "FAIL: qemu-img missing (apt package qemu-utils; run make deps)"; exit 1; }
command -v python3 >/dev/null || { echo "FAIL: python3 missing"; exit 1; }
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cd "$work"
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
expect_rc() { # expect_rc WANT DESC CMD...
  local want="$1" desc="$2"; shift 2
  set +e; "$@" >"$work/out" 2>&1; local rc=$?; set -e
  if [ "$rc" = "$want" ]; then ok "$desc (exit $rc)"; else bad "$desc: exit $rc, want $want"; cat "$work/out"; fi
}

# Data: 8 MiB of random bytes with a zero hole.
head -c 4194304 /dev/urandom > a.raw; truncate -s 6M a.raw; head -c 2097152 /dev/urandom >> a.raw
expect_rc 0 "convert raw -> pcow" "$D" image convert -f raw -O pcow -o cluster_size=64K a.raw a.pcow
expect_rc 0 "convert pcow -> raw" "$D" image convert -f pcow -O raw a.pcow b.raw
cmp -s a.raw b.raw && ok "raw round trip is identical" || bad "raw round trip differs"
expect_rc 0 "convert pcow -> qcow2" "$D" image convert -f pcow -O qcow2 a.pcow a.qcow2
qemu-img compare -f raw -F qcow2 a.raw a.qcow2 >/dev/null && ok "qemu-img sees the same data" || bad "qcow2 differs"
expect_rc 0 "convert qcow2 -> pcow" "$D" image convert -f qcow2 -O pcow a.qcow2 c.pcow
"$D" image convert -f pcow -O raw c.pcow c.raw && cmp -s a.raw c.raw && ok "qcow2 round trip" || bad "qcow2 round trip"

expect_rc 0 "info --json" "$D" image info --json a.pcow
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["virtual_size"]==8388608 and j["cluster_size"]==65536 and j["allocated_clusters"]==96, j' "$work/out" \
  && ok "info reports size, cluster size and 96 allocated clusters" || bad "info json content"

# Overlay, snapshots, rollback.
expect_rc 0 "create overlay" "$D" image create top.pcow 8M -b a.pcow
printf 'hello-pcow' > patch.bin
expect_rc 0 "snapshot create s1" "$D" image snapshot create top.pcow s1
expect_rc 0 "snapshot list --json" "$D" image snapshot list top.pcow --json
python3 -c 'import json,sys; assert [s["name"] for s in json.load(open(sys.argv[1]))]==["s1"]' "$work/out" && ok "list shows s1" || bad "list content"
expect_rc 0 "rebase onto nothing with snapshot s1 (copies base data up)" "$D" image rebase -b "" top.pcow
"$D" image convert -f pcow -O raw top.pcow top.raw && cmp -s a.raw top.raw && ok "view unchanged by rebase" || bad "rebase changed data"
expect_rc 0 "snapshot apply s1" "$D" image snapshot apply top.pcow s1
"$D" image convert -f pcow -O raw top.pcow s1.raw && cmp -s a.raw s1.raw && ok "snapshot s1 unchanged by rebase" || bad "rebase changed s1"
expect_rc 0 "snapshot delete s1" "$D" image snapshot delete top.pcow s1
expect_rc 0 "info shows no backing file" "$D" image info --json top.pcow
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["backing_filename"] is None' "$work/out" && ok "backing removed" || bad "backing still set"
expect_rc 1 "apply of a missing snapshot fails" "$D" image snapshot apply top.pcow s1
expect_rc 0 "map --json" "$D" image map --json top.pcow
expect_rc 0 "compact" "$D" image compact top.pcow
expect_rc 0 "check clean" "$D" image check top.pcow

# Commit: overlay data goes into the base.
expect_rc 0 "create overlay 2" "$D" image create o2.pcow 8M -b a.pcow
expect_rc 0 "convert into overlay base view" "$D" image convert -f pcow -O raw o2.pcow o2.raw
cmp -s a.raw o2.raw && ok "overlay reads base" || bad "overlay view"
# (the library's model and crash tests cover commit with snapshots over written overlays)
expect_rc 0 "snapshot create before commit" "$D" image snapshot create o2.pcow keep
expect_rc 0 "commit with a visible snapshot" "$D" image commit o2.pcow
expect_rc 0 "check after commit" "$D" image check o2.pcow
expect_rc 0 "check base after commit" "$D" image check a.pcow
expect_rc 0 "snapshot apply after commit" "$D" image snapshot apply o2.pcow keep
"$D" image convert -f pcow -O raw o2.pcow keep.raw && cmp -s a.raw keep.raw && ok "snapshot kept its view through commit" || bad "commit changed the snapshot"

# Convert never replaces an existing file and leaves no temporary file behind.
expect_rc 1 "convert onto an existing file fails" "$D" image convert -f raw -O pcow a.raw a.pcow
ls -a | grep -q 'convert.tmp' && bad "temporary file left" || ok "no temporary file left"

# check exit codes: 3 leaks only, 2 corruption, 1 cannot check, repair fixes.
"$D" image create leak.pcow 1M
python3 - <<'PY'
# one torn copy in an unused entry (slot 5) = an interrupted first write = leak
with open("leak.pcow", "r+b") as f:
    f.seek(65536 + 5 * 64); f.write(b"\x5a" * 32)
PY
expect_rc 3 "check reports leaks only" "$D" image check leak.pcow
expect_rc 0 "check --repair fixes leaks" "$D" image check --repair leak.pcow
expect_rc 0 "clean after repair" "$D" image check leak.pcow
cp a.pcow bad.pcow
python3 - <<'PY'
# both copies of the entry of slot 0 (an allocated cluster) destroyed = corruption
with open("bad.pcow", "r+b") as f:
    f.seek(65536); f.write(b"\xa5" * 64)
PY
expect_rc 2 "check reports corruption" "$D" image check bad.pcow
expect_rc 1 "corrupt image refuses a normal open" "$D" image info bad.pcow
expect_rc 0 "check --repair" "$D" image check --repair bad.pcow
expect_rc 0 "clean after repair" "$D" image check bad.pcow
head -c 100000 /dev/urandom > junk.pcow
expect_rc 1 "check of a non-image exits 1" "$D" image check junk.pcow
expect_rc 1 "bad option is rejected" "$D" image create x.pcow 1M -o cluster_size=3K

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
