#!/usr/bin/env bash
# Builds the cached parts of the L1 lab initramfs under build/lab/:
#   l1-base.cpio.gz  busybox-static, bash, iproute2's ip (as iproute2-ip), kvm/9p/virtio
#                    modules, QEMU + libs + ROMs,
#                    e2fsprogs' e2fsck and debugfs (check and read guest ext4 images), init
#   l1-guest.cpio    the L2 artifacts from build/guest/ at /guest (uncompressed: fast to unpack)
# Each is rebuilt only when its inputs change. `lab/run` appends a small per-run
# archive (densevm binary + script) to these.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
here="$LAB_ROOT/lab/l1"
mkdir -p "$LAB_BUILD"
cd "$LAB_BUILD"
release="$(guest_kernel_release)"
moddir="$GUEST_DIR/pkg/lib/modules/$release"
for f in vmlinuz vmlinux initrd.cpio.gz initrd-tools.cpio.gz; do
  [ -s "$GUEST_DIR/$f" ] || die "missing $GUEST_DIR/$f; run 'make guest' first"
done
qemu="$(command -v qemu-system-x86_64 || true)"
[ -n "$qemu" ] || die "qemu-system-x86_64 not found; run 'make deps' (apt package qemu-system-x86)"
file -L /bin/busybox | grep -q 'statically linked' || die "/bin/busybox is not static; apt-get install busybox-static"

newer() { # newer OUT IN... : true when OUT is missing or older than any IN
  local out="$1"; shift
  [ -e "$out" ] || return 0
  local f; for f in "$@"; do [ "$f" -nt "$out" ] && return 0; done
  return 1
}
pack() { # pack DIR : newc cpio of DIR on stdout
  (cd "$1" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0)
}

if newer l1-base.cpio.gz "$here/init" "$here/modules.txt" "$qemu" /bin/busybox \
    "$GUEST_DIR/kernel-release" "$0" "$LAB_ROOT/lab/lib/common.sh"; then
  log "building L1 base image (kernel $release, modules, busybox, QEMU)"
  root="$LAB_BUILD/l1-base"
  rm -rf "$root" && mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc,root,lab/work,guest}
  cp /bin/busybox "$root/bin/busybox"
  ln -s busybox "$root/bin/sh"
  cp "$here/init" "$root/init"
  chmod 755 "$root/init"
  for tool in /sbin/e2fsck /sbin/debugfs; do
    [ -x "$tool" ] || die "missing $tool; apt-get install e2fsprogs"
  done
  copy_with_libs "$root" /bin/bash "$qemu" /sbin/e2fsck /sbin/debugfs
  ln -sf /bin/bash "$root/usr/bin/bash"
  # iproute2's ip as iproute2-ip (busybox's ip stays `ip`): `ip tuntap add ... user N`
  # makes a tap an unprivileged jailed VMM may open (lab/tests/jail.sh).
  [ -x /bin/ip ] || die "missing /bin/ip; apt-get install iproute2"
  copy_with_libs "$root" /bin/ip
  mv "$root/bin/ip" "$root/usr/bin/iproute2-ip"
  # QEMU finds its firmware in /usr/share/qemu and /usr/share/seabios (Debian build).
  mkdir -p "$root/usr/share/qemu" "$root/usr/share/seabios"
  for rom in linuxboot.bin linuxboot_dma.bin kvmvapic.bin pvh.bin multiboot.bin multiboot_dma.bin; do
    cp -L "/usr/share/qemu/$rom" "$root/usr/share/qemu/"
  done
  cp -L /usr/share/seabios/bios-256k.bin /usr/share/seabios/bios.bin "$root/usr/share/seabios/"
  ln -s ../seabios/bios-256k.bin "$root/usr/share/qemu/bios-256k.bin"
  wanted="$(sed 's/#.*//' "$here/modules.txt" | xargs)"
  resolve_modules "$moddir" $wanted > "$root/lib-load-order"
  mkdir -p "$root/lib/modules/$release"
  while read -r m; do
    mkdir -p "$root/lib/modules/$release/$(dirname "$m")"
    cp "$moddir/$m" "$root/lib/modules/$release/$m"
  done < "$root/lib-load-order"
  mv "$root/lib-load-order" "$root/lib/modules/load-order"
  echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
  echo "root:x:0:" > "$root/etc/group"
  pack "$root" | gzip -1 > l1-base.cpio.gz.tmp
  mv l1-base.cpio.gz.tmp l1-base.cpio.gz
  rm -rf "$root"
fi

if newer l1-guest.cpio "$GUEST_DIR/vmlinuz" "$GUEST_DIR/vmlinux" "$GUEST_DIR/initrd.cpio.gz" \
    "$GUEST_DIR/initrd-tools.cpio.gz"; then
  log "packing L2 artifacts for L1"
  root="$LAB_BUILD/l1-guest"
  rm -rf "$root" && mkdir -p "$root/guest"
  cp "$GUEST_DIR/vmlinuz" "$GUEST_DIR/vmlinux" "$GUEST_DIR/initrd.cpio.gz" \
    "$GUEST_DIR/initrd-tools.cpio.gz" "$GUEST_DIR/kernel-release" "$root/guest/"
  pack "$root" > l1-guest.cpio.tmp
  mv l1-guest.cpio.tmp l1-guest.cpio
  rm -rf "$root"
fi
