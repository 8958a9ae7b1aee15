package audit

import (
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	tests := []struct {
		typ, data, level, msg string
	}{
		{TypeFlow, `{"allowed":false,"host":"evil.example","reason":"not allowed"}`, "warn", `egress.flow allowed=false host=evil.example reason="not allowed"`},
		{TypeFlow, `{"allowed":true,"host":"pypi.org"}`, "info", `egress.flow allowed=true host=pypi.org`},
		{TypeGateway, `{"host":"api.example","placeholder_leak":true}`, "warn", `gateway.request host=api.example placeholder_leak=true`},
		{TypeGateway, `{"decision":"refused"}`, "warn", `gateway.request decision=refused`},
		{TypeProcStart, `{"pid":3,"argv":["sh","-c","echo a\nrm -rf /"]}`, "info", `process.start pid=3 argv="[\"sh\",\"-c\",\"echo a\\nrm -rf /\"]"`},
		{TypeAPI, `{"level":"error","z":"\r"}`, "error", `api level=error z="\r"`},
		{TypeDropped, `{"count":3}`, "warn", `audit.dropped count=3`},
	}
	for _, tt := range tests {
		r := &Record{Seq: 9, Type: tt.typ, Data: []byte(tt.data), Actor: "daemon"}
		level, msg, fields := Summary(r)
		if level != tt.level || msg != tt.msg || strings.ContainsAny(msg, "\n\r") {
			t.Errorf("%s %s: got %s %q, want %s %q", tt.typ, tt.data, level, msg, tt.level, tt.msg)
		}
		if fields["type"] != tt.typ || fields["seq"] != "9" || fields["actor"] != "daemon" {
			t.Errorf("fields %v", fields)
		}
	}
}
