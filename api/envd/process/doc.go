// Package process is the generated Go code of E2B envd's process service
// (process.proto beside this file), the wire contract between the e2b SDKs
// and fence's in-sandbox agent. Regenerate with api/envd/generate.sh.
package process
