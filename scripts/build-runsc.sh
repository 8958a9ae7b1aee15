#!/usr/bin/env bash
# build-runsc.sh: build gVisor's runsc for fence's gvisor backend and cache it.
#
# runsc is built with CGO disabled (a CGO build cannot re-exec itself inside its
# chroot) from the gvisor.dev/gvisor version pinned in go.mod, so the runsc the
# backend drives is the same code as the netstack the daemon links. The build
# takes minutes on 2 cores, so the binary is kept between runs:
#
#   FENCE_RUNSC_CACHE  cache directory (default /var/lib/fence/cache/runsc)
#
# The binary lands at $FENCE_RUNSC_CACHE/runsc with the version it was built
# from in $FENCE_RUNSC_CACHE/version; it is rebuilt when either is missing or
# when the version pinned in go.mod changes. fence finds it there (or through
# FENCE_RUNSC, or --runsc).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin

cache=${FENCE_RUNSC_CACHE:-/var/lib/fence/cache/runsc}
ver=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
if [ -x "$cache/runsc" ] && [ "$(cat "$cache/version" 2>/dev/null)" = "$ver" ]; then
  echo "==> runsc $ver (cached in $cache)"
  exit 0
fi

echo "==> building runsc $ver into $cache (takes several minutes)"
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# go install pkg@version builds in module mode from the module's own go.mod,
# independent of fence's dependency graph.
GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
  go install -trimpath "gvisor.dev/gvisor/runsc@$ver"
"$tmp/runsc" --version >/dev/null
mv -f "$tmp/runsc" "$cache/runsc"
echo "$ver" > "$cache/version.tmp" && mv -f "$cache/version.tmp" "$cache/version"
echo "==> runsc $ver ready: $cache/runsc"
