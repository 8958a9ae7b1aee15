package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

type actorKey struct{}

// WithActor returns ctx carrying who acts (Event.Actor) for the events
// recorded on its behalf further down.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorFrom returns the actor ctx carries, or "daemon".
func ActorFrom(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return "daemon"
}

// KeyActor names the holder of an API key without the key: "key:" and
// the first 12 hex digits of its SHA-256.
func KeyActor(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key:" + hex.EncodeToString(sum[:6])
}
