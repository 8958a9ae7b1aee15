package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// baseSuite is the Debian release of the base template.
const baseSuite = "bookworm"

// basePackages are installed on top of minbase: what users of E2B's base
// image type first. python-is-python3 makes `python` python3; nodejs and
// npm (Debian's, Node 18 with npm 9) take 190 of the template's 390 MB,
// for `node` and `npm install` to work as they do on E2B.
var basePackages = []string{"python3", "python-is-python3", "python3-pip", "python3-venv", "nodejs", "npm",
	"curl", "git", "sudo", "ca-certificates", "procps", "bash"}

// Default mirrors, used when the host's apt sources name none.
const (
	defaultMirror   = "http://deb.debian.org/debian"
	defaultSecurity = "http://deb.debian.org/debian-security"
)

// aptSourcesDir is where the host's apt sources are read from (a variable
// for tests).
var aptSourcesDir = "/etc/apt"

// buildBase runs mmdebstrap into rootfs.
func buildBase(ctx context.Context, s *Store, rootfs string) (string, error) {
	return debootstrap(ctx, s, rootfs, "base", basePackages, "a few minutes", nil)
}

// debootstrap runs mmdebstrap into rootfs: Debian baseSuite minbase with
// packages, without docs, man pages or locales, and user "user" (1000:1000,
// passwordless sudo). hooks are further mmdebstrap customize hooks, run
// after those. Progress lines are prefixed with label.
func debootstrap(ctx context.Context, s *Store, rootfs, label string, packages []string, eta string, hooks []string) (string, error) {
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return "", fmt.Errorf("mmdebstrap not found: install it with `apt-get install mmdebstrap`: %w", err)
	}
	mirror, security := hostMirrors(aptSourcesDir)
	args := []string{
		"--mode=root",
		"--format=directory",
		"--variant=minbase",
		"--include=" + strings.Join(packages, ","),
		`--aptopt=APT::Install-Recommends "false"`,
		`--aptopt=APT::Install-Suggests "false"`,
		// A package that times out once is fetched again, not the
		// whole build redone.
		`--aptopt=Acquire::Retries "5"`,
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/lintian/*",
		`--customize-hook=chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash user`,
		`--customize-hook=echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"`,
		// `pip install x` works as on E2B (into ~/.local for user) instead
		// of stopping at Debian's externally-managed-environment guard.
		`--customize-hook=printf '[global]\nbreak-system-packages = true\n' > "$1/etc/pip.conf"`,
	}
	for _, h := range hooks {
		args = append(args, "--customize-hook="+h)
	}
	args = append(args,
		`--customize-hook=rm -rf "$1"/var/log/*.log "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old`,
		baseSuite,
		rootfs,
		fmt.Sprintf("deb %s %s main", mirror, baseSuite),
		fmt.Sprintf("deb %s %s-updates main", mirror, baseSuite),
		fmt.Sprintf("deb %s %s-security main", security, baseSuite),
	)
	fmt.Fprintf(s.progress, "%s: mmdebstrap %s from %s (%s)\n", label, baseSuite, mirror, eta)
	out := &lineWriter{prefix: label + ": ", w: s.progress}
	cmd := command(ctx, bin, args...)
	// A private mount namespace: the /proc, /sys and /dev mounts mmdebstrap
	// makes inside the tree cannot outlive it, even if it is killed.
	cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	cmd.Stdout = out
	cmd.Stderr = out
	err = cmd.Run()
	out.Flush()
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("running mmdebstrap: %w", ctx.Err())
		}
		return "", fmt.Errorf("running mmdebstrap: %w; last output:\n%s", err, out.Tail())
	}
	return fmt.Sprintf("mmdebstrap --variant=minbase %s from %s with %s", baseSuite, mirror, strings.Join(packages, ",")), nil
}

// hostMirrors returns the Debian archive and security mirrors named in the
// host's apt sources under dir, or Debian's defaults.
func hostMirrors(dir string) (mirror, security string) {
	var files []string
	files = append(files, filepath.Join(dir, "sources.list"))
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(dir, "sources.list.d", pat))
		files = append(files, m...)
	}
	for _, f := range files {
		for _, uri := range sourceURIs(f) {
			u := strings.TrimRight(uri, "/")
			switch {
			case mirror == "" && strings.HasSuffix(u, "/debian"):
				mirror = u
			case security == "" && strings.HasSuffix(u, "/debian-security"):
				security = u
			}
		}
	}
	if mirror == "" {
		mirror = defaultMirror
	}
	if security == "" {
		security = defaultSecurity
	}
	return mirror, security
}

// sourceURIs extracts the http(s) URIs of "deb" entries from a one-line
// style .list file or a deb822 .sources file.
func sourceURIs(path string) []string {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) || err != nil {
		return nil
	}
	defer f.Close()
	var uris []string
	deb822 := strings.HasSuffix(path, ".sources")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var fields []string
		if deb822 {
			k, v, ok := strings.Cut(line, ":")
			if !ok || !strings.EqualFold(strings.TrimSpace(k), "URIs") {
				continue
			}
			fields = strings.Fields(v)
		} else {
			fields = strings.Fields(line)
			if len(fields) < 3 || fields[0] != "deb" {
				continue
			}
			fields = fields[1:]
			if strings.HasPrefix(fields[0], "[") { // [arch=amd64 signed-by=...]
				for len(fields) > 0 && !strings.HasSuffix(fields[0], "]") {
					fields = fields[1:]
				}
				if len(fields) > 0 {
					fields = fields[1:]
				}
			}
			if len(fields) > 0 {
				fields = fields[:1]
			}
		}
		for _, u := range fields {
			if strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") {
				uris = append(uris, u)
			}
		}
	}
	return uris
}
