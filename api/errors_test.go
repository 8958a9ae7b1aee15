package api_test

import (
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api"
)

// TestRPCError: each Connect code the taxonomy has a sentinel for gets it,
// the others none, and the Connect error stays reachable.
func TestRPCError(t *testing.T) {
	want := map[connect.Code]error{
		connect.CodeNotFound:           api.ErrNotFound,
		connect.CodeAlreadyExists:      api.ErrConflict,
		connect.CodeAborted:            api.ErrConflict,
		connect.CodeInvalidArgument:    api.ErrInvalidArgument,
		connect.CodeOutOfRange:         api.ErrInvalidArgument,
		connect.CodeFailedPrecondition: api.ErrFailedPrecondition,
		connect.CodeUnavailable:        api.ErrUnavailable,
		connect.CodePermissionDenied:   api.ErrPermissionDenied,
		connect.CodeUnauthenticated:    api.ErrPermissionDenied,
		connect.CodeResourceExhausted:  api.ErrResourceExhausted,
		connect.CodeUnimplemented:      api.ErrUnimplemented,
	}
	sentinels := []error{api.ErrNotFound, api.ErrConflict, api.ErrInvalidArgument, api.ErrFailedPrecondition,
		api.ErrUnavailable, api.ErrPermissionDenied, api.ErrResourceExhausted, api.ErrUnimplemented, api.ErrUnauthenticated}
	for code := connect.CodeCanceled; code <= connect.CodeUnauthenticated; code++ {
		ce := connect.NewError(code, errors.New("boom"))
		err := api.RPCError(uint32(code), ce)
		if err.Error() != ce.Error() {
			t.Errorf("%v: message %q, want %q", code, err, ce)
		}
		var got *connect.Error
		if !errors.As(err, &got) || got != ce {
			t.Errorf("%v: the Connect error is lost", code)
		}
		for _, s := range sentinels {
			if errors.Is(err, s) != (want[code] == s) {
				t.Errorf("%v: errors.Is(%v) = %v", code, s, errors.Is(err, s))
			}
		}
	}
	if api.RPCError(uint32(connect.CodeNotFound), nil) != nil {
		t.Error("RPCError(nil) is not nil")
	}
}
