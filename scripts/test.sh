#!/usr/bin/env bash
# test.sh: the whole test suite, as root. Sets up first (see setup.sh), and
# builds the test-only kube-apiserver for the scale-out tests (build-kube.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# desktop (tests/e2b/test/desktop.test.mjs): about 5.5 min and 1.2 GiB the
# first time, then kept in the templates dir like the others.
FENCE_TEMPLATES=${FENCE_TEMPLATES:-minimal base code-interpreter mcp-gateway desktop} scripts/setup.sh
# kube-apiserver and etcd for the scale-out tests (cached; ~9 min the first time).
scripts/build-kube.sh
export FENCE_TEST_TEMPLATES=${FENCE_TEMPLATES_DIR:-/var/lib/fence/templates}
export FENCE_BIN="$PWD/bin/fence"
export PATH=$PATH:/usr/local/go/bin
echo "==> go vet"
go vet ./...
# Both linters are pinned in go.mod (tool directive); staticcheck.conf, if
# present, lists the checks turned off and why (//lint:ignore for one line).
echo "==> staticcheck"
go tool staticcheck ./...
# gVisor's checklocks over every package with a +checklocks annotation.
# -inferred=false: no "may require an annotation" advice for unannotated
# fields; -wrappers=false: findings without a source position (synthetic
# wrappers of closures) are dropped, since they cannot be read or exempted.
echo "==> checklocks"
# shellcheck disable=SC2046 # one word per package
go vet -vettool="$(go tool -n checklocks)" -inferred=false -wrappers=false \
  $(grep -rl --include='*.go' '+checklocks' cmd api client internal | xargs -n1 dirname | sort -u | sed 's|^|./|')
echo "==> go test (unit, privileged and end-to-end)"
go test -count=1 -timeout 30m ./... "$@"
echo "==> go test -race (the concurrent packages that need no sandbox)"
go test -race -count=1 ./internal/agent/... ./internal/egress/... ./internal/sandbox ./internal/sandbox/timetravel ./internal/httpapi \
  ./internal/store ./internal/metrics ./internal/isolation/warm ./client/... ./internal/cli \
  ./internal/audit ./internal/capacity ./internal/gateway ./internal/daemon
echo "==> fuzz smoke: each parser of sandbox-controlled bytes for a few seconds"
for target in \
  ./internal/egress/policy:FuzzMatch ./internal/egress/policy:FuzzNeverReachable \
  ./internal/egress/sniff:FuzzSniff ./internal/egress/sniff:FuzzHTTPStream ./internal/egress/dns:FuzzResolve \
  ./api:FuzzSandboxTarget ./internal/httpapi:FuzzParseMetadataFilter \
  ./internal/httpapi:FuzzCheckSignature ./internal/agent/users:FuzzResolvePath \
  ./internal/agent/sudo:FuzzDecodeRequest; do
  fuzz() { go test -run '^$' -fuzz "^${target#*:}\$" -fuzztime "${FENCE_FUZZTIME:-3s}" "${target%%:*}" 2>&1; }
  if ! out=$(fuzz); then
    # On a starved machine Go's fuzzing engine can give up waiting for a
    # worker ("context deadline exceeded") without any failing input: that
    # run is repeated once. A failing input always fails the run.
    if grep -q "context deadline exceeded" <<<"$out" && ! grep -q "Failing input" <<<"$out"; then
      echo "fuzz $target: the engine timed out waiting for a worker, with no failing input; once more"
      out=$(fuzz) && continue
    fi
    echo "fuzz $target failed:"
    echo "$out"
    exit 1
  fi
done
echo "==> the official e2b JavaScript SDK against fence (tests/e2b), native backend"
tests/e2b/run.sh
# The same suite against a daemon whose sandboxes are all gVisor ones, so
# that neither backend falls behind the other.
# The gvisor run uses the API key of a team made for it (not the daemon's
# admin key): the SDK suite holds for a tenant as for the admin.
echo "==> the official e2b JavaScript SDK against fence (tests/e2b), gvisor backend, with a team's API key"
FENCE_E2B_TEAM_KEY=1 tests/e2b/run.sh --backend gvisor
