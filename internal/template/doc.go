// Package template builds and stores fence's template root filesystems:
// immutable directory trees shared read-only by every sandbox made from them
// (the native backend mounts a template as the idmapped, read-only lower
// layer of each sandbox's overlay).
//
// # Layout
//
// A Store owns one directory, Options.Dir:
//
//	<Dir>/<name>/rootfs/          the root filesystem, never written after the build
//	<Dir>/<name>/template.json    Info: name, build time, size, source, format version
//	<Dir>/.build-<name>-<random>/ a build in progress (same layout as <name>/)
//	<Dir>/.remove-<name>-<random>/ a template being removed
//	<Dir>/.lock                   flock held by Build and Remove
//	<Dir>/.layers/                the image layer cache (package oci), by default
//
// Template names match [a-z0-9][a-z0-9._-]* (at most 64 bytes), so a name
// never escapes Dir and never collides with the dot-prefixed work entries.
//
// # Guarantees
//
//   - A template appears only complete: a build happens in a .build-* directory
//     that is renamed into place (renameat2 RENAME_NOREPLACE, or
//     RENAME_EXCHANGE when a forced rebuild replaces a template) after its
//     template.json is written. An interrupted or failed build leaves no
//     template; the leftovers of a crashed build (.build-*, .remove-*) are
//     removed by the next Build.
//   - Builds and removals of one Store directory are serialized across
//     processes by an flock on <Dir>/.lock. Resolve and List do not take it.
//   - Building a built-in template that exists with the current format
//     version and the current definition (Info.Definition, a digest of its
//     suite, packages, hooks and files) is a no-op unless BuildOptions.Force
//     is set; a changed definition is rebuilt.
//   - BuildImage makes a template of a container image (registry, OCI
//     layout or docker-save tarball) through package oci: its files are hard
//     links into the shared layer cache, which is safe because a template
//     is never written in place. Info.Image records the reference, the
//     digest and the layers; Info.Env, WorkDir and User the image's
//     defaults. Building or removing a template collects the layers no
//     template uses.
//   - Every path finalize writes is resolved inside the tree: an image's
//     symlinks (/etc -> /elsewhere) never lead a write out of it.
//   - Every built tree has empty directories /proc, /sys, /dev, /tmp (1777),
//     /run and /.fence (where the backend mounts the agent), and a regular
//     /etc/resolv.conf; /dev holds no device nodes.
//   - Child processes (mmdebstrap) run with a context, in their own process
//     group and mount namespace (so no mount they make outlives them), and
//     are sent SIGTERM when the context ends.
//
// # Templates
//
//   - "minimal": the host's static busybox (Debian package busybox-static) in
//     /bin with a symlink per applet, /etc/passwd with root, user (1000:1000,
//     /home/user) and nobody. Builds in well under a second; for tests.
//   - "base": Debian bookworm minbase built by mmdebstrap from the host's apt
//     mirror, with python3 (also as python), pip and venv, nodejs and npm,
//     curl, git, sudo, ca-certificates, procps and bash, /etc/pip.conf
//     allowing pip installs, and user "user" (1000:1000, /bin/bash,
//     passwordless sudo), without docs, man pages or locales (≈390 MB, of
//     which nodejs and npm ≈190 MB).
//   - "code-interpreter" (also resolved as "code-interpreter-v1"): base plus
//     Debian's python3-ipykernel, python3-jupyter-client, python3-numpy,
//     python3-pandas and python3-matplotlib, and the @e2b/code-interpreter
//     server (codeinterp/server.py) in /opt/fence/code-interpreter, which the
//     agent starts from /etc/fence/services.json; its Info.ReadyPorts is
//     [49999] (≈1.2 GB, several minutes). See docs/CODE_INTERPRETER.md.
//   - "desktop": base plus what the @e2b/desktop SDK runs (Xvfb, the XFCE
//     session, xdotool, scrot, xrandr and xdpyinfo, x11vnc, noVNC with
//     websockify at /opt/noVNC, netstat), chromium (without its own
//     sandbox) and xterm. It has no start command: the SDK starts Xvfb at
//     the resolution it is given, then XFCE. See docs/DESKTOP.md.
//
// # Not done here
//
// Remove does not know whether sandboxes still use a template; the caller
// must check. Nothing here verifies a template's contents after the build.
package template
