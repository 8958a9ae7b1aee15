package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// The teams' metrics (E2B's GET /teams/{teamID}/metrics and
// /metrics/max) and the usage report of one team (GET /usage?team=).

// registerTeamMetrics adds the team metrics routes to mux.
func (h *handler) registerTeamMetrics(mux *http.ServeMux) {
	mux.HandleFunc("GET /teams/{teamID}/metrics", h.teamMetrics)
	mux.HandleFunc("GET /teams/{teamID}/metrics/max", h.teamMetricsMax)
}

// metricsRangeLimit is the latest start or end E2B takes.
var metricsRangeLimit = time.Date(2299, 12, 31, 23, 59, 59, 0, time.UTC)

// metricsTeam returns the team of a team metrics route: the caller's own
// (403 with E2B's message for any other ID, known or not), or any
// existing team for the admin.
func (h *handler) metricsTeam(r *http.Request) (string, error) {
	if h.quotas == nil {
		return "", errorf(api.ErrUnimplemented, "team metrics are not served")
	}
	p, ok := principalOf(r)
	id := r.PathValue("teamID")
	if ok && p.Admin {
		return h.limitsTeam(r)
	}
	if !ok || id != p.Team {
		auth := ""
		if ok {
			auth = p.Team
		}
		return "", errorf(api.ErrPermissionDenied, "You (%s) are not authorized to access this team's (%s) metrics", auth, id)
	}
	return id, nil
}

// metricsRange reads E2B's start and end (unix seconds, both optional:
// the last 7 days up to now).
func (h *handler) metricsRange(r *http.Request) (start, end time.Time, err error) {
	end = h.now()
	start = end.Add(-7 * 24 * time.Hour)
	for _, f := range []struct {
		name string
		t    *time.Time
	}{{"start", &start}, {"end", &end}} {
		v := r.URL.Query().Get(f.name)
		if v == "" {
			continue
		}
		n, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || n < 0 {
			return start, end, errorf(api.ErrInvalidArgument, "%s must be a unix time in seconds, got %q", f.name, v)
		}
		if t := time.Unix(n, 0); t.After(metricsRangeLimit) {
			return start, end, errorf(api.ErrInvalidArgument, "%s time cannot be after %s", f.name, metricsRangeLimit.Format(time.RFC3339))
		} else {
			*f.t = t
		}
	}
	if start.After(end) {
		return start, end, errorf(api.ErrInvalidArgument, "start time cannot be after end time")
	}
	return start, end, nil
}

// teamMetrics answers GET /teams/{teamID}/metrics?start=&end=: E2B's
// TeamMetric[] (concurrent sandboxes and start rate, one per step).
func (h *handler) teamMetrics(w http.ResponseWriter, r *http.Request) {
	team, err := h.metricsTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	start, end, err := h.metricsRange(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, h.quotas.TeamMetrics(team, start, end))
}

// maxTeamMetric is E2B's MaxTeamMetric.
type maxTeamMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	Value         float64   `json:"value"`
}

// teamMetricsMax answers GET /teams/{teamID}/metrics/max?metric=&start=&end=:
// the highest step of metric concurrent_sandboxes or sandbox_start_rate
// (0 with no data).
func (h *handler) teamMetricsMax(w http.ResponseWriter, r *http.Request) {
	team, err := h.metricsTeam(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	metric := r.URL.Query().Get("metric")
	var value func(tenancy.TeamMetric) float64
	switch metric {
	case "concurrent_sandboxes":
		value = func(m tenancy.TeamMetric) float64 { return float64(m.ConcurrentSandboxes) }
	case "sandbox_start_rate":
		value = func(m tenancy.TeamMetric) float64 { return m.SandboxStartRate }
	default:
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "metric must be concurrent_sandboxes or sandbox_start_rate, got %q", metric))
		return
	}
	start, end, err := h.metricsRange(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := maxTeamMetric{Timestamp: end.UTC(), TimestampUnix: end.Unix()}
	for _, m := range h.quotas.TeamMetrics(team, start, end) {
		if v := value(m); v > out.Value {
			out = maxTeamMetric{Timestamp: m.Timestamp, TimestampUnix: m.TimestampUnix, Value: v}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// usageTeam returns the context a usage report of GET /usage?team= is
// made for: ctx itself without team; for the admin, ctx acting for team
// (its rows alone); for a team's own ID, ctx. Another team is an unknown
// one to a non-admin: 404 Team not found.
func (h *handler) usageTeam(r *http.Request) (context.Context, error) {
	team := r.URL.Query().Get("team")
	if team == "" {
		return r.Context(), nil
	}
	p, ok := principalOf(r)
	if !ok {
		return nil, errTeamNotFound
	}
	if !p.Admin {
		if team != p.Team {
			return nil, errTeamNotFound
		}
		return r.Context(), nil
	}
	exists := team == tenancy.DefaultTeamID
	if !exists && h.teams != nil {
		var err error
		if exists, err = h.teams.TeamExists(r.Context(), team); err != nil {
			return nil, err
		}
	}
	if !exists {
		return nil, errTeamNotFound
	}
	// Acting for team as a non-admin: its rows alone (the default
	// team's too, not the operator's whole report).
	return tenancy.NewContext(r.Context(), tenancy.Principal{Team: team, KeyID: p.KeyID}), nil
}
