#!/usr/bin/env bash
# serve.sh: set up what serving needs (setup.sh --serve: packages, bin/fence,
# the minimal and base templates) and run the daemon in the foreground at once.
# What serving can do without at first is built meanwhile in the background,
# at low priority, its progress shown with a "[later]" prefix and kept in
# $FENCE_TEMPLATES_DIR/../later-build.log: runsc, for the gvisor backend (the
# daemon offers it from its next start), and the code-interpreter template
# (usable as soon as its build ends). Extra arguments go to `fence serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --serve

tdir=${FENCE_TEMPLATES_DIR:-/var/lib/fence/templates}
log=$(dirname "$tdir")/later-build.log
mkdir -p "$(dirname "$log")"
echo "==> runsc and the code-interpreter template: built in the background when missing (log: $log)"
# Started from a subshell that exits at once, so that the daemon exec'd below
# is not its parent; it stays in the terminal's process group and ends with
# Ctrl-C like the daemon does.
(
  (
    if nice -n 10 scripts/setup.sh --later; then
      echo "==> ready: code-interpreter can be used now; the gvisor backend is offered from the daemon's next start if runsc was missing at this one"
    else
      echo "==> failed (see above); run scripts/setup.sh --later to retry"
    fi
  ) 2>&1 | tee "$log" | sed -u 's/^/[later] /' &
)
exec bin/fence serve --templates-dir "$tdir" "$@"
