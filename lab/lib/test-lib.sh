# Helpers for lab tests and benchmarks (sourced inside L1 from $LAB_SRC/lib/test-lib.sh).
# shellcheck shell=sh

fail() {
  echo "FAIL: $*"
  # What L1's kernel said last (OOM kills, KVM complaints) often explains a failure.
  echo "--- last L1 kernel messages:"
  dmesg 2>/dev/null | tail -n 6
  exit 1
}

# Kernel parameters of every densevm L2 boot in the lab: pci=noearly skips Linux's search
# for an AGP bridge on AMD CPUs (TCG's -cpu max is one), 256 buses x 32 slots read through
# ports 0xcf8/0xcfc twice: ~33,700 exits to densevm's user space, ~3 s of a boot here
# (docs/benchmarks.md, "Linux boot time in the nested lab"). Not a cause of L1's TCG
# stalls: taken off for one CI run on 2026-12-07, L1 stalled three times in it (twice in
# densevm-l2-boot's acpi=off boot, which had never stalled with it), as often as in the
# two runs with it.
L2_KERNEL_ARGS="pci=noearly"

# vmm_threads PID: each thread of a (hung) VMM: name, state, kernel wait channel and the
# syscall it is in (/proc/PID/task/T/syscall: number and arguments), to tell where it waits.
vmm_threads() {
  echo "--- threads of pid $1:"
  for _t in /proc/"$1"/task/*; do
    [ -d "$_t" ] || continue
    echo "  $(cat "$_t/comm" 2>/dev/null) tid ${_t##*/}: state $(awk '{ print $3 }' "$_t/stat" 2>/dev/null)," \
      "wchan $(cat "$_t/wchan" 2>/dev/null), syscall $(cat "$_t/syscall" 2>/dev/null)," \
      "kernel stack: $(head -n 4 "$_t/stack" 2>/dev/null | awk '{ printf "%s ", $2 }')"
  done
}

# need_file PATH...: fails loudly when an artifact is missing.
need_file() {
  for f in "$@"; do
    [ -s "$f" ] || fail "missing $f (the lab image lacks an artifact; run 'make guest' on the host)"
  done
}

# need_cmd NAME...: fails loudly when a command is not on PATH.
need_cmd() {
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || fail "command '$c' not found in L1"
  done
}

# wait_for_line FILE PATTERN SECONDS: waits until FILE contains PATTERN (grep -F).
wait_for_line() {
  _i=0
  while [ "$_i" -lt "$(($3 * 10))" ]; do
    grep -qF "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
    _i=$((_i + 1))
  done
  return 1
}

# uptime_s: seconds since L1 boot with two decimals (monotonic across the run).
uptime_s() {
  cut -d' ' -f1 /proc/uptime
}

# mapping_kb PID PATH: sums the smaps fields of every mapping of file PATH in process
# PID and prints "rss pss shared_clean private_clean private_dirty" in kB.
mapping_kb() {
  awk -v path="$2" '
    /^[0-9a-f]+-[0-9a-f]+ / { inside = ($6 == path); next }
    inside && $1 == "Rss:" { rss += $2 }
    inside && $1 == "Pss:" { pss += $2 }
    inside && $1 == "Shared_Clean:" { sc += $2 }
    inside && $1 == "Private_Clean:" { pc += $2 }
    inside && $1 == "Private_Dirty:" { pd += $2 }
    END { printf "%d %d %d %d %d\n", rss, pss, sc, pc, pd }' "/proc/$1/smaps"
}

# uss_kb PID: Private_Clean + Private_Dirty of the whole process, in kB.
uss_kb() {
  awk '$1 == "Private_Clean:" || $1 == "Private_Dirty:" { s += $2 } END { print s + 0 }' "/proc/$1/smaps_rollup"
}

# wait_for_line_pid FILE PATTERN SECONDS PID: like wait_for_line, but gives up at once
# (status 2) when process PID has exited without FILE containing PATTERN.
wait_for_line_pid() {
  _i=0
  while [ "$_i" -lt "$(($3 * 10))" ]; do
    grep -qF "$2" "$1" 2>/dev/null && return 0
    if ! kill -0 "$4" 2>/dev/null; then
      grep -qF "$2" "$1" 2>/dev/null && return 0
      return 2
    fi
    sleep 0.1
    _i=$((_i + 1))
  done
  return 1
}

