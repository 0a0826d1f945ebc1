#!/usr/bin/env bash
# Fetch Fashion-MNIST from the Debian/Ubuntu package `dataset-fashion-mnist` without installing it.
#
# Usage: .ci/fetch_fashion_mnist.sh CACHE_DIR
#
# Downloads the .deb with `apt-get download` (running `apt-get update` first if the package is
# unknown and we are root), unpacks it with `dpkg-deb -x` into CACHE_DIR and prints, as the only
# line on stdout, the folder holding the four IDX files:
#   CACHE_DIR/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
# (package 0.0~git20200523.55506a9-1, 30.9 MB). Pass that folder to jaxgossip as raw_dir, or set
# JAXGOSSIP_FASHION_MNIST_DIR for tests/data/test_data.py.
#
# Idempotent: if the four files are already there, nothing is downloaded. Never fails CI: if apt
# or dpkg-deb is unavailable or the download fails, it prints a warning on stderr and exits 0 with
# nothing on stdout (the tests that need the data are then skipped).
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 CACHE_DIR" >&2
  exit 2
fi
cache_dir=$1
target="$cache_dir/usr/share/datasets/fashion-mnist"
files="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"

have_all() {
  for f in $files; do
    [ -s "$target/$f" ] || return 1
  done
  return 0
}

warn() {
  echo "fetch_fashion_mnist: WARNING: $*; Fashion-MNIST tests will be skipped" >&2
  exit 0
}

if have_all; then
  echo "fetch_fashion_mnist: already unpacked in $target" >&2
  echo "$target"
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || warn "apt-get not found"
command -v dpkg-deb >/dev/null 2>&1 || warn "dpkg-deb not found"

work=$(mktemp -d) || warn "mktemp failed"
trap 'rm -rf "$work"' EXIT
# apt drops privileges to _apt for downloads; let it write into the temporary folder.
chmod 0777 "$work" 2>/dev/null || true

download() {
  (cd "$work" && apt-get download -q dataset-fashion-mnist >&2)
}

if ! download; then
  if [ "$(id -u)" = 0 ]; then
    echo "fetch_fashion_mnist: apt-get download failed; running apt-get update" >&2
    apt-get update -q >&2 || warn "apt-get update failed"
    download || warn "apt-get download dataset-fashion-mnist failed"
  else
    warn "apt-get download dataset-fashion-mnist failed (not root, so apt-get update was not tried)"
  fi
fi

deb=$(ls "$work"/dataset-fashion-mnist_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || warn "no .deb was downloaded"
mkdir -p "$cache_dir" || warn "cannot create $cache_dir"
dpkg-deb -x "$deb" "$cache_dir" || warn "dpkg-deb -x failed"
have_all || warn "the package did not contain the expected files in $target"
echo "fetch_fashion_mnist: unpacked $(basename "$deb") into $cache_dir" >&2
echo "$target"
