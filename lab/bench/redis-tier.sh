#!/bin/sh
# lab-disk: 1G
# Redis inside the L2 guest under a DRAM budget (issue #13's Redis-in-guest benchmark), run
# in L1 by `make bench-redis-tier` (lab/run lab/bench/redis-tier.sh with the initrd of
# lab/guest/build-redis.sh in LAB_EXTRA). One L1 boot, one L2 VM per mode, one after the
# other (BENCH_REDIS_MODES, default "tier kernel-zswap"), each `densevm run` of the Debian
# kernel (BENCH_REDIS_KERNEL, below) with $BENCH_REDIS_MEM of RAM, 1 vCPU, vsock + agent:
#   tier     --memory-budget: densevm's tier (LZ4 store + swap file on the scratch disk;
#            BENCH_REDIS_BUDGET_OPTS is appended to the budget's options, e.g. ",async_pf=on")
#   kernel-zswap  no budget; the VMM runs in a cgroup v2 whose memory.high L1's kernel
#            enforces, with zswap (lz4, zsmalloc) in front of a swap file on the same disk
#            and vm.page-cluster 0: the kernel's answer, and the pair of the tier's store +
#            file. zswap's pool is charged to the cgroup; every 10 s memory.high is set so
#            that guest RAM's pages + the pool hold share x WS, as the tier's budget does
#            (BENCH_REDIS_HOLD=0: fixed once, as in runs 7-13, when the kernel's reclaim of
#            the cgroup's other charge gave the guest ~20 % more). The VM copies its boot
#            images into guest RAM as one with a budget does (BENCH_REDIS_IMAGES=map: mapped
#            from their files, as in runs 1-13). memory.zswap.max caps the pool
#            at BENCH_REDIS_ZSWAP_FRAC of the limit (default 1/4, the tier's store share;
#            `max`: no cap — L1's 6.1 kernel cannot write the pool back for one cgroup, so
#            the VMM stalls once the pool alone outgrows the limit)
#   kernel   the same with zram (lz4) as L1's swap; zram is not charged to the cgroup, so
#            this kernel holds more DRAM than its limit
#   tier-eq  the tier again, its budget in each window the DRAM the `kernel` mode's guest RAM
#            used in the same window, counted low (below)
#   tier-eq-hi  the same with that DRAM counted high: resident guest RAM + all of zram (the
#            kernel also swaps the cgroup's other pages, whose part of zram cannot be told
#            apart): the kernel's true figure lies between the two
#   tier-alt the tier with another densevm build (BENCH_REDIS_ALT, a path in L1) or other
#            budget options (BENCH_REDIS_ALT_OPTS instead of BENCH_REDIS_BUDGET_OPTS, e.g.
#            ",poll=off"), for paired runs in one boot ("tier tier-alt tier tier-alt"); like
#            `tier`, each of its VMs measures its own WS after the load
# In each, L1 runs through `densevm exec`: `kvzipf load` (BENCH_REDIS_KEYS keys of
# BENCH_REDIS_VLEN bytes into redis-server), then for each DRAM share of BENCH_REDIS_SHARES
# (default 1/1 1/2 1/3 1/4): set the share, `kvzipf run` (YCSB-B, zipfian theta 0.99;
# BENCH_REDIS_WARMUP s of warm-up, default 180: shorter, both modes are still bringing back
# what the cut to the share sent out, docs/benchmarks.md "Run 11"; BENCH_REDIS_WARMUP_FULL
# for the 1/1 windows, default the same; BENCH_REDIS_SECS s
# measured, default 30; every GET compared with what its key's last SET
# wrote), then `kvzipf check` (every key). The share is of the working set WS: the guest RAM
# the tier VM holds resident after the load (its GET /memory-tier). tier: budget = share x
# WS (1/1: the whole RAM, so the tier does nothing). Kernel modes: memory.high = share x WS
# + the cgroup's other charge (memory.current after the load minus guest RAM resident: the
# mapped initrd (and kernel), the VMM, KVM's page tables; 1/1: no limit).
# "DRAM" columns hold guest RAM only: tier = resident + compressed store (what the budget
# counts); kernel-zswap = the cgroup's shmem (guest RAM) + zswap's pool (memory.stat);
# kernel = memory.current + zram's mem_used_total - the other charge.
# Each window's line also has, over its measured part, L1 KVM's counters and IPIs (kvm_*,
# below) and, for the tier, its DRAM when the measured part began (dram_at_measure_kib).
# The fault counts cover the whole window (warm-up included); those named m_* the measured
# part alone.
# Lines "REDISTIER ..." are the raw results; a table follows. Times are TCG-distorted: read
# each mode against its own all-DRAM windows, and the modes against each other.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd awk
INITRD=$LAB_EXTRA/initrd-redis.cpio.gz
need_file "$INITRD"
KEYS=${BENCH_REDIS_KEYS:-131072}
VLEN=${BENCH_REDIS_VLEN:-1000}
MEM=${BENCH_REDIS_MEM:-512M}
# The guest's kernel: `vmlinux` (mapped from its file; the guest's writes to its image are
# copy-on-write pages outside guest RAM, which the kernel modes may swap and the tier never
# takes) or `bzimage` (copied into guest RAM, where the tier and the kernel see alike).
case "${BENCH_REDIS_KERNEL:=bzimage}" in
  vmlinux) KERNEL=$GUEST_VMLINUX ;;
  bzimage) KERNEL=$GUEST_BZIMAGE ;;
  *) fail "BENCH_REDIS_KERNEL is vmlinux or bzimage" ;;
