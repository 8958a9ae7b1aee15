#!/usr/bin/env bash
# Regenerates the Go and Connect code from the .proto files.
# Needs protoc (Debian: protobuf-compiler) and, on PATH,
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
set -euo pipefail
cd "$(dirname "$0")"
protoc -I . --go_out=. --go_opt=paths=source_relative \
  --connect-go_out=. --connect-go_opt=paths=source_relative \
  process/process.proto filesystem/filesystem.proto