# tmpfs_workdir DIR: mounts a fresh tmpfs on DIR (pcow images need fallocate, which the
# initramfs's ramfs lacks) and changes into it.
tmpfs_workdir() {
  mkdir -p "$1" && mount -t tmpfs tmpfs "$1" || fail "cannot mount a tmpfs on $1"
  cd "$1" || fail "cd $1"
}

# scratch_disk DIR: formats the scratch disk the script asked for (a "# lab-disk: SIZE" line,
# lab/run: virtio-blk over a sparse file on the host) and mounts it on DIR. L1's own files
# live in RAM, where a tier's swap file would be DRAM no budget counts, read at memory speed.
scratch_disk() {
  [ -b /dev/vda ] || fail "no scratch disk /dev/vda: the script needs a '# lab-disk: SIZE' line (lab/run)"
  mke2fs -F /dev/vda > /dev/null 2>&1 || fail "mke2fs /dev/vda"
  mkdir -p "$1" && mount -t ext4 /dev/vda "$1" || fail "mount /dev/vda on $1 (ext4 module?)"
}

# fill FILE OFFSET LEN OCTAL: overwrites LEN 4 KiB blocks of FILE from block OFFSET with
# the byte OCTAL (e.g. 021 for 0x11); the expected contents of an image.
fill() {
  head -c "$(($3 * 4096))" /dev/zero | tr '\0' "\\$4" |
    dd of="$1" bs=4096 seek="$2" conv=notrunc 2>/dev/null || fail "dd into $1"
}

# guest_pmem_script: shell text for an L2 guest script's start: waits up to 5 s for
# /dev/pmem0 (nd_pmem probes asynchronously) and exits 3 without it.
guest_pmem_script() {
  echo 'i=0; while [ ! -b /dev/pmem0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done'
  echo '[ -b /dev/pmem0 ] || { echo "no /dev/pmem0"; exit 3; }'
}

# run_pmem_guest LOG IMAGE MODULES SCRIPT: boots the L2 kernel with --pmem IMAGE, loads
# MODULES (comma-separated) and runs the guest shell SCRIPT (plain text); fails unless
# densevm exits 0 and the script reports status 0. Prints the log's DENSEVM lines; densevm's
# JSON report goes to LOG.json (see json_number).
run_pmem_guest() {
  _b64=$(printf '%s\n' "$4" | base64 | tr -d '\n')
  timeout 600 densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M \
    --report-json "$1.json" --pmem "$2" --cmdline "console=ttyS0 panic=-1 $L2_KERNEL_ARGS quiet modules=$3 densevm.script=$_b64" > "$1" 2>&1
  _status=$?
  grep -E 'DENSEVM|/mnt' "$1" | head -n 20
  [ "$_status" = 0 ] || { tail -n 30 "$1"; fail "densevm run --pmem $2 exited with $_status"; }
  grep -q 'DENSEVM-GUEST-EXIT=0' "$1" || { tail -n 30 "$1"; fail "the guest script failed"; }
}

# json_number FILE KEY: the first number stored under "KEY" in densevm's JSON report FILE.
json_number() {
  sed -n "s/.*\"$2\": \([0-9][0-9]*\).*/\1/p" "$1" | head -n 1
}

# guest_value LOG NAME: the value the guest printed as DENSEVM-NAME=value (the serial
# console ends lines with CR LF).
guest_value() {
  tr -d '\r' < "$1" | sed -n "s/.*DENSEVM-$2=\\(.*\\)\$/\\1/p" | head -n 1
}

