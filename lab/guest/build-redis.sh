#!/usr/bin/env bash
# Builds build/guest/initrd-redis.cpio.gz for `make bench-redis-tier` (issue #13's
# Redis-in-guest benchmark, lab/bench/redis-tier.sh): the plain L2 initrd (make guest)
# plus Redis 7.0 from Debian 12's redis-tools package and the zipfian client
# /bin/kvzipf (lab/guest/kvzipf.c, static). Only the benchmark uses it, so `make guest`
# and the test initrds stay as they are.
#   /bin/redis-server  the package's redis-check-rdb binary: Redis picks its mode from
#                      argv[0], and redis-server in the redis-server package is a link to it
#   the libraries it needs: libjemalloc2 and liblzf1 from their packages (downloaded with
#   it), the others (libssl3, libsystemd0, libatomic1, ...) from the host, through ldd
# Idempotent: rebuilt only when an input is newer than the output.
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
source "$(dirname "$0")/../lib/common.sh"
here="$LAB_ROOT/lab/guest"
cd "$GUEST_DIR" 2> /dev/null || die "no $GUEST_DIR; run 'make guest' first"
[ -s initrd.cpio.gz ] && [ -d initrd-root ] || die "no plain initrd in $GUEST_DIR; run 'make guest' first"
out=initrd-redis.cpio.gz
if [ -e "$out" ] && [ "$out" -nt initrd.cpio.gz ] && [ "$out" -nt "$here/kvzipf.c" ] && [ "$out" -nt "$self" ]; then
  log "$GUEST_DIR/$out is up to date"
  exit 0
fi
command -v cc > /dev/null || die "no C compiler (cc) for lab/guest/kvzipf.c; apt-get install gcc"
if [ ! -x redis/x/usr/bin/redis-check-rdb ]; then
  log "downloading redis-tools, libjemalloc2, liblzf1 (Debian 12)"
  rm -rf redis && mkdir -p redis/deb
  (cd redis/deb && apt-get download -q redis-tools libjemalloc2 liblzf1 2>&1 |
    grep -v '^W: Download is performed unsandboxed' >&2) ||
    die "apt-get download redis-tools libjemalloc2 liblzf1 failed (try apt-get update)"
  for d in redis/deb/*.deb; do dpkg -x "$d" redis/x; done
  [ -x redis/x/usr/bin/redis-check-rdb ] || die "redis-tools has no usr/bin/redis-check-rdb"
fi
log "building $out"
cc -O2 -s -static -Wall -Werror -o kvzipf "$here/kvzipf.c" -lm ||
  die "cannot build the static client lab/guest/kvzipf.c (a static libc is in libc6-dev)"
rm -rf redis-root && cp -a initrd-root redis-root
cp redis/x/usr/bin/redis-check-rdb redis-root/bin/redis-server
cp kvzipf redis-root/bin/kvzipf
# ldd finds the two downloaded libraries through LD_LIBRARY_PATH; a library the host
# lacks shows as "not found", which would fail in the guest: refuse it here.
lib="$GUEST_DIR/redis/x/usr/lib/x86_64-linux-gnu"
if LD_LIBRARY_PATH="$lib" ldd redis-root/bin/redis-server | grep -q 'not found'; then
  LD_LIBRARY_PATH="$lib" ldd redis-root/bin/redis-server | grep 'not found' >&2
  die "redis-server needs libraries the host lacks (apt-get install the packages named above)"
fi
# The two downloaded libraries go where the guest's ld.so looks for them; the rest keep
# the host's paths.
for l in $(LD_LIBRARY_PATH="$lib" ldd_libs redis-root/bin/redis-server); do
  case "$l" in "$lib"/*) dest=/usr/lib/x86_64-linux-gnu/${l##*/} ;; *) dest=$l ;; esac
  mkdir -p "redis-root$(dirname "$dest")"
  cp -L "$l" "redis-root$dest"
done
(cd redis-root && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) | gzip -6 > "$out.tmp"
mv "$out.tmp" "$out"
rm -rf redis-root
log "$GUEST_DIR/$out: $(stat -c %s "$out") B"
