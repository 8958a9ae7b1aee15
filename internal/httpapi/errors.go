package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/volume"
)

// Conditions local to the HTTP edge; they map to status codes below with
// the api taxonomy.
var (
	errUnauthenticated  = api.ErrUnauthenticated
	errTooLarge         = errors.New("request body too large")
	errNoRoute          = errors.New("no such route")
	errMethodNotAllowed = errors.New("method not allowed")
	errBadGateway       = errors.New("backend failed")
)

// publicError is an error whose client message is fixed text, whatever
// its cause: for routes that must never echo their input (/secrets). Its
// status is the one of its sentinel alone; the cause is only logged.
type publicError struct {
	msg      string
	sentinel error
	cause    error
}

func (e *publicError) Error() string { return e.msg + ": " + e.cause.Error() }
func (e *publicError) Unwrap() error { return e.sentinel }

// statusOf is THE mapping from errors to HTTP status codes.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errNoRoute), errors.Is(err, api.ErrNotFound), errors.Is(err, isolation.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errMethodNotAllowed):
		return http.StatusMethodNotAllowed
	case errors.Is(err, api.ErrInvalidArgument), errors.Is(err, api.ErrFailedPrecondition), errors.Is(err, isolation.ErrUnsupported):
		return http.StatusBadRequest
	case errors.Is(err, api.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, api.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, api.ErrResourceExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, api.ErrUnimplemented):
		return http.StatusNotImplemented
	case errors.Is(err, api.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, volume.ErrFull):
		return http.StatusInsufficientStorage
	case errors.Is(err, errBadGateway):
		return http.StatusBadGateway
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// sentinels are trimmed from the end of client messages: "x: invalid
// argument" reads "x" to the SDK user, who already gets the status.
var sentinels = []error{
	api.ErrNotFound, api.ErrConflict, api.ErrInvalidArgument, api.ErrFailedPrecondition,
	api.ErrUnavailable, api.ErrPermissionDenied, api.ErrResourceExhausted, api.ErrUnimplemented,
	api.ErrUnauthenticated, errTooLarge, errNoRoute, errMethodNotAllowed,
}

// clientMessage is the message shown to the client: the error chain for
// client errors, a generic text for server faults (logged instead).
func clientMessage(err error, status int) string {
	if pe := (*publicError)(nil); errors.As(err, &pe) {
		return pe.msg
	}
	if status >= 500 && status != http.StatusNotImplemented && status != http.StatusServiceUnavailable && status != http.StatusInsufficientStorage {
		return "internal error"
	}
	msg := err.Error()
	for _, s := range sentinels {
		msg = strings.TrimSuffix(msg, ": "+s.Error())
	}
	return msg
}

// errorf wraps sentinel with a client message.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), sentinel)
}

func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	if pe := (*publicError)(nil); isSecretsPath(r.URL.Path) && !errors.As(err, &pe) {
		err = secretsError(err) // 401, 404, 405 of the edge too
	}
	status := statusOf(err)
	if status >= 500 && status != http.StatusNotImplemented && status != http.StatusInsufficientStorage {
		log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, status, api.Error{Code: status, Message: clientMessage(err, status)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"code":500,"message":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// decodeJSON reads a JSON body into v. An empty body leaves v as is when
// allowEmpty; otherwise it is malformed.
func decodeJSON(r *http.Request, v any, allowEmpty bool) error {
	err := json.NewDecoder(r.Body).Decode(v)
	if err == nil {
		return nil
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return errorf(errTooLarge, "request body is larger than %d bytes", tooLarge.Limit)
	case errors.Is(err, io.EOF) && allowEmpty:
		return nil
	case errors.Is(err, io.EOF):
		return errorf(api.ErrInvalidArgument, "request body is empty, want JSON")
	default:
		return errorf(api.ErrInvalidArgument, "malformed JSON body: %v", err)
	}
}
