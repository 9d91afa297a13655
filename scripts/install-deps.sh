#!/usr/bin/env bash
# Installs everything densevm needs from Debian apt and crates.io. Idempotent:
# a second run installs nothing and takes about a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

want=()
while read -r pkg; do
  pkg="${pkg%%#*}"; pkg="$(echo "$pkg" | xargs)"
  [ -z "$pkg" ] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || want+=("$pkg")
done < "$here/apt-packages.txt"

if [ "${#want[@]}" -gt 0 ]; then
  echo "install-deps: apt-get install ${want[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "install-deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
for comp in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$comp" || rustup component add "$comp"
done
if [ -f "$here/pip-requirements.txt" ] && grep -qv '^\s*#' "$here/pip-requirements.txt"; then
  python3 -m pip install -q -r "$here/pip-requirements.txt"
fi
# cargo-fuzz drives the fuzz targets in fuzz/ (`make test-fuzz`, part of `make test`).
if ! command -v cargo-fuzz >/dev/null; then
  echo "install-deps: cargo install cargo-fuzz --locked"
  cargo install cargo-fuzz --locked --quiet
fi
