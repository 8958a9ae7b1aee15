#!/usr/bin/env bash
# Copies the pinned browser code into the tree: xterm.js into the assets
# fence embeds (internal/ui/assets/vendor), axe-core into the browser
# test's testdata. Run it after changing package.json; commit what it
# copies, so building fence needs no npm.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
out=../assets/vendor
mkdir -p "$out" ../../../integration/testdata
# The source map is not shipped: drop its reference.
sed "/^\/\/# sourceMappingURL=/d" node_modules/@xterm/xterm/lib/xterm.mjs > "$out/xterm.mjs"
cp node_modules/@xterm/xterm/css/xterm.css "$out/xterm.css"
cp node_modules/@xterm/xterm/LICENSE "$out/xterm.LICENSE"
cp node_modules/axe-core/axe.min.js ../../../integration/testdata/axe.min.js
