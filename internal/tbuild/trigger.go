package tbuild

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
)

// Trigger starts a waiting build with spec, its steps run in the
// Runner's sandboxes. The build is building when Trigger returns.
func (r *Runner) Trigger(ctx context.Context, templateID, buildID string, spec Spec) error {
	s := r.Service
	if err := validateSpec(&spec); err != nil {
		return err
	}
	s.mu.Lock()
	b, err := s.buildLocked(templateID, buildID)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if b.Status != StatusWaiting {
		s.mu.Unlock()
		return fmt.Errorf("build is not in waiting state: %w", api.ErrInvalidArgument)
	}
	if r.sandboxes == nil {
		s.mu.Unlock()
		return fmt.Errorf("template builds are not available: %w", api.ErrUnavailable)
	}
	if n := len(s.running); n >= maxConcurrentBuilds {
		s.mu.Unlock()
		return fmt.Errorf("%d template builds are running, at most %d at once: %w", n, maxConcurrentBuilds, api.ErrResourceExhausted)
	}
	release := func() {}
	if a, ok := r.sandboxes.(BuildAdmitter); ok {
		if release, err = a.AdmitBuild(ctx); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	// Other builds of the template in progress are canceled.
	for id, cancel := range s.running {
		if o := s.builds[id]; o != nil && o.TemplateID == b.TemplateID {
			cancel()
		}
	}
	stored := spec
	stored.FromImageRegistry = nil
	b.Spec = &stored
	b.Status, b.UpdatedAt = StatusBuilding, s.now().UTC()
	if spec.FromImageRegistry != nil {
		s.creds[b.ID] = spec.FromImageRegistry
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxBuildTime)
	s.running[b.ID] = cancel
	s.wg.Add(1)
	s.mu.Unlock()
	s.saveBuild(ctx, b)
	go func() {
		defer s.wg.Done()
		defer cancel()
		defer release()
		s.run(bctx, r.sandboxes, b.ID, spec)
		s.mu.Lock()
		delete(s.running, b.ID)
		delete(s.creds, b.ID)
		s.mu.Unlock()
	}()
	return nil
}

const maxBuildTime = 2 * time.Hour

// maxConcurrentBuilds bounds the builds running at once (each holds a
// sandbox while its steps run); more is E2B's 429.
const maxConcurrentBuilds = 4

func validateSpec(sp *Spec) error {
	switch {
	case sp.FromImage != "" && sp.FromTemplate != "":
		return fmt.Errorf("cannot specify both fromImage and fromTemplate: %w", api.ErrInvalidArgument)
	case sp.FromImage == "" && sp.FromTemplate == "":
		return fmt.Errorf("must specify either fromImage or fromTemplate: %w", api.ErrInvalidArgument)
	}
	if len(sp.Steps) > 1000 {
		return fmt.Errorf("%d steps: at most 1000: %w", len(sp.Steps), api.ErrInvalidArgument)
	}
	for i := range sp.Steps {
		st := &sp.Steps[i]
		st.Type = strings.ToUpper(st.Type)
		switch st.Type {
		case "ADD":
			st.Type = "COPY"
		case "ARG":
			st.Type = "ENV"
		}
		bad := func(why string) error {
			return fmt.Errorf("step %d (%s): %s: %w", i+1, st.Type, why, api.ErrInvalidArgument)
		}
		switch st.Type {
		case "RUN":
			if len(st.Args) < 1 || len(st.Args) > 2 || st.Args[0] == "" {
				return bad("want [command] or [command, user]")
			}
		case "COPY":
			if len(st.Args) < 2 || len(st.Args) > 4 || st.Args[1] == "" {
				return bad("want [src, dest, user, mode]")
			}
			if !hashRE.MatchString(st.FilesHash) {
				return bad("filesHash must be 64 hex digits")
			}
			if len(st.Args) == 4 && st.Args[3] != "" && !octalRE.MatchString(st.Args[3]) {
				return bad("mode must be octal")
			}
		case "ENV":
			if len(st.Args)%2 != 0 {
				return bad("want key, value pairs")
			}
			for j := 0; j < len(st.Args); j += 2 {
				if !envKeyRE.MatchString(st.Args[j]) {
					return bad(fmt.Sprintf("invalid variable name %q", st.Args[j]))
				}
			}
		case "WORKDIR":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return bad("want [path]")
			}
		case "USER":
			if len(st.Args) < 1 || len(st.Args) > 2 || !userRE.MatchString(st.Args[0]) {
				return bad("want [user] with a valid user name")
			}
		default:
			return fmt.Errorf("step %d: unknown step type %q (want RUN, COPY, ENV, WORKDIR or USER): %w", i+1, st.Type, api.ErrInvalidArgument)
		}
		for _, a := range st.Args {
			if strings.ContainsRune(a, 0) {
				return bad("an argument holds a NUL byte")
			}
		}
	}
	if rc := sp.FromImageRegistry; rc != nil {
		switch rc.Type {
		case "registry", "aws", "gcp":
		default:
			return fmt.Errorf("fromImageRegistry: unknown type %q (want registry, aws or gcp): %w", rc.Type, api.ErrInvalidArgument)
		}
	}
	return nil
}