# need_l2_densevm: what every densevm L2 test needs in L1 (densevm, the L2 kernel and
# initrd, /dev/kvm); fails naming what is missing.
need_l2_densevm() {
  need_cmd densevm
  need_file "$GUEST_VMLINUX" "$GUEST_INITRD"
  [ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
}

# ---- L2 VMs with virtio devices (lab/tests/virtio-devices.sh, lab/bench/virtio.sh) ----
# Devices are given as densevm run flags: --disk PATH[,readonly][,format=raw|pcow],
# --share DIR,tag=TAG[,readonly], --pmem IMAGE, --rng, --net tap=NAME[,mac=MAC]. L2_VMM=qemu runs the same VM under
# QEMU 7.2 (the peer) with the equivalent devices: -drive if=virtio,format=raw,
# cache=writeback (L1's tmpfs has no O_DIRECT, so no cache=none; densevm's virtio-blk also
# goes through the host page cache), -virtfs local,security_model=none, virtio-pmem-pci on a
# memory-backend-file (raw images only), virtio-rng-pci from /dev/urandom, -netdev tap with
# virtio-net-pci (vhost=$L2_QEMU_VHOST, default off). L2_APPEND: extra guest kernel command
# line words (e.g. densevm.agent). Paths must not
# contain spaces or commas.
L2_VMM="${L2_VMM:-densevm}"
L2_QEMU_ACCEL="${L2_QEMU_ACCEL:--enable-kvm -cpu host}"
# The virtio modules every device VM loads (lab/guest/init's modules=).
L2_MODULES=virtio_pci,virtio_blk,9pnet_virtio,9p,virtio_rng,virtio_pmem,nd_pmem,ext4,crc32c_generic

# Shell functions for L2 scripts (text; start a guest script with "$GUEST_FNS"):
#   wait_dev PATH...     waits up to 20 s for each device node; exit 3 naming a missing one
#   dev_of_size SECTORS  the vdX whose size is SECTORS (512 B): tells the --disk images apart
#   tree_sum DIR         one md5 over "md5  ./path" of every file below DIR (sorted)
#   now                  guest uptime in seconds (two decimals)
#   mark NAME VALUE      prints DENSEVM-NAME=VALUE (read on L1 with guest_value)
#   step TEXT            prints a progress line with the guest's uptime
TREE_SUM_FN='tree_sum() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs md5sum) | md5sum | cut -d" " -f1; }'
eval "$TREE_SUM_FN"
GUEST_FNS=$(cat <<'SH'
wait_dev() {
  for d in "$@"; do
    i=0; while [ ! -e "$d" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
    [ -e "$d" ] || { echo "guest: no $d; devices: $(ls /sys/bus/virtio/devices 2>/dev/null | tr '\n' ' ')"; exit 3; }
  done
}
dev_of_size() {
  for b in /sys/block/vd*; do [ "$(cat "$b/size")" = "$1" ] && { echo "/dev/${b##*/}"; return 0; }; done
  echo "guest: no virtio disk of $1 sectors" >&2; return 1
}
now() { cut -d" " -f1 /proc/uptime; }
mark() { echo "DENSEVM-$1=$2"; }
step() { echo "DENSEVM-STEP $(now) $*"; }
SH
)
GUEST_FNS="$GUEST_FNS
$TREE_SUM_FN"

# make_tree DIR FILES MAXBYTES SEED: FILES files of 1..MAXBYTES (<= 8192) printable bytes,
# 100 per directory DIR/dN/fM, from one awk process (a fork per file is slow under TCG).
make_tree() {
  mkdir -p "$1" || fail "mkdir $1"
  _d=0
  while [ $((_d * 100)) -lt "$2" ]; do mkdir -p "$1/d$_d"; _d=$((_d + 1)); done
  awk -v dir="$1" -v n="$2" -v max="$3" -v seed="$4" 'BEGIN {
    srand(seed)
    for (i = 0; i < 8192; i++) pool = pool sprintf("%c", 33 + int(rand() * 94))
    for (i = 0; i < n; i++) {
      f = dir "/d" int(i / 100) "/f" i
      size = 1 + int(rand() * max)
      printf "%s", substr(pool, 1 + int(rand() * (8193 - size)), size) > f
      close(f)
    }
  }' || fail "cannot generate $2 files in $1"
}

# qemu_device_args FLAG...: QEMU arguments for densevm device flags (see above).
qemu_device_args() {
  _n=0
  while [ $# -gt 0 ]; do
    _n=$((_n + 1))
    case "$1" in
      --disk)
        _ro=""; case ",$2," in *,readonly,*) _ro=",readonly=on" ;; esac
        case ",$2," in *,format=pcow,*) fail "QEMU cannot open pcow disk ${2%%,*}" ;; esac
        echo "-drive file=${2%%,*},if=virtio,format=raw,cache=writeback$_ro"
        shift 2 ;;
      --share)
        _path=${2%%,*}; _tag=$(echo "$2" | sed -n 's/.*,tag=\([^,]*\).*/\1/p')
        _ro=""; case ",$2," in *,readonly,*) _ro=",readonly=on" ;; esac
        echo "-virtfs local,path=$_path,mount_tag=$_tag,security_model=none,id=fs$_n$_ro"
        shift 2 ;;
      --pmem)
        echo "-object memory-backend-file,id=pm$_n,share=on,mem-path=$2,size=$(stat -c %s "$2")"
        echo "-device virtio-pmem-pci,memdev=pm$_n,id=vpmem$_n"
        shift 2 ;;
      --rng)
        echo "-object rng-random,filename=/dev/urandom,id=rng$_n -device virtio-rng-pci,rng=rng$_n"
        shift ;;
      --net)
        # tap=NAME[,mac=MAC]: a tap opened by QEMU (vnet_hdr), vhost-net per $L2_QEMU_VHOST
        # (off by default); romfile= because L1 carries no option ROMs.
        _tap=$(echo "$2" | sed -n 's/^tap=\([^,]*\).*/\1/p')
        _mac=$(echo "$2" | sed -n 's/.*,mac=\([^,]*\).*/\1/p')
        echo "-netdev tap,id=net$_n,ifname=$_tap,script=no,downscript=no,vhost=${L2_QEMU_VHOST:-off}"
        echo "-device virtio-net-pci,netdev=net$_n,romfile=${_mac:+,mac=$_mac}"
        shift 2 ;;
      *) fail "qemu_device_args: unknown flag $1" ;;
    esac
  done
}

