package httpapi

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/fencesandbox/fence/api"
)

func TestMcpSecrets(t *testing.T) {
	own := map[string]api.SecretBinding{"OWN": {Secret: "own", Hosts: []string{"own.example"}}}
	got, err := mcpSecrets(json.RawMessage(`{"a":{"runCmd":"x","secrets":{"TOKEN":{"secret":"tok","hosts":["api.example"]}}},"cat":"airtable","b":{"runCmd":"y"}}`), own, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]api.SecretBinding{"OWN": own["OWN"], "TOKEN": {Secret: "tok", Hosts: []string{"api.example"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("mcpSecrets = %v, want %v", got, want)
	}
	if len(own) != 1 {
		t.Fatal("mcpSecrets changed the request's own bindings")
	}
	if got, err := mcpSecrets(nil, own, nil); err != nil || !reflect.DeepEqual(got, own) {
		t.Fatalf("no mcp: %v, %v", got, err)
	}
	for _, bad := range []struct {
		raw string
		env map[string]string
	}{
		{`[1]`, nil},
		{`{"a":{"secrets":{"OWN":{"secret":"s","hosts":["h"]}}}}`, nil},
		{`{"a":{"secrets":{"T":{"secret":"s","hosts":["h"]}}},"b":{"secrets":{"T":{"secret":"s","hosts":["h"]}}}}`, nil},
		{`{"a":{"secrets":{"E":{"secret":"s","hosts":["h"]}}}}`, map[string]string{"E": "1"}},
	} {
		if _, err := mcpSecrets(json.RawMessage(bad.raw), own, bad.env); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("mcpSecrets(%s) = %v, want ErrInvalidArgument", bad.raw, err)
		}
	}
}
