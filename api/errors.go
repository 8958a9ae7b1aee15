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