# l2_start LOG INITRD SCRIPT FLAG...: boots the L2 kernel (vmlinux, PVH) under $L2_VMM in
# the background: $L2_MEM of RAM (default 256M), 1 vCPU, the devices FLAG..., modules $L2_MODULES, and the guest
# shell SCRIPT (text, sent gzipped). The guest console goes to LOG (QEMU's stderr to
# LOG.err); densevm also writes its JSON memory report to LOG.json. Sets L2_PID.
# L2_CPUS (a taskset list, e.g. 0) keeps every thread of the VMM on those L1 CPUs.
l2_start() {
  _log=$1 _initrd=$2
  _b64=$(printf '%s\n' "$3" | gzip -9 | base64 | tr -d '\n')
  shift 3
  _cmd="console=ttyS0 panic=-1 $L2_KERNEL_ARGS quiet modules=$L2_MODULES${L2_APPEND:+ $L2_APPEND} densevm.script=$_b64"
  [ ${#_cmd} -le 2040 ] || fail "guest script too long: the command line would be ${#_cmd} bytes (limit 2047)"
  : > "$_log"
  rm -f "$_log.json"
  _pin=""
  [ -n "${L2_CPUS:-}" ] && _pin="taskset -c $L2_CPUS"
  case "$L2_VMM" in
    densevm)
      $_pin densevm run --kernel "$GUEST_VMLINUX" --initrd "$_initrd" --memory "${L2_MEM:-256M}" --report-json "$_log.json" \
        --cmdline "$_cmd" "$@" > "$_log" 2>&1 &
      ;;
    qemu)
      _qargs=$(qemu_device_args "$@") || { echo "$_qargs"; exit 1; }
      _mem=${L2_MEM:-256M}
      case " $* " in *" --pmem "*) _mem=$_mem,slots=2,maxmem=8G ;; esac
      # shellcheck disable=SC2086
      $_pin qemu-system-x86_64 $L2_QEMU_ACCEL -m "$_mem" -nodefaults -no-user-config -display none \
        -no-reboot -serial "file:$_log" -kernel "$GUEST_VMLINUX" -initrd "$_initrd" -append "$_cmd" \
        $_qargs > "$_log.err" 2>&1 &
      ;;
    *) fail "L2_VMM must be densevm or qemu, not '$L2_VMM'" ;;
  esac
  L2_PID=$!
  L2_LINES=0
  L2_START=$(cut -d. -f1 /proc/uptime)
}

# l2_follow LOG: prints the guest console lines that LOG gained since the last call (prefix
# "  L2| "), so that a slow or stuck guest shows where it is in the lab's output.
l2_follow() {
  _n=$(wc -l < "$1")
  if [ "$_n" -gt "$L2_LINES" ]; then
    sed -n "$((L2_LINES + 1)),${_n}p" "$1" | tr -d '\r' | sed 's/^/  L2| /'
    L2_LINES=$_n
  fi
}

# l2_rejected LOG: fails with a clear message when densevm refused its command line (a
# device flag it does not know yet); returns otherwise.
l2_rejected() {
  if grep -qE "^error: (unexpected argument|invalid value|unrecognized)|Usage: densevm run" "$1" 2>/dev/null; then
    grep -m 3 -E "^error:|tip:" "$1"
    fail "densevm rejected its command line (are --disk/--share/--pmem/--rng implemented in this build?)"
  fi
}

