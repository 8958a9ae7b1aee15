#!/usr/bin/env bash
# build-kube.sh: build kube-apiserver (for fence's scale-out integration
# tests) into /var/lib/fence/cache/kube/<version>/kube-apiserver from the
# wrapper module in scripts/kube, and install Debian's etcd-server when etcd is
# missing. Kept between runs; rebuilt only when the binary is missing.
# About 9 minutes on 2 cores the first time.
#
#   FENCE_KUBE_CACHE  cache root (default /var/lib/fence/cache/kube)
# Tests find the binary at $FENCE_KUBE_CACHE/v1.37.2/kube-apiserver (or
# FENCE_KUBE_APISERVER) and etcd on PATH (or FENCE_ETCD).
set -euo pipefail
cd "$(dirname "$0")/kube"
version=v1.37.2
root=${FENCE_KUBE_CACHE:-/var/lib/fence/cache/kube}
out=$root/$version/kube-apiserver

if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
  echo "==> installing etcd-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
  # the package's own service is not wanted: tests start etcd themselves
  systemctl disable --now etcd >/dev/null 2>&1 || true
fi

if [ -x "$out" ]; then
  echo "==> kube-apiserver $version cached at $out"
  exit 0
fi
export PATH=$PATH:/usr/local/go/bin
echo "==> building kube-apiserver $version (about 9 minutes, kept in $out)"
mkdir -p "$root/$version"
[ -f go.sum ] || go mod tidy
CGO_ENABLED=0 go build -trimpath -o "$out.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$out.tmp" "$out"
echo "==> kube-apiserver built: $out"
