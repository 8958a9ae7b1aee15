package nsinit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// treesChildEnv makes the test binary the child of TestTreesAheadMatchInPlace:
// "ahead" or "inplace", then the root directory and the /dev/shm size.
const treesChildEnv = "FENCE_NSINIT_TREES_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(treesChildEnv); mode != "" {
		os.Exit(treesChild(mode))
	}
	os.Exit(m.Run())
}

// treesChild builds a sandbox's /proc, /sys and /dev on a tmpfs root in
// its own user, mount, pid and net namespaces, the way mode says, and
// prints the mounts below the root.
func treesChild(mode string) int {
	runtime.LockOSThread()
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Fprintln(os.Stderr, "making mounts private:", err)
		return 1
	}
	args := strings.Fields(mode)
	root := args[1]
	shm, _ := strconv.ParseInt(args[2], 10, 64)
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
		fmt.Fprintln(os.Stderr, "mounting the root:", err)
		return 1
	}
	kit := noTrees
	if args[0] == "ahead" {
		var err error
		if kit, err = buildTrees(); err != nil {
			fmt.Fprintln(os.Stderr, "building ahead:", err)
			return 3
		}
	}
	if err := attachTrees(root, kit, shm); err != nil {
		fmt.Fprintln(os.Stderr, "attaching:", err)
		return 1
	}
	// The boot ID its programs will read, first (runTreesChild takes it).
	id, err := os.ReadFile(root + "/proc/sys/kernel/random/boot_id")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%q\n", id)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	// Sorted: the mount table lists mounts by age, and the trees built
	// ahead are older than the root they are attached to.
	var lines []string
	defer func() {
		slices.Sort(lines)
		fmt.Println(strings.Join(lines, "\n"))
	}()
	// And how many filesystems the masked directories' mounts are.
	masks, maskFS := 0, map[string]bool{}
	defer func() {
		lines = append(lines, fmt.Sprintf("masks: %d directories on %d filesystems", masks, len(maskFS)))
	}()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [tags] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || !strings.HasPrefix(fields[4], root+"/") {
			continue
		}
		sep := len(fields) - 4
		for i, f := range fields {
			if f == "-" {
				sep = i
			}
		}
		lines = append(lines, strings.Join(append([]string{strings.TrimPrefix(fields[4], root), fields[3], fields[5]}, fields[sep+1:]...), " "))
		if slices.Contains(maskedDirs, strings.TrimPrefix(fields[4], root)) {
			masks++
			maskFS[fields[2]] = true
		}
	}
	return 0
}

// runTreesChild runs treesChild and returns its mounts, its exit code
// and the boot ID its /proc gives.
func runTreesChild(t *testing.T, mode string, shm int64) (mounts string, code int, bootID string) {
	t.Helper()
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET,
		UidMappings: ids, GidMappings: ids,
	}
	cmd.Env = append(os.Environ(), treesChildEnv+"="+mode+" "+root+" "+strconv.FormatInt(shm, 10))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running the child: %v", err)
	}
	if code != 0 && code != 3 {
		t.Fatalf("%s child: exit %d: %s", mode, code, stderr.String())
	}
	first, mounts, _ := strings.Cut(string(out), "\n")
	if code == 0 {
		var err error
		if bootID, err = strconv.Unquote(first); err != nil {
			t.Fatalf("%s child: boot ID line %q: %v", mode, first, err)
		}
	}
	return mounts, code, bootID
}

