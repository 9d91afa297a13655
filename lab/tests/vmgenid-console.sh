#!/bin/sh
# lab-seconds: 58
# VM generation ID and console input (issue #11 item 5).
# Checks: the Debian guest binds densevm's VMGenID device (vmgenid driver on QEMUVGID:00)
# and its ACPI Generic Event Device (acpi-ged on ACPI0013:00, "ACPI:Ged" in
# /proc/interrupts); the 16-byte ID at 0xef000 is not zero; text typed with `densevm
# console` into `densevm run --console-sock` reaches a shell in the guest, a line longer
# than the UART's 64-byte FIFO included; a clone (`densevm vm clone`) sees a new ID and
# takes the GED interrupt (and reseeds its RNG: "crng reseeded due to virtual machine
# fork"), while the parent keeps its ID.
. "$LAB_SRC/lib/test-lib.sh"
need_cmd densevm
need_file "$GUEST_VMLINUX" "$GUEST_INITRD"
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
densevm run --help | grep -q -- --console-sock || fail "densevm run has no --console-sock option"

# The guest reports its devices, prints the ID (and the GED interrupt count 2 s later)
# whenever the ID changes, and runs every line typed on the console.
GUEST_SCRIPT=$(cat <<'EOF' | base64 | tr -d '\n'
readid() { dd if=/dev/mem bs=16 skip=$((0xef000 / 16)) count=1 2>/dev/null | od -An -tx1 | tr -d ' \n'; }
gedirqs() { awk '/ACPI:Ged/ { n = 0; for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i; print n }' /proc/interrupts; }
[ -e /sys/bus/acpi/drivers/vmgenid/QEMUVGID:00 ] && echo VGEN-BOUND
[ -e /sys/bus/platform/drivers/acpi-ged/ACPI0013:00 ] && echo GED-BOUND
grep -q 'ACPI:Ged' /proc/interrupts && echo GED-IRQ
(last=; while :; do id=$(readid); if [ "$id" != "$last" ]; then sleep 2; echo "VMGENID=$id GED-IRQS=$(gedirqs)"; last=$id; fi; sleep 1; done) &
sleep 3
echo READY-FOR-INPUT
while read -r line; do eval "$line"; done
EOF
)
work=/tmp/vgen
rm -rf "$work"; mkdir -p "$work"
densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M --cpus 1 \
  --cmdline "console=ttyS0 panic=-1 $L2_KERNEL_ARGS densevm.script=$GUEST_SCRIPT" \
  --api-sock "$work/api.sock" --console-sock "$work/console.sock" > "$work/parent.log" 2>&1 &
parent=$!
trap 'kill $parent $clone 2>/dev/null' EXIT
wait_for_line_pid "$work/parent.log" READY-FOR-INPUT 600 "$parent" || {
  tail -n 30 "$work/parent.log"; fail "the guest never got ready (densevm exited, or 600 s passed)"
}
wait_for_line "$work/parent.log" VMGENID= 30 || fail "the guest printed no VMGENID line"
for mark in VGEN-BOUND GED-BOUND GED-IRQ; do
  grep -q "^$mark" "$work/parent.log" || { grep -iE 'vmgenid|ged|acpi' "$work/parent.log" | tail -n 20; fail "guest: no $mark"; }
done
id=$(sed -n 's/^VMGENID=\([0-9a-f]*\) .*/\1/p' "$work/parent.log" | head -n 1)
echo "parent: VMGenID $id"
[ "${#id}" = 32 ] || fail "cannot read the VMGenID at 0xef000 through /dev/mem"
[ "$id" != 00000000000000000000000000000000 ] || fail "the VMGenID is all zeros: densevm did not write one at boot"

# Console input. The tty echoes what is typed, so the answer must differ from the line.
densevm console --sock "$work/console.sock" --send 'echo TYPED-$((6*7))\n' \
  --wait-for TYPED-42 --console-file "$work/parent.log" --timeout 120 || fail "typed command not run"
long=$(printf '%0150d' 0 | tr 0 x)
densevm console --sock "$work/console.sock" --send "echo LONG-$long-\$((1+1))\n" \
  --wait-for "LONG-$long-2" --console-file "$work/parent.log" --timeout 120 || fail "a 170-byte line was cut"
echo "console input: a short and a 170-byte line typed and run"

# A clone gets a new ID and the GED interrupt; the parent keeps its ID.
densevm vm clone --api-sock "$work/api.sock" --count 1 --dir "$work/clones" --json > "$work/clone.json" ||
  fail "densevm vm clone failed: $(cat "$work/clone.json")"
clone=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$work/clone.json" | head -n 1)
console=$(sed -n 's/.*"console": *"\([^"]*\)".*/\1/p' "$work/clone.json" | head -n 1)
[ -n "$clone" ] && [ -n "$console" ] || fail "no clone pid/console in: $(cat "$work/clone.json")"
wait_for_line_pid "$console" VMGENID= 120 "$clone" || { tail -n 20 "$console"; fail "clone: the ID never changed"; }
line=$(grep '^VMGENID=' "$console" | tail -n 1)
echo "clone: $line"
new=$(echo "$line" | sed 's/^VMGENID=\([0-9a-f]*\) .*/\1/')
irqs=$(echo "$line" | sed 's/.*GED-IRQS=//')
[ "$new" != "$id" ] || fail "the clone kept the parent's VMGenID"
[ "${irqs:-0}" -ge 1 ] || fail "the clone's GED took no interrupt: no Notify reached the vmgenid driver"
if grep -q 'crng init done' "$work/parent.log"; then
  wait_for_line "$console" 'crng reseeded due to virtual machine fork' 10 || fail "clone: no RNG reseed message"
else
  echo "note: the parent's crng was not initialized yet, so no reseed message is expected"
fi
sleep 3
[ "$(grep -c '^VMGENID=' "$work/parent.log")" = 1 ] || fail "the parent's VMGenID changed"
echo "PASS: VMGenID at boot and in a clone (new ID, GED interrupt), console input through --console-sock"
