package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Levels of Summary, as E2B's sandbox logs name them.
const (
	LevelDebug = "debug"
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"
)

// LevelRank orders levels (debug lowest); -1 for an unknown name.
func LevelRank(level string) int {
	return slices.Index([]string{LevelDebug, LevelInfo, LevelWarn, LevelError}, level)
}

// maxField bounds one flattened field's value in Summary.
const maxField = 1024

// Summary renders a record for people: a level, a one-line message and
// its data flattened to strings (nested keys joined with dots, lists as
// JSON), with its type, seq and actor.
//
// The level is info, except: data {"level": "debug"|"info"|"warn"|"error"}
// sets it; a refusal (data "allowed": false, or "decision" deny, denied,
// refused, blocked) and a leak (a true or non-empty field whose name holds
// "leak") are warn; so are the log's own records of dropped events, torn
// lines and truncation.
func Summary(r *Record) (level, message string, fields map[string]string) {
	var data map[string]any
	if len(r.Data) > 0 {
		d := json.NewDecoder(strings.NewReader(string(r.Data)))
		d.UseNumber()
		d.Decode(&data)
	}
	fields = map[string]string{"type": r.Type, "seq": strconv.FormatUint(r.Seq, 10)}
	if r.Actor != "" {
		fields["actor"] = r.Actor
	}
	if r.Sandbox != "" {
		fields["sandbox"] = r.Sandbox
	}
	flatten(fields, "", data)
	return levelOf(r.Type, data), message1(r.Type, data), fields
}

func flatten(out map[string]string, prefix string, m map[string]any) {
	for k, v := range m {
		key := prefix + k
		switch v := v.(type) {
		case map[string]any:
			flatten(out, key+".", v)
		default:
			if _, taken := out[key]; taken {
				key = "data." + key
			}
			out[key] = trim(str(v), maxField)
		}
	}
}

func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return "null"
	case json.Number:
		return v.String()
	case bool:
		return strconv.FormatBool(v)
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func levelOf(typ string, d map[string]any) string {
	if l, ok := d["level"].(string); ok && LevelRank(l) >= 0 {
		return l
	}
	switch typ {
	case TypeDropped, TypeRecovered, TypeSuppressed:
		return LevelWarn
	case TypeTruncated:
		return LevelError
	}
	if a, ok := d["allowed"].(bool); ok && !a {
		return LevelWarn
	}
	if s, ok := d["decision"].(string); ok {
		switch strings.ToLower(s) {
		case "deny", "denied", "refuse", "refused", "block", "blocked":
			return LevelWarn
		}
	}
	for k, v := range d {
		if strings.Contains(strings.ToLower(k), "leak") {
			switch v := v.(type) {
			case bool:
				if v {
					return LevelWarn
				}
			case nil:
			case string:
				if v != "" {
					return LevelWarn
				}
			default:
				return LevelWarn
			}
		}
	}
	return LevelInfo
}

// message1 is a one-line message: the type, then the data's fields as
// key=value in name order (strings quoted when they hold spaces), with the
// most telling fields of a few types first.
func message1(typ string, d map[string]any) string {
	var lead []string
	switch typ {
	case TypeAPI:
		lead = []string{"method", "route", "path", "status"}
	case TypeProcStart:
		lead = []string{"pid", "argv", "cmd", "cwd", "user"}
	case TypeProcEnd:
		lead = []string{"pid", "exit_code", "exitCode", "signal"}
	case TypeFileWrite:
		lead = []string{"path", "size"}
	case TypeFlow:
		lead = []string{"allowed", "decision", "proto", "host", "dst", "reason"}
	case TypeGateway, TypeDownload:
		lead = []string{"method", "host", "url", "status"}
	case TypeKill:
		lead = []string{"reason"}
	case TypeSuppressed:
		lead = []string{"summary", "total"}
	}
	var b strings.Builder
	b.WriteString(typ)
	keys := make([]string, 0, len(d))
	for k := range d {
		if !slices.Contains(lead, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range append(lead, keys...) {
		v, ok := d[k]
		if !ok {
			continue
		}
		s := trim(str(v), 200)
		if s == "" || strings.IndexFunc(s, func(r rune) bool { return r == ' ' || r == '"' || !unicode.IsPrint(r) }) >= 0 {
			s = strconv.Quote(s)
		}
		fmt.Fprintf(&b, " %s=%s", k, s)
		if b.Len() > 1000 {
			return trim(b.String(), 1000)
		}
	}
	return b.String()
}