# l2_wait LOG WHAT [SECONDS]: waits (default 600 s) for the VM of the last l2_start to end;
# fails unless the VMM exited 0 and the guest script reported DENSEVM-GUEST-EXIT=0.
l2_wait() {
  _end=$((L2_START + ${3:-600}))
  _size=-1 _quiet=0
  while kill -0 "$L2_PID" 2>/dev/null && [ "$(cut -d. -f1 /proc/uptime)" -lt "$_end" ]; do
    l2_follow "$1"
    sleep 2
    # No console output for 120 s: show where the VMM's threads wait (once), which
    # tells a hung VMM from a slow guest when the run later times out.
    _now=$(wc -c < "$1" 2>/dev/null || echo 0)
    if [ "$_now" = "$_size" ]; then
      _quiet=$((_quiet + 2))
      [ "$_quiet" = 120 ] && { echo "--- $2: no console output for 120 s"; vmm_threads "$L2_PID"; }
    else
      _size=$_now _quiet=0
    fi
  done
  l2_follow "$1"
  if kill -0 "$L2_PID" 2>/dev/null; then
    kill -9 "$L2_PID"; wait "$L2_PID" 2>/dev/null
    fail "$2: the VM did not end within ${3:-600} s"
  fi
  wait "$L2_PID"
  _status=$?
  echo "--- $2: $L2_VMM ended with $_status after $(($(cut -d. -f1 /proc/uptime) - L2_START)) s"
  l2_rejected "$1"
  if [ "$_status" != 0 ] || ! grep -q 'DENSEVM-GUEST-EXIT=0' "$1"; then
    cat "$1.err" 2>/dev/null | tail -n 10
    fail "$2: $L2_VMM exited with $_status, guest status '$(guest_value "$1" GUEST-EXIT)'"
  fi
}

# l2_run LOG WHAT INITRD SCRIPT FLAG...: l2_start, then l2_wait.
l2_run() {
  _rlog=$1 _rwhat=$2 _rinitrd=$3 _rscript=$4
  shift 4
  l2_start "$_rlog" "$_rinitrd" "$_rscript" "$@"
  l2_wait "$_rlog" "$_rwhat"
}

# l2_kill_at LOG MARKER WHAT [SECONDS]: kill -9s the VM of the last l2_start as soon as the
# guest console LOG shows MARKER (polled every 20 ms); fails when it never does.
l2_kill_at() {
  _end=$((L2_START + ${4:-600}))
  _i=0
  while ! grep -qF "$2" "$1" 2>/dev/null; do
    if ! kill -0 "$L2_PID" 2>/dev/null || [ "$(cut -d. -f1 /proc/uptime)" -ge "$_end" ]; then
      kill -9 "$L2_PID" 2>/dev/null; wait "$L2_PID" 2>/dev/null
      l2_follow "$1"
      l2_rejected "$1"
      fail "$3: no $2 on the guest console"
    fi
    sleep 0.02
    _i=$((_i + 1))
    [ $((_i % 100)) = 0 ] && l2_follow "$1"
  done
  kill -9 "$L2_PID"
  wait "$L2_PID" 2>/dev/null
  l2_follow "$1"
  echo "--- $3: killed $L2_VMM (kill -9) at $2, $(($(cut -d. -f1 /proc/uptime) - L2_START)) s after its start"
}

# json_field FILE OBJECT KEY: the number under "KEY" inside the object "OBJECT": { ... } of
# densevm's pretty-printed JSON report FILE (e.g. vmm_overhead uss_kib).
json_field() {
  awk -v obj="\"$2\":" -v key="\"$3\":" '
    $1 == obj { inside = 1; next }
    inside && /^ *}/ { exit }
    inside && $1 == key { v = $2; sub(/,$/, "", v); print v; exit }' "$1"
}

# vma_uss_kb PID MIN_KB [PATH...]: USS (Private_Clean + Private_Dirty, kB) of the VMAs of
# PID that are anonymous and at least MIN_KB large, or that map one of PATHs: a VMM's guest
# RAM and pmem files.
vma_uss_kb() {
  _pid=$1 _min=$2; shift 2
  awk -v min="$_min" -v paths=" $* " '
    function hex(h,   i, n) {
      n = 0
      for (i = 1; i <= length(h); i++) n = n * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
      return n
    }
    /^[0-9a-f]+-[0-9a-f]+ / {
      split($1, r, "-")
      kb = (hex(r[2]) - hex(r[1])) / 1024
      inside = ($6 == "" && kb >= min) || ($6 != "" && index(paths, " " $6 " ") > 0)
      next
    }
    inside && ($1 == "Private_Clean:" || $1 == "Private_Dirty:") { s += $2 }
    END { print s + 0 }' "/proc/$_pid/smaps"
}
