package bench

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
)

// daemonLogLines is how many of the daemon's log lines a failure carries.
const daemonLogLines = 20

// daemonLogTail bounds how much of the end of the daemon's log is read for
// them.
const daemonLogTail = 1 << 20

// explain adds to err, a measure's failure against the daemon d, the
// daemon's reason: its last errors and warnings (its last lines when it
// logged none), and where its whole log is. The client's error already
// holds the response's status and body, which for a server fault is a
// generic text; the daemon logged the cause. err is returned as is when
// nil or when d keeps no log.
func (d *Daemon) explain(err error) error {
	if err == nil || d == nil || d.Log == "" {
		return err
	}
	lines, bad, rerr := daemonLogReason(d.Log, daemonLogLines)
	if rerr != nil {
		return fmt.Errorf("%w\n  (the daemon's log %s: %v)", err, d.Log, rerr)
	}
	what := "errors and warnings"
	if !bad {
		what = "lines (no error or warning)"
	}
	return fmt.Errorf("%w\n  the daemon's last %d %s; its whole log is %s:\n    %s",
		err, len(lines), what, d.Log, strings.Join(lines, "\n    "))
}

// daemonLogReason returns the last n lines of the log at path at level
// WARN or ERROR (slog's text and JSON forms) with bad true, or its last n
// lines when it has none, read from its last daemonLogTail bytes.
func daemonLogReason(path string, n int) (lines []string, bad bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	off := max(0, st.Size()-daemonLogTail)
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return nil, false, err
	}
	all := strings.Split(string(bytes.TrimRight(b, "\n")), "\n")
	if off > 0 && len(all) > 1 {
		all = all[1:] // the first is cut
	}
	for _, l := range all {
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") ||
			strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"level":"WARN"`) {
			lines = append(lines, l)
		}
	}
	if bad = len(lines) > 0; !bad {
		lines = all
	}
	return lines[max(0, len(lines)-n):], bad, nil
}
