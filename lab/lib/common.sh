# Shared helpers for the nested lab scripts (sourced, not executed).
# shellcheck shell=bash

LAB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GUEST_DIR="${GUEST_DIR:-$LAB_ROOT/build/guest}"
LAB_BUILD="${LAB_BUILD:-$LAB_ROOT/build/lab}"

die() {
  echo "lab: error: $*" >&2
  exit 1
}

log() {
  echo "lab: $*" >&2
}

# Prints the kernel release recorded by `make guest` (e.g. 6.1.0-56-amd64).
guest_kernel_release() {
  [ -s "$GUEST_DIR/kernel-release" ] || die "no guest kernel in $GUEST_DIR; run 'make guest' first"
  cat "$GUEST_DIR/kernel-release"
}

# resolve_modules MODDIR NAME... : prints the module paths (relative to MODDIR,
# as in MODDIR/modules.dep) needed for NAMEs, dependencies first, each once.
resolve_modules() {
  local moddir="$1"
  shift
  [ -s "$moddir/modules.dep" ] || die "missing $moddir/modules.dep (run depmod)"
  awk -v want="$*" '
    {
      path = $1; sub(/:$/, "", path)
      name = path; sub(/.*\//, "", name); sub(/\.ko(\.[a-z]+)?$/, "", name); gsub(/-/, "_", name)
      byname[name] = path
      deps[path] = ""
      for (i = 2; i <= NF; i++) deps[path] = deps[path] " " $i
    }
    function visit(p,   n, i, d) {
      if (p in done) return
      done[p] = 1
      n = split(deps[p], d, " ")
      # modules.dep lists the transitive closure; visiting each first keeps
      # every dependency ahead of its users.
      for (i = n; i >= 1; i--) visit(d[i])
      print p
    }
    END {
      n = split(want, w, " ")
      for (i = 1; i <= n; i++) {
        key = w[i]; gsub(/-/, "_", key)
        if (!(key in byname)) { print "unknown module: " w[i] > "/dev/stderr"; bad = 1; continue }
        visit(byname[key])
      }
      exit bad
    }' "$moddir/modules.dep"
}

# ldd_libs BINARY: the absolute paths of the shared libraries ldd reports for BINARY
# (the loader included).
ldd_libs() {
  ldd "$1" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\/[^ ]+ \(/{print $1}'
}

# copy_libs DEST BINARY... : copies the shared libraries ldd reports for each binary
# into the root DEST, keeping their absolute paths.
copy_libs() {
  local dest="$1" bin lib
  shift
  for bin in "$@"; do
    [ -x "$bin" ] || die "missing binary $bin"
    for lib in $(ldd_libs "$bin"); do
      [ -e "$dest$lib" ] && continue
      mkdir -p "$dest$(dirname "$lib")"
      cp -L "$lib" "$dest$lib"
    done
  done
}

# copy_with_libs DEST BINARY... : copies each binary (absolute path) and the shared
# libraries ldd reports for it into the root DEST, keeping their absolute paths.
copy_with_libs() {
  local dest="$1" bin
  shift
  for bin in "$@"; do
    [ -x "$bin" ] || die "missing binary $bin"
    mkdir -p "$dest$(dirname "$bin")"
    cp -L "$bin" "$dest$bin"
    copy_libs "$dest" "$bin"
  done
}
