#!/bin/sh
# virtio device benchmark, run inside L1 by `make bench-virtio` (lab/run lab/bench/virtio.sh).
# For each VMM in $BENCH_VIRTIO_VMMS (default "densevm qemu") it boots the Debian L2 kernel
# (vmlinux via PVH, 256 MiB, 1 vCPU) twice with the same devices:
#   virtio-9p   the shared tree (densevm --share DIR,tag=host0;
#               QEMU -virtfs local,path=DIR,mount_tag=host0,security_model=none,id=fs0),
#               mounted with trans=virtio,version=9p2000.L,msize=$BENCH_MSIZE
#   virtio-blk  a raw file (densevm --disk FILE,format=raw; QEMU -drive
#               file=FILE,if=virtio,format=raw,cache=writeback: L1's tmpfs has no O_DIRECT,
#               so cache=none is impossible, and writeback matches densevm, whose disk I/O
#               also goes through the host page cache and whose flush is an fdatasync)
#   virtio-pmem 64 MiB (densevm --pmem, a pcow image; QEMU virtio-pmem-pci on a raw file)
#   virtio-rng  (densevm --rng; QEMU virtio-rng-pci from /dev/urandom)
# Boot 1, idle: the guest touches every device once, then sleeps; L1 reads the VMM's
# smaps while it sleeps. Boot 2, workloads (times measured inside the guest):
#   (a) cp -a of a $BENCH_TREE_FILES-file tree (1..$BENCH_TREE_MAX bytes each) out of the
#       9p share into a guest tmpfs;
#   (b) dd of $BENCH_DISK_MB MiB in 1 MiB blocks with O_DIRECT, write (conv=fsync) then read;
#       4 KiB random reads, then writes, at queue depth 1 for $BENCH_RIO_S s each, O_DIRECT
#       (lab/guest/rio.c, in the tools initrd).
# Memory: "VMM USS" is the VMM's USS without guest memory. densevm: `vmm_overhead` of its own
# --report-json, taken as the VM ends right after the idle period. QEMU: USS minus the USS of
# its guest RAM (anonymous mappings of >= 200 MiB) and of its pmem file mapping, read from
# smaps during the idle period. "process USS" is the whole process at idle, read by L1 for both.
# Timings inside L1 are TCG-distorted: compare the ratios, not the absolute figures.
. "$LAB_SRC/lib/test-lib.sh"
need_file "$GUEST_VMLINUX" "$GUEST_INITRD" "$GUEST_INITRD_TOOLS"
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
VMMS="${BENCH_VIRTIO_VMMS:-densevm qemu}"
FILES="${BENCH_TREE_FILES:-20000}"
MAXB="${BENCH_TREE_MAX:-2048}"
DISK_MB="${BENCH_DISK_MB:-128}"
RIO_S="${BENCH_RIO_S:-10}"
IDLE_S="${BENCH_IDLE_S:-20}"
MSIZE="${BENCH_MSIZE:-262144}"
W=/tmp/bench-virtio
tmpfs_workdir "$W"

echo "# virtio devices: $(date -u +%Y-%m-%dT%H:%MZ), L1 $(nproc) vCPUs, kernel $GUEST_KERNEL_RELEASE, VMMs: $VMMS"
start=$(uptime_s)
make_tree "$W/share/tree" "$FILES" "$MAXB" 11
echo "# generated $FILES files ($(du -sk "$W/share/tree" | cut -f1) KiB) in $(awk -v a="$start" -v b="$(uptime_s)" 'BEGIN { printf "%.0f", b - a }') s"

