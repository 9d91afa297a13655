#!/usr/bin/env bash
# `make guest`: builds the L2 guest artifacts under build/guest/ from Debian packages.
#   build/guest/vmlinuz         bzImage of the newest linux-image-6.1.0-N-amd64
#   build/guest/vmlinux         ELF vmlinux extracted by `densevm kernel extract`
#   build/guest/initrd.cpio.gz  busybox-static init + virtio/pmem/9p/vsock modules + the
#                               guest agent /bin/densevm-agent (lab/guest/agent.c, static;
#                               started by init with `densevm.agent` on the cmdline)
#   build/guest/initrd-tools.cpio.gz  the same plus e2fsprogs' mke2fs as /sbin/mkfs.ext4
#                               (busybox's mke2fs makes ext2 only) and /bin/rio (4 KiB random
#                               I/O, lab/guest/rio.c) with their shared libraries; a separate
#                               initrd so that the plain one (boot density) stays small
#   build/guest/kernel-release  e.g. 6.1.0-56-amd64; kernel-package: package=version
# Idempotent: each step runs only when its output is missing or older than its inputs.
# Env: DENSEVM (densevm binary, default target/release/densevm),
#      GUEST_KERNEL_PKG (force a package name, e.g. linux-image-6.1.0-56-amd64).
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
DENSEVM="${DENSEVM:-$LAB_ROOT/target/release/densevm}"
here="$LAB_ROOT/lab/guest"
mkdir -p "$GUEST_DIR"
cd "$GUEST_DIR"

# 1. The kernel package (downloaded once; delete build/guest to pick a newer one).
if [ ! -s kernel-package ] || [ ! -d pkg/boot ]; then
  pkg="${GUEST_KERNEL_PKG:-}"
  find_pkg() {
    apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -n1
  }
  if [ -z "$pkg" ]; then
    pkg="$(find_pkg)"
    if [ -z "$pkg" ]; then
      log "apt-get update (no linux-image-6.1.0-N-amd64 in the apt lists)"
      SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      $SUDO apt-get update -qq
      pkg="$(find_pkg)"
    fi
  fi
  [ -n "$pkg" ] || die "apt knows no linux-image-6.1.0-N-amd64 package; check /etc/apt/sources.list (Debian 12 bookworm main)"
  log "downloading $pkg"
  rm -rf deb pkg && mkdir -p deb
  (cd deb && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) || true
  debfile="$(ls deb/"${pkg}"_*.deb 2>/dev/null | head -n1)"
  [ -n "$debfile" ] || die "apt-get download $pkg produced no .deb"
  dpkg -x "$debfile" pkg.tmp && mv pkg.tmp pkg
  release="${pkg#linux-image-}"
  [ -d "pkg/lib/modules/$release" ] || die "$debfile has no lib/modules/$release"
  depmod -b pkg "$release"
  echo "$release" > kernel-release
  echo "$pkg=$(dpkg-deb -f "$debfile" Version)" > kernel-package
fi
release="$(cat kernel-release)"
moddir="pkg/lib/modules/$release"

# 2. bzImage.
if [ ! -s vmlinuz ] || [ "pkg/boot/vmlinuz-$release" -nt vmlinuz ]; then
  cp "pkg/boot/vmlinuz-$release" vmlinuz.tmp && mv vmlinuz.tmp vmlinuz
fi

# 3. initrd: busybox-static + init + modules.
newer() { # newer OUT IN... : true when OUT is missing or older than any IN
  local out="$1"; shift
  [ -e "$out" ] || return 0
  local f; for f in "$@"; do [ "$f" -nt "$out" ] && return 0; done
  return 1
}
if newer initrd.cpio.gz "$here/init" "$here/modules.txt" "$here/agent.c" /bin/busybox kernel-release "$0"; then
  log "building initrd.cpio.gz"
  file -L /bin/busybox | grep -q 'statically linked' || die "/bin/busybox is not static; apt-get install busybox-static"
  command -v cc > /dev/null || die "no C compiler (cc) for lab/guest/agent.c; apt-get install gcc"
  cc -O2 -s -static -Wall -Werror -o densevm-agent "$here/agent.c" ||
    die "cannot build the static guest agent (lab/guest/agent.c); a static libc is in libc6-dev"
  rm -rf initrd-root && mkdir -p initrd-root/{bin,sbin,proc,sys,dev,tmp,run,etc,root}
  cp /bin/busybox initrd-root/bin/busybox
  ln -s busybox initrd-root/bin/sh
  cp "$here/init" initrd-root/init && chmod 755 initrd-root/init
  cp densevm-agent initrd-root/bin/densevm-agent
  wanted="$(sed 's/#.*//' "$here/modules.txt" | xargs)"
  for m in $(resolve_modules "$moddir" $wanted); do
    mkdir -p "initrd-root/lib/modules/$release/$(dirname "$m")"
    cp "$moddir/$m" "initrd-root/lib/modules/$release/$m"
  done
  cp "$moddir"/modules.{order,builtin,builtin.modinfo} "initrd-root/lib/modules/$release/"
  depmod -b initrd-root "$release"
  echo "$wanted" | tr ' ' ',' > initrd-root/lib/modules/wanted
  (cd initrd-root && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) | gzip -6 > initrd.cpio.gz.tmp
  mv initrd.cpio.gz.tmp initrd.cpio.gz
fi

# 3b. Tools initrd: initrd-root plus real ext4 tools and the random-I/O program, built
#     with the host's cc against the host's libc, which is packed along (ldd).
if newer initrd-tools.cpio.gz initrd.cpio.gz "$here/rio.c" /sbin/mke2fs "$0"; then
  log "building initrd-tools.cpio.gz"
  command -v cc > /dev/null || die "no C compiler (cc) for lab/guest/rio.c; apt-get install gcc"
  [ -x /sbin/mke2fs ] || die "missing /sbin/mke2fs; apt-get install e2fsprogs"
  [ -d initrd-root ] || die "initrd-root is missing; delete $GUEST_DIR/initrd.cpio.gz and rerun"
  cc -O2 -s -Wall -o rio "$here/rio.c"
  rm -rf tools-root && cp -a initrd-root tools-root
  # busybox --install puts its own mke2fs (ext2 only) first on the guest's PATH, so the
  # real one goes in as mkfs.ext4 (mke2fs named so defaults to -t ext4).
  cp -L /sbin/mke2fs tools-root/sbin/mkfs.ext4
  [ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf tools-root/etc/
  cp rio tools-root/bin/rio
  copy_libs tools-root /sbin/mke2fs rio
  (cd tools-root && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) | gzip -6 > initrd-tools.cpio.gz.tmp
  mv initrd-tools.cpio.gz.tmp initrd-tools.cpio.gz
  rm -rf tools-root
fi

# 4. vmlinux, extracted by densevm itself.
if newer vmlinux vmlinuz; then
  [ -x "$DENSEVM" ] || die "missing $DENSEVM; run 'make build' first"
  log "extracting vmlinux with densevm kernel extract"
  # densevm writes a temporary file and renames it, so mapped copies stay intact.
  "$DENSEVM" kernel extract vmlinuz -o vmlinux
fi
log "guest ready in $GUEST_DIR: $(cat kernel-package), vmlinuz $(stat -c %s vmlinuz) B, vmlinux $(stat -c %s vmlinux) B, initrd $(stat -c %s initrd.cpio.gz) B, tools initrd $(stat -c %s initrd-tools.cpio.gz) B"
