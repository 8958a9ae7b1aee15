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
	lines, rerr := daemonLogReason(d.Log, daemonLogLines)
	if rerr != nil {
		return fmt.Errorf("%w\n  (the daemon's log %s: %v)", err, d.Log, rerr)
	}
	return fmt.Errorf("%w\n  the daemon's log, its last %d errors and warnings (or lines), all of it in %s:\n    %s",
		err, len(lines), d.Log, strings.Join(lines, "\n    "))
}

// daemonLogReason returns the last n lines of the log at path at level
// WARN or ERROR (slog's text and JSON forms), or its last n lines when it
// has none, read from its last daemonLogTail bytes.
func daemonLogReason(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(0, st.Size()-daemonLogTail)
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return nil, err
	}
	all := strings.Split(string(bytes.TrimRight(b, "\n")), "\n")
	if off > 0 && len(all) > 1 {
		all = all[1:] // the first is cut
	}
	var bad []string
	for _, l := range all {
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") ||
			strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"level":"WARN"`) {
			bad = append(bad, l)
		}
	}
	if len(bad) == 0 {
		bad = all
	}
	return bad[max(0, len(bad)-n):], nil
}
