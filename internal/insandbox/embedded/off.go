//go:build !fence_sandbox_bin

package embedded

// binary is empty: this fence binary was built without the in-sandbox
// binary (plain `go build`) and runs itself in its sandboxes.
var binary []byte
