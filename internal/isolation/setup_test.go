package isolation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Setup.Resolve requires a state directory, makes it absolute, and fills
// in the instance, the logger and the executable where they are unset;
// what is set is kept.
func TestSetupResolve(t *testing.T) {
	instanceOf := func(dir string) string { return "i" + filepath.Base(dir) }
	if _, err := (Setup{}).Resolve("test", instanceOf); err == nil || !strings.Contains(err.Error(), "test backend: StateDir is required") {
		t.Errorf("no StateDir: %v", err)
	}
	t.Chdir(t.TempDir())
	wd, _ := os.Getwd()
	s, err := Setup{StateDir: "state"}.Resolve("test", instanceOf)
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	if s.StateDir != filepath.Join(wd, "state") || s.Instance != "istate" || s.Logger == nil || s.Executable != self {
		t.Errorf("defaults: %+v", s)
	}
	s, err = Setup{StateDir: "/x", Instance: "mine", Executable: "/bin/fence"}.Resolve("test", instanceOf)
	if err != nil || s.StateDir != "/x" || s.Instance != "mine" || s.Executable != "/bin/fence" {
		t.Errorf("set: %+v, %v", s, err)
	}
}
