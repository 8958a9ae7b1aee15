package tbuild

import (
	"fmt"
	"slices"

	"github.com/fencesandbox/fence/api"
)

// Info is the answer to Status (E2B's TemplateBuildInfo).
type Info struct {
	TemplateID string     `json:"templateID"`
	BuildID    string     `json:"buildID"`
	Status     Status     `json:"status"`
	LogEntries []LogEntry `json:"logEntries"`
	Logs       []string   `json:"logs"`
	Reason     *Reason    `json:"reason,omitempty"`
}

var levels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// Status returns a build's state and its log entries [offset,
// offset+limit) of at least level.
func (s *Service) Status(templateID, buildID string, offset, limit int, level string) (*Info, error) {
	if limit <= 0 || limit > 100 {
		limit = 100
	}
	if offset < 0 {
		return nil, fmt.Errorf("negative logsOffset: %w", api.ErrInvalidArgument)
	}
	min, ok := levels[level]
	if level != "" && !ok {
		return nil, fmt.Errorf("invalid level %q (want debug, info, warn or error): %w", level, api.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.buildLocked(templateID, buildID)
	if err != nil {
		return nil, err
	}
	info := &Info{TemplateID: b.TemplateID, BuildID: b.ID, Status: b.Status, LogEntries: []LogEntry{}, Logs: []string{}}
	var logs []LogEntry
	for _, e := range b.Logs {
		if levels[e.Level] >= min {
			logs = append(logs, e)
		}
	}
	if offset < len(logs) {
		info.LogEntries = slices.Clone(logs[offset:min2(len(logs), offset+limit)])
	}
	if b.Reason != nil {
		r := *b.Reason
		r.LogEntries = nil
		for _, e := range info.LogEntries {
			if e.Step == r.Step && levels[e.Level] >= levels["warn"] {
				r.LogEntries = append(r.LogEntries, e)
			}
		}
		info.Reason = &r
	}
	return info, nil
}

func min2(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// Logs returns log entries of a build from cursor (unix ms) on, forward
// or backward.
func (s *Service) Logs(templateID, buildID string, cursor int64, backward bool, limit int, level string) ([]LogEntry, error) {
	if limit <= 0 || limit > 100 {
		limit = 100
	}
	min, ok := levels[level]
	if level != "" && !ok {
		return nil, fmt.Errorf("invalid level %q: %w", level, api.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.buildLocked(templateID, buildID)
	if err != nil {
		return nil, err
	}
	out := []LogEntry{}
	logs := b.Logs
	if backward {
		logs = slices.Clone(logs)
		slices.Reverse(logs)
	}
	for _, e := range logs {
		ms := e.Timestamp.UnixMilli()
		if levels[e.Level] < min || (cursor > 0 && (!backward && ms < cursor || backward && ms > cursor)) {
			continue
		}
		out = append(out, e)
		if len(out) == limit {
			break
		}
	}
	return out, nil
}

// Changed returns a channel closed at the next line written to any
// build's log, for the streams of build logs. A build's end is always
// logged, so a build that ends closes it too.
func (s *Service) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// logf appends an entry to a build's log (at most maxLogEntries kept).
func (s *Service) logf(buildID, level, step, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.builds[buildID]
	if b == nil {
		return
	}
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxLogLine {
		msg = msg[:maxLogLine] + "…"
	}
	if len(b.Logs) == maxLogEntries {
		msg, level = "log truncated: more than "+fmt.Sprint(maxLogEntries)+" lines", "warn"
	} else if len(b.Logs) > maxLogEntries {
		return
	}
	b.Logs = append(b.Logs, LogEntry{Timestamp: s.now().UTC(), Level: level, Message: msg, Step: step})
}

const (
	maxLogEntries = 5000
	maxLogLine    = 2048
)
