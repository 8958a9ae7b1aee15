//go:build tools

// Package kubebuild pins the Kubernetes commands fence's scale-out tests run.
package kubebuild

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
