#!/bin/sh
# lab-seconds: 6
# lab-cpus: all
# pmem copy-on-write on hardware-style KVM (issue 5): L1's kvm-amd, unlike the development
# host's PVM, refuses a vCPU write to a PROT_READ host page with a bare EFAULT (Linux 6.1
# has no KVM_EXIT_MEMORY_FAULT). densevm therefore maps base-image and snapshot clusters
# into KVM read-only (KVM_MEM_READONLY), so those writes arrive as MMIO exits. Checks: a
# probe guest writes over a base image and over a snapshot; the images check clean, the
# top image holds exactly the expected bytes, and the base and the snapshot are unchanged.
. "$LAB_SRC/lib/test-lib.sh"
need_cmd densevm
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
tmpfs_workdir /tmp/pmem-cow

raw() { # raw IMAGE OUT: the image's guest-visible bytes
  densevm image convert -f pcow -O raw "$1" "$2" || fail "convert $1 to raw"
}
probe() { # probe IMAGE SCRIPT
  timeout 300 densevm run --pmem "$1" --cpus 2 --probe "$2" > probe.log 2>&1
  status=$?
  cat probe.log
  [ "$status" = 0 ] || fail "densevm run --pmem $1 --probe '$2' exited with $status"
}

densevm image create base.pcow 4M || fail "image create"
probe base.pcow 'write pmem0 0 256K 0x11; exit 0'
head -c 4194304 /dev/zero > base.expect
fill base.expect 0 64 021

# 1. Copy-on-write over a base image, from two vCPUs' worth of script.
densevm image create top.pcow 4M -b base.pcow || fail "image create -b"
probe top.pcow 'write pmem0 4K 8K 0x22; write pmem0 1M 4K 0x33; sum pmem0 0 16K; exit 0'
cp base.expect top.expect
fill top.expect 1 2 042
fill top.expect 256 1 063
# 2. Copy-on-write over a snapshot of the top image.
densevm image snapshot create top.pcow s1 || fail "snapshot create"
cp top.expect snap.expect
probe top.pcow 'write pmem0 8K 4K 0x44; write pmem0 2M 4K 0x55; exit 0'
fill top.expect 2 1 104
fill top.expect 512 1 125

for img in base.pcow top.pcow; do
  densevm image check "$img" || fail "image check $img: exit $?"
done
raw top.pcow top.raw; raw base.pcow base.raw
cmp top.expect top.raw || fail "top image content differs from what the guest wrote"
cmp base.expect base.raw || fail "the base image changed"
densevm image snapshot apply top.pcow s1 || fail "snapshot apply"
raw top.pcow snap.raw
cmp snap.expect snap.raw || fail "snapshot s1 does not hold the pre-snapshot content"
echo "PASS: guest writes copy-on-write over a base image and a snapshot on kvm-amd"