esac
WARM=${BENCH_REDIS_WARMUP:-180}
SECS=${BENCH_REDIS_SECS:-30}
MODES=${BENCH_REDIS_MODES:-tier kernel-zswap}
ZSWAP_FRAC=${BENCH_REDIS_ZSWAP_FRAC:-1/4}
case "$ZSWAP_FRAC" in max | [0-9]*/[1-9]*) ;; *) fail "BENCH_REDIS_ZSWAP_FRAC is N/D or max" ;; esac
SHARES=${BENCH_REDIS_SHARES:-1/1 1/2 1/3 1/4}
# A window that takes this long (four times its length, and a minute) has stalled.
STALL_S=$((4 * (WARM + SECS) + 60))
W=/tmp/redis-tier
tmpfs_workdir "$W"
# The tier's swap file goes on the scratch disk (# lab-disk above): L1's own files live in
# RAM, where a swap file would be DRAM the budget does not count, read at memory speed.
SWAPDIR=$W
if [ -b /dev/vda ]; then
  scratch_disk /mnt/tier
  SWAPDIR=/mnt/tier
else
  echo "# redis-tier: no scratch disk (/dev/vda): the tier's swap file is in L1's RAM"
fi
echo "# redis-tier: $(date -u +%Y-%m-%dT%H:%MZ), L1 $(nproc) vCPUs, L2 $MEM, $KEYS keys x $VLEN B, windows ${WARM}+${SECS} s, modes: $MODES, guest kernel $BENCH_REDIS_KERNEL, zswap cap $ZSWAP_FRAC, VMM on L1 CPUs ${BENCH_REDIS_CPUS:-all}"

