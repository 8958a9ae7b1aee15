//go:build fence_sandbox_bin

package embedded

import _ "embed"

// binary is the in-sandbox binary, built into this directory by
// scripts/build.sh just before the fence binary.
//
//go:embed fence-sandbox
var binary []byte