IDLE_SCRIPT=$(printf '%s\n' "$GUEST_FNS"; cat <<SH
wait_dev /dev/hwrng /dev/vda /dev/pmem0
mkdir -p /mnt/share && mount -t 9p -o trans=virtio,version=9p2000.L,msize=$MSIZE host0 /mnt/share || exit 10
ls /mnt/share/tree > /dev/null || exit 11
dd if=/dev/vda of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null || exit 12
dd if=/dev/pmem0 of=/dev/null bs=4096 count=1 2>/dev/null || exit 13
head -c 16 /dev/hwrng > /dev/null || exit 14
echo DENSEVM-IDLE
sleep $IDLE_S
umount /mnt/share
SH
)
WORK_SCRIPT=$(printf '%s\n' "$GUEST_FNS"; cat <<SH
wait_dev /dev/hwrng /dev/vda /dev/pmem0
disk=\$(dev_of_size $((DISK_MB * 2048))) || exit 4
elapsed() { awk -v a="\$1" -v b="\$(now)" 'BEGIN { printf "%.2f", b - a }'; }
mkdir -p /mnt/share /copy
mount -t 9p -o trans=virtio,version=9p2000.L,msize=$MSIZE host0 /mnt/share || exit 10
mount -t tmpfs tmpfs /copy || exit 11
t=\$(now); cp -a /mnt/share/tree /copy/tree || exit 12; mark COPY-S "\$(elapsed \$t)"
mark COPY-FILES "\$(find /copy/tree -type f | wc -l)"
rm -rf /copy/tree; umount /mnt/share
t=\$(now); dd if=/dev/zero of=\$disk bs=1M count=$DISK_MB oflag=direct conv=fsync 2>/dev/null || exit 13
mark SEQW-S "\$(elapsed \$t)"
t=\$(now); dd if=\$disk of=/dev/null bs=1M count=$DISK_MB iflag=direct 2>/dev/null || exit 14
mark SEQR-S "\$(elapsed \$t)"
iops() { i=\${1##*iops=}; echo "\${i%% *}"; }
r=\$(rio read \$disk $DISK_MB $RIO_S) || exit 15; echo "\$r"; mark RANDR-IOPS "\$(iops "\$r")"
r=\$(rio write \$disk $DISK_MB $RIO_S) || exit 16; echo "\$r"; mark RANDW-IOPS "\$(iops "\$r")"
SH
)

# bench_vmm VMM: both boots under VMM; results as KEY=VALUE lines in $W/res.VMM.
bench_vmm() {
  L2_VMM=$1
  res="$W/res.$1"
  : > "$res"
  rm -f "$W/disk.raw" "$W/pmem.img"
  truncate -s "${DISK_MB}M" "$W/disk.raw" || fail "truncate disk.raw"
  if [ "$1" = densevm ]; then
    densevm image create "$W/pmem.img" 64M > /dev/null || fail "densevm image create pmem.img"
    pfmt=pcow
  else
    truncate -s 64M "$W/pmem.img" || fail "truncate pmem.img"
    pfmt=raw
  fi
  devs="--share $W/share,tag=host0 --disk $W/disk.raw,format=raw --pmem $W/pmem.img --rng"

  export L2_MEM=256M
  log="$W/$1-idle.log"
  echo "# $1: idle boot"
  # shellcheck disable=SC2086
  l2_start "$log" "$GUEST_INITRD" "$IDLE_SCRIPT" $devs
  wait_for_line_pid "$log" DENSEVM-IDLE 600 "$L2_PID"
  case $? in
    0) ;;
    *) l2_wait "$log" "$1 idle boot" 5; fail "$1 idle boot: no DENSEVM-IDLE" ;;
  esac
  sleep $((IDLE_S / 2))
  total=$(uss_kb "$L2_PID")
  echo "PROC_USS_KB=$total" >> "$res"
  if [ "$1" = qemu ]; then
    guest=$(vma_uss_kb "$L2_PID" 204800 "$W/pmem.img")
    echo "VMM_USS_KB=$((total - guest))" >> "$res"
    echo "# qemu: process USS $total kB, guest RAM + pmem USS $guest kB"
  fi
  l2_wait "$log" "$1 idle boot"
  if [ "$1" = densevm ]; then
    o=$(json_field "$log.json" vmm_overhead uss_kib)
    g=$(json_field "$log.json" guest uss_kib)
    [ -n "$o" ] || fail "densevm's report $log.json has no vmm_overhead.uss_kib"
    echo "VMM_USS_KB=$o" >> "$res"
    echo "# densevm: process USS $total kB at idle; report at exit: vmm_overhead USS $o kB, guest USS $g kB"
  fi

  log="$W/$1-work.log"
  # The copied tree lives in the guest's tmpfs: give the workload boot room for it.
  export L2_MEM="${BENCH_WORK_MEM:-1G}"
  echo "# $1: workload boot (pmem image $pfmt)"
  # shellcheck disable=SC2086
  l2_start "$log" "$GUEST_INITRD_TOOLS" "$WORK_SCRIPT" $devs
  l2_wait "$log" "$1 workload boot" 3000
  tr -d '\r' < "$log" | grep -E '^(DENSEVM-|rio )' | grep -v -e GUEST-INIT -e MODULES-LOADED | sed 's/^/#   /'
  [ "$(guest_value "$log" COPY-FILES)" = "$FILES" ] || fail "$1: the guest copied $(guest_value "$log" COPY-FILES) files, not $FILES"
  for k in COPY-S SEQW-S SEQR-S RANDR-IOPS RANDW-IOPS; do
    v=$(guest_value "$log" "$k")
    [ -n "$v" ] || fail "$1: the guest reported no $k"
    echo "$k=$v" | tr - _ >> "$res"
  done
}

failed=""
for vmm in $VMMS; do
  if ! (bench_vmm "$vmm"); then
    failed="$failed $vmm"
    echo "# $vmm FAILED (see the FAIL line above)"
  fi
done

val() { # val VMM KEY
  [ -f "$W/res.$1" ] && sed -n "s/^$2=//p" "$W/res.$1" | head -n 1
}
row() { # row LABEL KEY AWK-EXPR(v): one table line, densevm | QEMU | ratio
  d=$(val densevm "$2"); q=$(val qemu "$2")
  awk -v label="$1" -v d="$d" -v q="$q" -v mb="$DISK_MB" "
    function f(v) { return $3 }
    BEGIN {
      dv = (d == \"\") ? \"n/a\" : sprintf(\"%.1f\", f(d))
      qv = (q == \"\") ? \"n/a\" : sprintf(\"%.1f\", f(q))
      r = (d == \"\" || q == \"\" || f(q) == 0) ? \"n/a\" : sprintf(\"%.2f\", f(d) / f(q))
      printf \"| %s | %s | %s | %s |\n\", label, dv, qv, r
    }"
}
echo
echo "| metric | densevm | QEMU 7.2 | densevm/QEMU |"
echo "|---|---:|---:|---:|"
row "9p: copy $FILES files out of the share, s (lower is better)" COPY_S "v"
row "blk: sequential write, MiB/s (O_DIRECT 1 MiB, fsync)" SEQW_S "mb / v"
row "blk: sequential read, MiB/s (O_DIRECT 1 MiB)" SEQR_S "mb / v"
row "blk: 4 KiB random read, IOPS (QD1, O_DIRECT)" RANDR_IOPS "v"
row "blk: 4 KiB random write, IOPS (QD1, O_DIRECT)" RANDW_IOPS "v"
row "memory: VMM USS without guest memory, MiB (idle, all devices)" VMM_USS_KB "v / 1024"
row "memory: whole-process USS at idle, MiB" PROC_USS_KB "v / 1024"
if [ -n "$failed" ]; then
  echo
  echo "FAIL: the benchmark did not complete for:$failed"
  exit 1
fi
