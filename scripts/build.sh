#!/usr/bin/env bash
# Builds bin/fence: first the in-sandbox binary (cmd/fence-sandbox, the
# roles fence plays inside a sandbox, nothing else), then the fence binary,
# which carries it (internal/insandbox/embedded). Both static (CGO off):
# they run inside sandboxes whose templates have no C library.
#
# A plain `CGO_ENABLED=0 go build -o bin/fence ./cmd/fence` also works; that
# binary runs itself inside its sandboxes, which then start slower.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
emb=internal/insandbox/embedded/fence-sandbox
# On linux/amd64 the in-sandbox binary starts at its own entry point, which
# bounds an init's capabilities while it has one thread
# (cmd/fence-sandbox/entry_linux_amd64.s); elsewhere the init does it later.
ldflags=()
if [ "$(go env GOOS)/$(go env GOARCH)" = linux/amd64 ]; then
  ldflags=(-ldflags=-E=_fence_sandbox_rt0)
fi
CGO_ENABLED=0 go build -trimpath ${ldflags[@]+"${ldflags[@]}"} -o "$emb.tmp" ./cmd/fence-sandbox
mv "$emb.tmp" "$emb"
CGO_ENABLED=0 go build -trimpath -tags fence_sandbox_bin -o bin/fence ./cmd/fence