GUEST='ip link set lo up
redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --protected-mode no --daemonize no > /tmp/redis.log 2>&1 &
echo DENSEVM-REDIS-STARTED'
GUEST_B64=$(printf '%s\n' "$GUEST" | base64 | tr -d '\n')
cg=/sys/fs/cgroup/densevm-redis
KSWAP=/mnt/tier/kernel.swap
# zswap_off: the kernel-zswap mode's swap file off, zswap disabled.
zswap_off() {
  swapoff "$KSWAP" 2> /dev/null
  [ -w /sys/module/zswap/parameters/enabled ] && echo N > /sys/module/zswap/parameters/enabled
}
# is_kernel MODE: the modes whose VMM runs in the cgroup, without a budget.
is_kernel() { [ "$1" = kernel ] || [ "$1" = kernel-zswap ]; }
# cg_setup: the cgroup v2 the kernel modes' VMM runs in.
cg_setup() {
  [ -n "$ws_kib" ] || fail "the kernel modes need WS from the tier mode first (or BENCH_REDIS_WS_KIB)"
  [ -e /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup || fail "cannot mount cgroup2"
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control || fail "no memory controller"
  mkdir -p "$cg"
  echo max > "$cg/memory.high"
  echo 0 > /proc/sys/vm/page-cluster
}
# vmstat_n KEY: a counter of /proc/vmstat (0 if this kernel has none).
vmstat_n() { awk -v k="$1" '$1 == k { v = $2 } END { print v + 0 }' /proc/vmstat; }
# cgstat_n KEY: a figure of the cgroup's memory.stat (0 if none).
cgstat_n() { awk -v k="$1" '$1 == k { v = $2 } END { print v + 0 }' "$cg/memory.stat"; }
vm=
cleanup() {
  [ -n "$vm" ] && kill -9 "$vm" 2> /dev/null
  swapoff /dev/zram0 2> /dev/null
  zswap_off
  rmdir "$cg" 2> /dev/null
  umount /mnt/tier 2> /dev/null
}
trap cleanup EXIT

# start_vm MODE: boots the VM (kernel mode: in the cgroup) and waits for Redis.
start_vm() {
  rm -f "$W"/*.sock
  budget=
  opts=${BENCH_REDIS_BUDGET_OPTS:-}
  [ "$1" = tier-alt ] && [ -n "${BENCH_REDIS_ALT_OPTS:-}" ] && opts=$BENCH_REDIS_ALT_OPTS
  is_kernel "$1" || budget="--memory-budget $MEM,swap_dir=$SWAPDIR$opts"
  # The kernel modes' VMM joins the cgroup before it allocates anything.
  join=:
  is_kernel "$1" && join="echo \$\$ > $cg/cgroup.procs"
  # BENCH_REDIS_CPUS: the VMM's threads on these L1 CPUs only (a busybox taskset list,
  # e.g. 1), in every mode: a VM confined to one CPU, as on a host packed with VMs.
  pin=
  [ -n "${BENCH_REDIS_CPUS:-}" ] && pin="busybox taskset -c $BENCH_REDIS_CPUS"
  # tier-alt: the same with another densevm binary (BENCH_REDIS_ALT), to pair two builds
  # in one L1 boot (boots differ more than builds, docs/benchmarks.md run 12).
  bin=densevm
  [ "$1" = tier-alt ] && [ -n "${BENCH_REDIS_ALT:-}" ] && bin=$BENCH_REDIS_ALT
  # The kernel modes copy the boot images into guest RAM as a budget does (BENCH_REDIS_IMAGES
  # =map: mapped from their files, as runs 1-13 did), so all guest memory is in RAM's file.
  images=
  is_kernel "$1" && images="--boot-images ${BENCH_REDIS_IMAGES:-copy}"
  sh -c "$join && exec $pin $bin run --kernel $KERNEL --initrd $INITRD --memory $MEM $images \
    --vsock cid=3,uds=$W/v.sock --api-sock $W/api.sock $budget --report-json $W/$1.json \
    --cmdline '${BENCH_REDIS_CMDLINE:-}console=ttyS0 panic=-1 quiet densevm.agent hold densevm.script=$GUEST_B64'" > "$W/$1.log" 2>&1 &
  vm=$!
  wait_for_line_pid "$W/$1.log" DENSEVM-REDIS-STARTED 300 "$vm" || { tail -n 20 "$W/$1.log"; fail "$1: the guest did not start Redis"; }
  X="densevm exec --api-sock $W/api.sock --wait 120 --no-stdin --"
  # Redis listens a moment after it starts: retry the load's connection.
  i=0
  until $X kvzipf load "$KEYS" "$VLEN" > "$W/load.out" 2>&1; do
    i=$((i + 1))
    [ $i -lt 30 ] && grep -q connect "$W/load.out" || { cat "$W/load.out"; fail "$1: kvzipf load"; }
    sleep 1
  done
  echo "$1: $(cat "$W/load.out")"
}

# guest_kib: the guest data the kernel-zswap mode's cgroup holds: guest RAM's pages (the
# cgroup's shmem: RAM's file is its only one) + zswap's pool, KiB.
guest_kib() { echo $((($(cgstat_n shmem) + $(cgstat_n zswap)) / 1024)); }
# kernel_hold TARGET_KIB SECS: for SECS s, every 10 s, sets memory.high so that the guest's
# data holds TARGET_KIB, as the tier's budget does: TARGET + whatever else the cgroup holds
# now. Under pressure the kernel also reclaims the cgroup's other charge (KVM's page tables,
# the VMM's heap: ~23 MiB after the load, ~6 MiB at 1/3 in runs 12 and 12b), which the
# tier's budget does not cover; memory.high fixed at the start gave the guest that much
# more. Each step is logged to $W/hold.log.
kernel_hold() {
  _end=$(($(uptime_s | cut -d. -f1) + $2))
  while [ "$(uptime_s | cut -d. -f1)" -lt "$_end" ]; do
    sleep 10
    _g=$(guest_kib) _cur=$(($(cat "$cg/memory.current") / 1024))
    _high=$(($1 + _cur - _g))
    [ "$_high" -ge "$1" ] || _high=$1
    echo $((_high * 1024)) > "$cg/memory.high"
    echo "$(uptime_s) guest $_g KiB, memory.current $_cur KiB, memory.high $_high KiB" >> "$W/hold.log"
  done
}

# kvmstat: L1 KVM's counters (debugfs) and L1's call-function and TLB-shootdown IPIs, one
# "name value" a line; kvm_delta A B: the chosen ones' growth from A to B. They show how a
# fault is served: the tier's faults halt the vCPU and wake threads across L1's CPUs (IPIs),
# the kernel's swap-ins mostly do not.
grep -q ' /sys/kernel/debug ' /proc/mounts || mount -t debugfs none /sys/kernel/debug || true
kvmstat() {
  for f in exits halt_wakeup pf_taken remote_tlb_flush; do
    echo "$f $(cat /sys/kernel/debug/kvm/$f 2> /dev/null || echo 0)"
  done
  awk '$1 == "CAL:" { print "ipi_call", $2 + $3 } $1 == "TLB:" { print "ipi_tlb", $2 + $3 }' /proc/interrupts
}
kvm_delta() { paste "$1" "$2" | awk '{ printf "kvm_%s=%d ", $1, $4 - $2 }'; }
# tier_get: one GET /memory-tier into $W/t.json; tier_n KEY: a counter from it.
tier_get() { densevm vm memory-tier --api-sock "$W/api.sock" --json > "$W/t.json" || fail "GET /memory-tier"; }
tier_n() { json_number "$W/t.json" "$1"; }
# tier_n0 NAME: the same, 0 where the answer lacks it (a build before the counter).
tier_n0() { v=$(tier_n "$1"); echo "${v:-0}"; }
# tier_dram FILE: the DRAM a GET /memory-tier answer counts (resident + compressed store), KiB.
tier_dram() { echo $(($(json_number "$1" resident_kib) + $(json_number "$1" compressed_kib))); }
zram_used() { awk '{ print $3 }' /sys/block/zram0/mm_stat 2> /dev/null || echo 0; }
vmm_rss_kib() { awk '$1 == "Rss:" { print $2 }' "/proc/$vm/smaps_rollup"; }
# ram_kib: guest RAM resident in the VMM (its memfd densevm-ram mappings).
ram_kib() { awk '/^[0-9a-f]+-[0-9a-f]+ / { r = / densevm-ram / || /memfd:densevm-ram/ } r && $1 == "Rss:" { s += $2 } END { print s + 0 }' "/proc/$vm/smaps"; }

# $perf, for perf_window and trace_window: the host's perf (Debian 12's linux-perf, version
# 6.1 like L1's kernel) packed with its libraries into build/lab/perf-root and passed in
# LAB_EXTRA: `. lab/lib/common.sh && copy_with_libs build/lab/perf-root /usr/bin/perf`.
pr=$LAB_EXTRA/perf-root
perf="$pr/lib64/ld-linux-x86-64.so.2 --library-path $pr/lib/x86_64-linux-gnu $pr/usr/bin/perf"
# perf_window DELAY SECS: after DELAY s, samples the VMM for SECS s; prints where its
# threads spent their time.
perf_window() {
  sleep "$1"
  $perf record -F 499 -g -p "$vm" -o "$W/perf.data" -- sleep "$2" > "$W/perf.log" 2>&1 || { cat "$W/perf.log"; return; }
  echo "PERF by thread:"
  $perf report -i "$W/perf.data" --sort comm --stdio -g none 2> /dev/null | grep '%' | head -20
  echo "PERF by symbol:"
  $perf report -i "$W/perf.data" --no-children --sort comm,dso,sym --stdio -g none 2> /dev/null | grep '%' | head -70
  echo "PERF tier thread, callers:"
  $perf report -i "$W/perf.data" --comm tier --children --sort sym --stdio -g none 2> /dev/null | grep '%' | head -60
}

# trace_window DELAY SECS: after DELAY s, records L1's scheduler, KVM, IPI and workqueue
# events and the tier thread's system calls for SECS s (BENCH_REDIS_TRACE_SECS, default 2)
# with $perf, and prints them gzipped in base64 between TRACE-BEGIN and
# TRACE-END lines; scripts/redis-tier-trace.py on the host follows each fault through
# them. BENCH_REDIS_TRACE="MODE@SHARE ..." picks the windows. A diagnosis aid, not a
# result: the tracing itself slows the traced window.
trace_window() {
  sleep "$1"
  tier_tid=$(grep -l '^tier$' /proc/"$vm"/task/*/comm 2> /dev/null | head -n 1 | cut -d/ -f5)
  $perf record -a -o "$W/trace.data" -e sched:sched_switch -e sched:sched_wakeup \
    -e kvm:kvm_exit -e kvm:kvm_entry -e kvm:kvm_page_fault -e 'kvm:kvm_async_pf_*' \
    -e kvm:kvm_try_async_get_page -e irq_vectors:call_function_entry \
    -e irq_vectors:call_function_single_entry -e irq_vectors:reschedule_entry \
    -e workqueue:workqueue_execute_start -e workqueue:workqueue_execute_end \
    -e raw_syscalls:sys_enter --filter "common_pid == ${tier_tid:-0}" \
    -e raw_syscalls:sys_exit --filter "common_pid == ${tier_tid:-0}" \
    -- sleep "$2" > "$W/trace.log" 2>&1 || { cat "$W/trace.log"; return; }
  $perf script -i "$W/trace.data" -F comm,tid,cpu,time,event,trace > "$W/trace.txt" 2> "$W/trace.err" || cat "$W/trace.err"
  echo "TRACE-BEGIN vm=$vm tier_tid=$tier_tid lines=$(wc -l < "$W/trace.txt")"
  gzip -c "$W/trace.txt" | base64
  echo "TRACE-END"
}