// A sandbox's /proc, /sys and /dev built ahead (detached, then attached)
// are mounted exactly as those made at its create on a kernel that cannot
// build them detached: same mounts, masks, options and devices.
func TestTreesAheadMatchInPlace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (user namespaces with a mapped root)")
	}
	inPlace, _, _ := runTreesChild(t, "inplace", DefaultShmBytes)
	for _, want := range []string{
		"/proc / rw,nosuid,nodev,noexec,relatime proc proc",
		"/proc/sys /sys ro,nosuid,nodev,noexec,relatime proc proc",
		"/proc/timer_list /null ro,nosuid,nodev,relatime devtmpfs",
		"/proc/acpi / ro,nosuid,nodev,noexec,relatime tmpfs tmpfs",
		"/sys / ro,nosuid,nodev,noexec,relatime sysfs sysfs ro",
		"/sys/firmware / ro,nosuid,nodev,noexec,relatime tmpfs tmpfs",
		"/dev / rw,nosuid,noexec,relatime tmpfs tmpfs",
		"/dev/null /null rw,nosuid,relatime devtmpfs",
		"/dev/pts / rw,nosuid,noexec,relatime devpts devpts",
		"/dev/shm / rw,nosuid,nodev,relatime tmpfs tmpfs rw,size=65536k,nr_inodes=16384",
		"/.fence/fence ",
		"/proc/sys/kernel/random/boot_id /" + bootIDFile + "//deleted ro,nosuid,nodev,noexec,relatime tmpfs tmpfs",
	} {
		if !strings.Contains(inPlace, want) {
			t.Errorf("made in place: no mount like %q in\n%s", want, inPlace)
		}
	}
	ahead, code, _ := runTreesChild(t, "ahead", DefaultShmBytes)
	if code == 3 {
		var u unix.Utsname
		_ = unix.Uname(&u)
		release := unix.ByteSliceToString(u.Release[:])
		var major, minor int
		fmt.Sscanf(release, "%d.%d", &major, &minor)
		if major > 6 || major == 6 && minor >= 15 {
			t.Fatalf("Linux %s cannot build the trees detached", release)
		}
		t.Logf("Linux %s: trees are made at the create (no mounts onto detached trees before 6.15)", release)
		return
	}
	// The masked directories share one empty filesystem.
	var masks, maskFS int
	for _, l := range strings.Split(inPlace, "\n") {
		if _, err := fmt.Sscanf(l, "masks: %d directories on %d filesystems", &masks, &maskFS); err == nil {
			break
		}
	}
	if masks == 0 {
		t.Logf("no masked directory exists on this host:\n%s", inPlace)
	} else if maskFS != 1 {
		t.Errorf("%d masked directories on %d filesystems, want one filesystem for all", masks, maskFS)
	}
	if ahead != inPlace {
		t.Errorf("built ahead:\n%s\nmade in place:\n%s", ahead, inPlace)
	}
	// A /dev/shm of another size: the /dev built ahead is dropped for one
	// made at the create.
	other, _, _ := runTreesChild(t, "ahead", 1<<20)
	if !strings.Contains(other, "/dev/shm / rw,nosuid,nodev,relatime tmpfs tmpfs rw,size=1024k") {
		t.Errorf("with a 1 MiB /dev/shm:\n%s", other)
	}
}

// The Config the init decodes ahead sets every field, so that no part of
// the decoder is left to build when the real one arrives.
func TestWarmConfigSetsEveryField(t *testing.T) {
	var c Config
	if err := json.Unmarshal([]byte(warmConfig), &c); err != nil {
		t.Fatal(err)
	}
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		if v.Kind() == reflect.Struct {
			for i := range v.NumField() {
				walk(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
			return
		}
		if v.IsZero() {
			t.Errorf("warmConfig leaves %s unset", path)
		}
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct {
			walk(v.Index(0), path+"[0]")
		}
	}
	walk(reflect.ValueOf(c), "Config")
}

// Every sandbox's /proc gives a boot ID of its own, built ahead or made at
// the create: a random UUID written as the kernel writes one, never the
// host's, and another at each boot.
func TestBootIDPerBoot(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (user namespaces with a mapped root)")
	}
	host, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$`)
	seen := map[string]string{string(host): "the host"}
	for _, mode := range []string{"inplace", "inplace", "ahead", "ahead"} {
		_, code, id := runTreesChild(t, mode, DefaultShmBytes)
		if code == 3 {
			continue // no trees ahead on this kernel (TestTreesAheadMatchInPlace says whether that is right)
		}
		if !uuid4.MatchString(id) {
			t.Errorf("%s: boot_id = %q, want a version-4 UUID and a newline", mode, id)
		}
		if prev, ok := seen[id]; ok {
			t.Errorf("%s: boot_id %q is also %s's", mode, id, prev)
		}
		seen[id] = mode + " boot"
	}
}
