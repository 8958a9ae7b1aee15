// Package filesystemconnect is the generated Connect client and handler code of
// E2B envd's filesystem service. Regenerate with api/envd/generate.sh.
package filesystemconnect
