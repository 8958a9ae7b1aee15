package api

import "errors"

// The error taxonomy. Packages wrap these with %w; internal/httpapi maps them
// to HTTP status codes in one place.
var (
	ErrNotFound           = errors.New("not found")
	ErrConflict           = errors.New("conflict")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrUnavailable        = errors.New("unavailable")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnimplemented      = errors.New("not implemented")
	ErrUnauthenticated    = errors.New("unauthenticated")
)

// RPC status codes of the agent's Connect protocol (Connect's and gRPC's
// numbering) that stand for a sentinel of the taxonomy.
var rpcSentinels = map[uint32]error{
	5:  ErrNotFound,           // not_found
	6:  ErrConflict,           // already_exists
	10: ErrConflict,           // aborted
	3:  ErrInvalidArgument,    // invalid_argument
	11: ErrInvalidArgument,    // out_of_range
	9:  ErrFailedPrecondition, // failed_precondition
	14: ErrUnavailable,        // unavailable
	7:  ErrPermissionDenied,   // permission_denied
	16: ErrPermissionDenied,   // unauthenticated
	8:  ErrResourceExhausted,  // resource_exhausted
	12: ErrUnimplemented,      // unimplemented
}

// RPCError returns err, a failed call of the agent's Connect protocol
// that ended with status code code, with the taxonomy's sentinel for the
// code added: errors.Is finds the sentinel and errors.As still finds the
// protocol's own error. Its message is err's. A nil err stays nil.
func RPCError(code uint32, err error) error {
	if err == nil {
		return nil
	}
	s := rpcSentinels[code]
	if errors.Is(err, s) {
		s = nil
	}
	return &rpcError{err: err, sentinel: s}
}

// rpcError is a failed RPC and the sentinel for its code.
type rpcError struct {
	err      error
	sentinel error
}

func (e *rpcError) Error() string { return e.err.Error() }

func (e *rpcError) Unwrap() []error {
	if e.sentinel == nil {
		return []error{e.err}
	}
	return []error{e.err, e.sentinel}
}
