package template

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// busyboxPath is where Debian's busybox-static package installs busybox.
var busyboxPath = "/bin/busybox"

const (
	userUID = 1000
	userGID = 1000
)

// minimalFiles are the configuration files of the minimal template.
var minimalFiles = []struct {
	path string
	mode fs.FileMode
	data string
}{
	{"etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n" +
		"user:x:1000:1000:user:/home/user:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
	{"etc/group", 0o644, "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"},
	{"etc/shadow", 0o640, "root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n"},
	{"etc/hostname", 0o644, "fence\n"},
	{"etc/hosts", 0o644, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
	{"etc/nsswitch.conf", 0o644, "passwd: files\ngroup: files\nhosts: files dns\n"},
}

// buildMinimal fills rootfs with the host's static busybox and a handful of
// configuration files.
func buildMinimal(ctx context.Context, s *Store, rootfs string) (string, error) {
	if err := checkStatic(busyboxPath); err != nil {
		return "", err
	}
	fmt.Fprintf(s.progress, "minimal: copying %s\n", busyboxPath)
	for _, d := range []string{"bin", "etc", "usr/bin", "root", "home"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return "", fmt.Errorf("creating /%s: %w", d, err)
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "root"), 0o700); err != nil {
		return "", fmt.Errorf("chmod /root: %w", err)
	}
	if err := copyFile(busyboxPath, filepath.Join(rootfs, "bin", "busybox"), 0o755); err != nil {
		return "", err
	}

	var out bytes.Buffer
	cmd := command(ctx, busyboxPath, "--list")
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("listing busybox applets: %w", err)
	}
	n := 0
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		applet := strings.TrimSpace(sc.Text())
		if applet == "" || applet == "busybox" || strings.ContainsAny(applet, "/\x00") || applet[0] == '.' {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("linking applet %s: %w", applet, err)
		}
		n++
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin", "sh")); err != nil {
		return "", fmt.Errorf("busybox at %s has no sh applet", busyboxPath)
	}
	// Shebangs say #!/usr/bin/env.
	if err := os.Symlink("../../bin/busybox", filepath.Join(rootfs, "usr", "bin", "env")); err != nil {
		return "", fmt.Errorf("linking /usr/bin/env: %w", err)
	}
	fmt.Fprintf(s.progress, "minimal: linked %d applets\n", n)

	for _, f := range minimalFiles {
		if err := writeRegular(rootfs, f.path, f.data, f.mode); err != nil {
			return "", err
		}
	}
	home := filepath.Join(rootfs, "home", "user")
	if err := os.Mkdir(home, 0o755); err != nil {
		return "", fmt.Errorf("creating /home/user: %w", err)
	}
	if err := os.Lchown(home, userUID, userGID); err != nil {
		return "", fmt.Errorf("chowning /home/user: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return "busybox-static from " + busyboxPath, nil
}

// checkStatic verifies that path is a statically linked ELF executable.
func checkStatic(path string) error {
	hint := "install it with `apt-get install busybox-static`"
	f, err := elf.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("busybox not found at %s: %s: %w", path, hint, err)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (package busybox, not busybox-static): %s", path, hint)
		}
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(dst, mode)
	}
	if err != nil {
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return nil
}
