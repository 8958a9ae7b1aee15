// Package processconnect is the generated Connect client and handler code of
// E2B envd's process service. Regenerate with api/envd/generate.sh.
package processconnect
