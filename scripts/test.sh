#!/usr/bin/env bash
# test.sh: the whole test suite, as root. Sets up first (see setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
FENCE_TEMPLATES=${FENCE_TEMPLATES:-minimal base} scripts/setup.sh
export FENCE_TEST_TEMPLATES=${FENCE_TEMPLATES_DIR:-/var/lib/fence/templates}
export FENCE_BIN="$PWD/bin/fence"
export PATH=$PATH:/usr/local/go/bin
echo "==> go vet"
go vet ./...
echo "==> go test (unit, privileged and end-to-end)"
go test -count=1 -timeout 30m ./... "$@"
echo "==> go test -race (the concurrent packages that need no sandbox)"
go test -race -count=1 ./internal/agent/... ./internal/egress/... ./internal/sandbox ./internal/httpapi \
  ./internal/store ./internal/metrics ./internal/isolation/warm ./client/... ./internal/cli
echo "==> the official e2b JavaScript SDK against fence (tests/e2b)"
tests/e2b/run.sh
