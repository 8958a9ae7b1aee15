#!/usr/bin/env bash
# setup.sh: install what fence needs on a fresh Debian 12 machine (as root),
# build bin/fence and the templates. Idempotent; cached work is reused.
#
#   scripts/setup.sh            everything the test suite needs: the packages
#                               of the tests and benchmarks too, runsc for the
#                               gvisor backend, the templates of $FENCE_TEMPLATES
#   scripts/setup.sh --serve    only what `fence serve` needs to start: its
#                               packages, bin/fence, minimal and base
#   scripts/setup.sh --later    what serving can do without at first: runsc
#                               and the code-interpreter template (serve.sh
#                               runs it in the background)
#
#   FENCE_TEMPLATES_DIR  where templates are built and kept between runs
#                        (default /var/lib/fence/templates, fence's default)
#   FENCE_TEMPLATES      templates to build (default "minimal base code-interpreter";
#                        with --serve "minimal base", with --later "code-interpreter")
# The test-only kube-apiserver is built by scripts/test.sh (build-kube.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
case $mode in
  all|--serve|--later) ;;
  *) echo "usage: scripts/setup.sh [--serve|--later]" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (fence needs namespaces, cgroups and mounts)" >&2
  exit 1
fi

# command:package pairs. Serving needs busybox (the minimal template),
# mmdebstrap (base), mkfs.ext4 (each sandbox's writable layer), mkfs.btrfs
# (--layer-fs btrfs) and unshare; ssh and sftp (openssh-client) are `fence
# ssh`'s and the SSH server's tests'; the tests and benchmarks add bwrap and
# runc (peers), node and npm (the e2b SDK), curl, gcc, ip, initdb (the
# store's tests start a PostgreSQL server; Debian keeps initdb off PATH,
# under /usr/lib/postgresql/VERSION/bin) and chromium (the dashboard's
# browser test and the desktop stream's viewer).
pairs=(busybox:busybox-static mmdebstrap:mmdebstrap mkfs.ext4:e2fsprogs mkfs.btrfs:btrfs-progs unshare:util-linux ssh:openssh-client sftp:openssh-client)
if [ "$mode" = all ]; then
  pairs+=(bwrap:bubblewrap runc:runc node:nodejs npm:npm curl:curl gcc:gcc ip:iproute2 initdb:postgresql chromium:chromium)
fi
need=()
if [ "$mode" != --later ]; then
  for pair in "${pairs[@]}"; do
    cmd=${pair%%:*}; pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/$cmd" >/dev/null || need+=("$pkg")
  done
  [ -x /bin/busybox ] || need+=(busybox-static)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "==> installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

export PATH=$PATH:/usr/local/go/bin
if [ "$mode" != --later ]; then
  echo "==> building bin/fence"
  scripts/build.sh
fi

# runsc for the gvisor backend, cached in /var/lib/fence/cache/runsc.
if [ "$mode" != --serve ]; then
  scripts/build-runsc.sh
fi

case $mode in
  all) templates=${FENCE_TEMPLATES:-minimal base code-interpreter} ;;
  --serve) templates=${FENCE_TEMPLATES:-minimal base} ;;
  --later) templates=${FENCE_TEMPLATES:-code-interpreter} ;;
esac
tdir=${FENCE_TEMPLATES_DIR:-/var/lib/fence/templates}
for t in $templates; do
  echo "==> template $t (kept in $tdir)"
  bin/fence template build "$t" --templates-dir "$tdir"
done
