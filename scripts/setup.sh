#!/usr/bin/env bash
# setup.sh: install what fence needs on a fresh Debian 12 machine (as root),
# build bin/fence and the templates. Idempotent; cached work is reused.
#
#   FENCE_TEMPLATES_DIR  where templates are built and kept between runs
#                        (default /var/lib/fence/templates, fence's default)
#   FENCE_TEMPLATES   templates to build (default "minimal base code-interpreter")
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (fence needs namespaces, cgroups and mounts)" >&2
  exit 1
fi

need=()
for pair in busybox:busybox-static mmdebstrap:mmdebstrap bwrap:bubblewrap runc:runc \
            mkfs.ext4:e2fsprogs mkfs.btrfs:btrfs-progs node:nodejs npm:npm unshare:util-linux curl:curl gcc:gcc ip:iproute2; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
[ -x /bin/busybox ] || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
  echo "==> installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

export PATH=$PATH:/usr/local/go/bin
# kube-apiserver and etcd for the scale-out tests (cached; ~9 min the first time).
scripts/build-kube.sh
echo "==> building bin/fence"
scripts/build.sh

# runsc for the gvisor backend, cached in /var/lib/fence/cache/runsc.
scripts/build-runsc.sh

tdir=${FENCE_TEMPLATES_DIR:-/var/lib/fence/templates}
for t in ${FENCE_TEMPLATES:-minimal base code-interpreter}; do
  echo "==> template $t (kept in $tdir)"
  bin/fence template build "$t" --templates-dir "$tdir"
done
