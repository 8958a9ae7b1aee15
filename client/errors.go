package client

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api"
)

// Error is a failed control-plane or /files request: the HTTP status and the
// E2B error body {"code","message"}. It unwraps to the api sentinel for its
// status (404 → api.ErrNotFound, 409 → api.ErrConflict, …).
type Error struct {
	Status  int    // HTTP status of the response
	Code    int    // "code" of the JSON body; Status when the body had none
	Message string // "message" of the JSON body, or the body's text
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("%d: %s", e.Status, e.Message)
}

// Unwrap returns the api sentinel for the status, or nil.
func (e *Error) Unwrap() error { return statusSentinel(e.Status) }

// statusSentinel maps an HTTP status to the api error taxonomy.
func statusSentinel(status int) error {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return api.ErrInvalidArgument
	case http.StatusUnauthorized, http.StatusForbidden:
		return api.ErrPermissionDenied
	case http.StatusNotFound:
		return api.ErrNotFound
	case http.StatusConflict:
		return api.ErrConflict
	case http.StatusPreconditionFailed:
		return api.ErrFailedPrecondition
	case http.StatusTooManyRequests, http.StatusInsufficientStorage:
		return api.ErrResourceExhausted
	case http.StatusNotImplemented:
		return api.ErrUnimplemented
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return api.ErrUnavailable
	}
	return nil
}

// maxErrorBody bounds how much of an error body is read.
const maxErrorBody = 64 << 10

// decodeError builds an *Error from a failed response. The body may be E2B's
// {"code","message"}, fence's proxy error {"sandboxId","message","code"}, or
// plain text.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &Error{Status: resp.StatusCode, Code: resp.StatusCode}
	var body struct {
		Code    *int   `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &body) == nil && (body.Code != nil || body.Message != "") {
		if body.Code != nil {
			e.Code = *body.Code
		}
		e.Message = body.Message
	} else {
		e.Message = strings.TrimSpace(string(b))
	}
	return e
}

// wrapRPC classifies err from a Connect call. op names the step.
func wrapRPC(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, classify(err))
}

// classify adds the api sentinel for err's Connect code.
func classify(err error) error {
	return api.RPCError(uint32(connect.CodeOf(err)), err)
}