ws_kib=${BENCH_REDIS_WS_KIB:-}
[ -n "$ws_kib" ] && echo "REDISTIER-WS ws_kib=$ws_kib given=BENCH_REDIS_WS_KIB"
for mode in $MODES; do
  case "$mode" in
    tier) ;;
    tier-alt)
      [ -n "${BENCH_REDIS_ALT:-}${BENCH_REDIS_ALT_OPTS:-}" ] || fail "tier-alt needs BENCH_REDIS_ALT (a second densevm binary in L1, e.g. LAB_EXTRA=build/lab/densevm-old, BENCH_REDIS_ALT=/lab/extra/densevm-old) or BENCH_REDIS_ALT_OPTS (other budget options, e.g. ,poll=off)"
      [ -z "${BENCH_REDIS_ALT:-}" ] || [ -x "$BENCH_REDIS_ALT" ] || fail "BENCH_REDIS_ALT=$BENCH_REDIS_ALT is not an executable in L1"
      ;;
    tier-eq | tier-eq-hi) [ -s "$W/kdram.2" ] || fail "$mode needs the kernel mode's DRAM figures first" ;;
    kernel)
      cg_setup
      swapoff "$KSWAP" 2> /dev/null
      [ -e /sys/block/zram0 ] || fail "no /dev/zram0 (zram module, lab/l1/modules.txt)"
      if ! grep -q '^/dev/zram0 ' /proc/swaps; then
        echo lz4 > /sys/block/zram0/comp_algorithm || echo "# zram: no lz4, $(cat /sys/block/zram0/comp_algorithm)"
        echo 2G > /sys/block/zram0/disksize || fail "zram disksize"
        mkswap /dev/zram0 > /dev/null && swapon /dev/zram0 || fail "swapon /dev/zram0"
      fi
      ;;
    kernel-zswap)
      cg_setup
      [ "$SWAPDIR" = /mnt/tier ] || fail "kernel-zswap needs the scratch disk (/dev/vda, # lab-disk) for its swap file"
      zs=/sys/module/zswap/parameters
      [ -d $zs ] || fail "L1's kernel has no zswap"
      swapoff /dev/zram0 2> /dev/null
      if ! grep -q "^$KSWAP " /proc/swaps; then
        dd if=/dev/zero of="$KSWAP" bs=1M count="${BENCH_REDIS_KSWAP_MIB:-600}" 2> /dev/null || fail "the swap file $KSWAP"
        chmod 600 "$KSWAP"
        mkswap "$KSWAP" > /dev/null && swapon "$KSWAP" || fail "swapon $KSWAP"
      fi
      echo lz4 > $zs/compressor || echo "# zswap: no lz4, $(cat $zs/compressor)"
      echo zsmalloc > $zs/zpool || echo "# zswap: no zsmalloc, $(cat $zs/zpool)"
      echo Y > $zs/enabled || fail "cannot enable zswap"
      echo "# zswap: enabled $(cat $zs/enabled), $(cat $zs/compressor), $(cat $zs/zpool), max_pool_percent $(cat $zs/max_pool_percent); swap $(tail -n +2 /proc/swaps | awk '{ printf "%s %s KiB; ", $1, $3 }')"
      ;;
    *) fail "unknown mode $mode (tier, tier-alt, kernel, kernel-zswap, tier-eq, tier-eq-hi)" ;;
  esac
  t0=$(uptime_s)
  start_vm "$mode"
  echo "$mode: up and loaded in $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.0f", b - a }') s"
  if [ "$mode" = tier ] || [ "$mode" = tier-alt ]; then
    tier_get
    ws_kib=$(tier_n resident_kib)
    echo "REDISTIER-WS ws_kib=$ws_kib vmm_rss_kib=$(vmm_rss_kib) guest_ram_rss_kib=$(ram_kib)"
  elif is_kernel "$mode"; then
    # The cgroup's charge besides guest RAM: the mapped kernel and initrd, the VMM's own
    # memory, KVM's shadow page tables. memory.high = share x WS + this.
    cur=$(($(cat "$cg/memory.current") / 1024)) ram=$(ram_kib)
    other=$((cur - ram))
    echo "$mode: after the load memory.current $cur KiB, guest RAM resident $ram KiB (WS $ws_kib KiB from the tier VM), other charge $other KiB"
    echo "$mode: memory.stat: $(awk '$1 ~ /^(anon|file|kernel|shmem|file_mapped|sec_pagetables|pagetables|slab)$/ { printf "%s %d MiB, ", $1, $2 / 1048576 }' "$cg/memory.stat")"
    echo "$mode: the VMM's mappings over 1 MiB resident: $(awk '/^[0-9a-f]+-[0-9a-f]+ / { n = $6 } $1 == "Rss:" && $2 > 1024 { printf "%s %d KiB, ", n, $2 }' "/proc/$vm/smaps")"
  fi
  seed=1 win=0
  for share in $SHARES; do
    win=$((win + 1))
    num=${share%/*} den=${share#*/}
    if [ "$share" = 1/1 ]; then
      if ! is_kernel "$mode"; then
        densevm vm memory-tier --api-sock "$W/api.sock" --budget "$MEM" > /dev/null || fail "PATCH budget"
      else
        echo max > "$cg/memory.high"
        [ -e "$cg/memory.zswap.max" ] && echo max > "$cg/memory.zswap.max"
      fi
      limit_kib=-
    else
      limit_kib=$((ws_kib * num / den))
      # tier-eq: the DRAM the kernel's guest RAM used in the same window (resident + zram).
      [ "$mode" = tier-eq ] && limit_kib=$(cat "$W/kdram.$win")
      [ "$mode" = tier-eq-hi ] && limit_kib=$(cat "$W/kdramhi.$win")
      if ! is_kernel "$mode"; then
        densevm vm memory-tier --api-sock "$W/api.sock" --budget "$((limit_kib / 1024))M" > /dev/null || fail "PATCH budget"
      else
        # The pool's cap first: the memory.high write reclaims before it returns, and a pool
        # still uncapped then takes in all it reclaims (a cut from 1/1 straight to 1/3 put
        # all guest RAM in a pool over the limit, and the VMM stalled: run 14b).
        if [ "$mode" = kernel-zswap ] && [ "$ZSWAP_FRAC" != max ]; then
          echo $((limit_kib * 1024 * ${ZSWAP_FRAC%/*} / ${ZSWAP_FRAC#*/})) > "$cg/memory.zswap.max" || fail "memory.zswap.max"
        fi
        echo $(((limit_kib + other) * 1024)) > "$cg/memory.high" || fail "memory.high"
      fi
    fi
    if ! is_kernel "$mode"; then
      tier_get
      m0=$(tier_n missing_faults) n0=$(tier_n minor_faults) c0=$(tier_n service_cpu_us)
      z0=$(tier_n faults_compressed) w0=$(tier_n faults_swap) p0=$(tier_n0 faults_polled)
    else
      s0=$(vmstat_n pswpin) zi0=$(vmstat_n zswpin) mf0=$(cgstat_n pgmajfault)
    fi
    u0=$(awk '{ print $14 + $15 }' "/proc/$vm/stat")
    # When the measured part starts: KVM's counters, and the tier's DRAM (a cut budget's
    # excess leaves while the guest runs, where the kernel's memory.high write reclaims
    # before it returns: this shows whether it had left by then).
    # The warm-up: BENCH_REDIS_WARMUP_FULL for an all-DRAM window (nothing was cut there).
    warm=$WARM
    [ "$share" = 1/1 ] && warm=${BENCH_REDIS_WARMUP_FULL:-$WARM}
    rm -f "$W/tw.json" "$W/kvm0" "$W/kw0"
    (
      sleep "$warm"
      kvmstat > "$W/kvm0"
      if is_kernel "$mode"; then
        echo "$(cgstat_n pgmajfault) $(vmstat_n zswpin) $(vmstat_n pswpin)" > "$W/kw0"
      else
        densevm vm memory-tier --api-sock "$W/api.sock" --json > "$W/tw.json"
      fi
    ) &
    # BENCH_REDIS_PERF=MODE@SHARE: profile the VMM (perf record -g, cpu-clock) through that
    # window's measured part, with the perf of build/lab/perf-root (LAB_EXTRA) — a
    # diagnosis aid, not a result.
    hold=
    if [ "$mode" = kernel-zswap ] && [ "$share" != 1/1 ] && [ "${BENCH_REDIS_HOLD:-1}" = 1 ]; then
      : > "$W/hold.log"
      kernel_hold "$limit_kib" $((warm + SECS)) &
      hold=$!
    fi
    [ "${BENCH_REDIS_PERF:-}" = "$mode@$share" ] && perf_window "$warm" "$SECS" &
    case " ${BENCH_REDIS_TRACE:-} " in *" $mode@$share "*) trace_window "$warm" "${BENCH_REDIS_TRACE_SECS:-2}" & ;; esac
    # A window that takes four times its length has stalled (memory.high with zswap's pool
    # over the limit: L1's 6.1 kernel cannot write that pool back for one cgroup, so it
    # throttles the VMM): recorded as such, and the mode ends there.
    if ! timeout $STALL_S $X kvzipf run "$KEYS" "$VLEN" "$warm" "$SECS" "$seed" > "$W/run.out" 2>&1; then
      is_kernel "$mode" && ! grep -q ops_per_s= "$W/run.out" || { cat "$W/run.out"; fail "$mode $share: kvzipf run"; }
    fi
    [ -n "$hold" ] && { kill "$hold" 2> /dev/null; wait "$hold" 2> /dev/null; echo "$mode $share: memory.high held the guest at $limit_kib KiB: $(tail -n 1 "$W/hold.log")"; }
    u1=$(awk '{ print $14 + $15 }' "/proc/$vm/stat")
    ops=$(sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1/p' "$W/run.out")
    n=$(sed -n 's/.* ops=\([0-9]*\).*/\1/p' "$W/run.out")
    stalled=
    [ -z "$ops" ] && { ops=0 n=0 stalled=" stalled=${STALL_S}s"; }
    if ! is_kernel "$mode"; then
      tier_get
      dram=$(tier_dram "$W/t.json")
      warm_dram=-
      [ -s "$W/tw.json" ] && warm_dram=$(tier_dram "$W/tw.json")
      faults="missing=$(($(tier_n missing_faults) - m0)) from_compressed=$(($(tier_n faults_compressed) - z0)) from_swap=$(($(tier_n faults_swap) - w0)) minor=$(($(tier_n minor_faults) - n0)) polled=$(($(tier_n0 faults_polled) - p0)) svc_cpu_ms=$((($(tier_n service_cpu_us) - c0) / 1000)) swap_pages=$(tier_n swap_pages) resident_kib=$(tier_n resident_kib) compressed_kib=$(tier_n compressed_kib) compressed_pages=$(tier_n compressed_pages) dram_at_measure_kib=$warm_dram"
      # The measured part alone (the counters at its start, above).
      if [ -s "$W/tw.json" ]; then
        faults="$faults m_missing=$(($(tier_n missing_faults) - $(json_number "$W/tw.json" missing_faults))) m_minor=$(($(tier_n minor_faults) - $(json_number "$W/tw.json" minor_faults))) m_from_swap=$(($(tier_n faults_swap) - $(json_number "$W/tw.json" faults_swap))) m_svc_cpu_ms=$((($(tier_n service_cpu_us) - $(json_number "$W/tw.json" service_cpu_us)) / 1000))"
      fi
    elif [ "$mode" = kernel-zswap ]; then
      # Guest RAM's pages and zswap's pool (with BENCH_REDIS_HOLD=0, as in runs 7-13:
      # everything the cgroup holds less what it held besides guest RAM after the load).
      cur_kib=$(($(cat "$cg/memory.current") / 1024))
      dram=$(guest_kib)
      [ "${BENCH_REDIS_HOLD:-1}" = 1 ] || [ "$share" = 1/1 ] || dram=$((cur_kib - other))
      faults="majfaults=$(($(cgstat_n pgmajfault) - mf0)) zswpin=$(($(vmstat_n zswpin) - zi0)) swapins_disk=$(($(vmstat_n pswpin) - s0)) zswap_kib=$(($(cgstat_n zswap) / 1024)) zswapped_kib=$(($(cgstat_n zswapped) / 1024)) memory_current_kib=$cur_kib guest_ram_rss_kib=$(ram_kib)"
      [ -s "$W/kw0" ] && faults="$faults $(awk -v mf="$(cgstat_n pgmajfault)" -v zi="$(vmstat_n zswpin)" -v si="$(vmstat_n pswpin)" '{ print "m_majfaults=" mf - $1, "m_zswpin=" zi - $2, "m_swapins_disk=" si - $3 }' "$W/kw0")"
    else
      # Everything the cgroup holds plus zram, less what it held besides guest RAM after the
      # load: the kernel may swap the VMM's other pages too (the guest's copy-on-write
      # kernel image pages), which the tier never takes.
      # One sample of each, for every figure of the window.
      cur_kib=$(($(cat "$cg/memory.current") / 1024)) zram_kib=$(($(zram_used) / 1024)) ram=$(ram_kib)
      dram=$((cur_kib + zram_kib - other))
      echo "$dram" > "$W/kdram.$win"
      echo "$((ram + zram_kib))" > "$W/kdramhi.$win"
      faults="swapins=$(($(vmstat_n pswpin) - s0)) majfaults=$(($(cgstat_n pgmajfault) - mf0)) zram_kib=$zram_kib memory_current_kib=$cur_kib guest_ram_rss_kib=$ram"
    fi
    kvmstat > "$W/kvm1"
    kvm=$([ -s "$W/kvm0" ] && kvm_delta "$W/kvm0" "$W/kvm1")
    echo "REDISTIER mode=$mode share=$share limit_kib=$limit_kib ops_per_s=$ops ops=$n dram_kib=$dram vmm_cpu_ticks=$((u1 - u0)) $faults $kvm$stalled" | tee -a "$W/results.txt"
    seed=$((seed + 1))
    [ -n "$stalled" ] && break
  done
  if [ -n "$stalled" ]; then
    # The stalled window's client may still be running in the guest: no check.
    echo "$mode: stalled at $share; the remaining windows and the check are skipped"
  else
    $X kvzipf check "$KEYS" "$VLEN" > "$W/check.out" 2>&1 || { cat "$W/check.out"; fail "$mode: kvzipf check (data lost or wrong)"; }
    echo "$mode: $(cat "$W/check.out")"
  fi
  is_kernel "$mode" || { tr -d '\n' < "$W/t.json"; echo; }
  kill -9 "$vm"; wait "$vm" 2> /dev/null; vm=
  # The disk holds the tier's swap file too: the kernel's goes with its mode.
  [ "$mode" = kernel-zswap ] && { zswap_off; rm -f "$KSWAP"; }
done

# The table: each window against its mode's 1/1 window(s).
echo
echo "| mode | DRAM share | ops/s | vs all-DRAM | DRAM used (of WS) | faults in the window |"
echo "|---|---|---:|---:|---:|---|"
awk -v ws="$ws_kib" '
  /^REDISTIER mode=/ {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    n++; mode[n] = f["mode"]; share[n] = f["share"]; ops[n] = f["ops_per_s"]; dram[n] = f["dram_kib"]
    rest = ""; for (i = 8; i <= NF; i++) rest = rest " " $i; extra[n] = rest
    if (f["share"] == "1/1") { sum[f["mode"]] += f["ops_per_s"]; cnt[f["mode"]]++ }
  }
  END {
    for (i = 1; i <= n; i++) {
      base = cnt[mode[i]] ? sum[mode[i]] / cnt[mode[i]] : 0
      printf "| %s | %s | %.0f | %.0f %% | %.2f |%s |\n", mode[i], share[i], ops[i], base ? 100 * ops[i] / base : 0, dram[i] / ws, extra[i]
    }
  }' "$W/results.txt"
