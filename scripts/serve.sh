#!/usr/bin/env bash
# serve.sh: set up (see setup.sh) and run the daemon in the foreground.
# Extra arguments go to `fence serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec bin/fence serve --templates-dir "${FENCE_TEMPLATES_DIR:-/var/lib/fence/templates}" "$@"
