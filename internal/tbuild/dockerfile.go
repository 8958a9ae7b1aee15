package tbuild

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fencesandbox/fence/api"
)

// Dockerfile is what ParseDockerfile makes of a Dockerfile: E2B's builder
// steps, as the SDKs' fromDockerfile makes them.
type Dockerfile struct {
	FromImage string
	Steps     []Step // COPY steps have no FilesHash yet
	StartCmd  string
	ReadyCmd  string
}

// ParseDockerfile parses the Dockerfile subset E2B's builder accepts, the
// way its SDKs do: one stage; RUN, COPY/ADD (--chown, --chmod), WORKDIR,
// USER, ENV/ARG, CMD/ENTRYPOINT (the start command, with E2B's ready
// command "sleep 20"); EXPOSE and VOLUME are ignored. The steps begin
// with USER root and WORKDIR / and end with USER user and WORKDIR
// /home/user when the file set none. Anything else is an error naming
// the instruction and its line, wrapping api.ErrInvalidArgument.
func ParseDockerfile(content string) (*Dockerfile, error) {
	p := &dfParser{df: &Dockerfile{}, steps: []Step{{Type: "USER", Args: []string{"root"}}, {Type: "WORKDIR", Args: []string{"/"}}}}
	for _, ll := range logicalLines(content) {
		if err := p.line(ll); err != nil {
			return nil, err
		}
	}
	if p.froms == 0 {
		return nil, fmt.Errorf("Dockerfile has no FROM: %w", api.ErrInvalidArgument)
	}
	if !p.sawUser {
		p.steps = append(p.steps, Step{Type: "USER", Args: []string{"user"}})
	}
	if !p.sawWorkdir {
		p.steps = append(p.steps, Step{Type: "WORKDIR", Args: []string{"/home/user"}})
	}
	p.df.Steps = p.steps
	return p.df, nil
}

// dfParser is ParseDockerfile's state between lines.
type dfParser struct {
	df                  *Dockerfile
	steps               []Step
	sawUser, sawWorkdir bool
	froms               int
}

// badLine makes the error of a line ParseDockerfile refuses.
type badLine func(format string, args ...any) error

// line parses one logical line.
func (p *dfParser) line(ll logicalLine) error {
	bad := badLine(func(format string, args ...any) error {
		return fmt.Errorf("Dockerfile line %d: %s: %w", ll.n, fmt.Sprintf(format, args...), api.ErrInvalidArgument)
	})
	instr, rest, _ := strings.Cut(strings.TrimSpace(ll.text), " ")
	rest = strings.TrimSpace(rest)
	instr = strings.ToUpper(instr)
	if strings.HasPrefix(rest, "<<") {
		return bad("%s with a heredoc is not supported", instr)
	}
	if p.froms == 0 && instr != "FROM" && instr != "ARG" {
		return bad("%s before FROM", instr)
	}
	switch instr {
	case "FROM":
		return p.from(rest, bad)
	case "RUN":
		if rest == "" {
			return bad("RUN needs a command")
		}
		if strings.HasPrefix(rest, "--") {
			return bad("RUN %s is not supported", strings.Fields(rest)[0])
		}
		p.steps = append(p.steps, Step{Type: "RUN", Args: []string{execForm(rest)}})
	case "COPY", "ADD":
		return p.copy(instr, rest, bad)
	case "WORKDIR":
		if rest == "" {
			return bad("WORKDIR needs a path")
		}
		p.sawWorkdir = true
		p.steps = append(p.steps, Step{Type: "WORKDIR", Args: []string{rest}})
	case "USER":
		return p.user(rest, bad)
	case "ENV", "ARG":
		kv, err := parseEnv(instr, rest)
		if err != nil {
			return bad("%v", err)
		}
		if p.froms > 0 { // an ARG before FROM only parameterises FROM
			p.steps = append(p.steps, Step{Type: "ENV", Args: kv})
		}
	case "CMD", "ENTRYPOINT":
		if rest == "" {
			return bad("%s needs a command", instr)
		}
		p.df.StartCmd, p.df.ReadyCmd = execForm(rest), "sleep 20"
	case "EXPOSE", "VOLUME":
		// Ignored, as E2B's builder does.
	default:
		return bad("unsupported instruction %s (fence builds RUN, COPY, ADD, WORKDIR, USER, ENV, ARG, CMD and ENTRYPOINT; EXPOSE and VOLUME are ignored)", instr)
	}
	return nil
}

// from parses FROM: one stage, an image and an optional AS name.
func (p *dfParser) from(rest string, bad badLine) error {
	p.froms++
	if p.froms > 1 {
		return bad("multi-stage builds (a second FROM) are not supported")
	}
	f := strings.Fields(rest)
	for len(f) > 0 && strings.HasPrefix(f[0], "--") {
		return bad("FROM %s is not supported", f[0])
	}
	if len(f) == 0 {
		return bad("FROM needs an image")
	}
	if len(f) != 1 && !(len(f) == 3 && strings.EqualFold(f[1], "AS")) {
		return bad("FROM takes an image and an optional AS name")
	}
	p.df.FromImage = f[0]
	return nil
}

// copy parses COPY and ADD (--chown, --chmod, the JSON form): one step
// per source.
func (p *dfParser) copy(instr, rest string, bad badLine) error {
	f := strings.Fields(rest)
	user, mode := "", ""
	for len(f) > 0 && strings.HasPrefix(f[0], "--") {
		k, v, _ := strings.Cut(f[0], "=")
		switch k {
		case "--chown":
			user, _, _ = strings.Cut(v, ":")
		case "--chmod":
			if !octalRE.MatchString(v) {
				return bad("%s --chmod=%s: want an octal mode", instr, v)
			}
			mode = fmt.Sprintf("%04s", v)
		default:
			return bad("%s %s is not supported", instr, k)
		}
		f = f[1:]
	}
	if strings.HasPrefix(strings.TrimSpace(strings.Join(f, " ")), "[") {
		var arr []string
		if err := json.Unmarshal([]byte(strings.Join(f, " ")), &arr); err != nil {
			return bad("%s: malformed JSON form", instr)
		}
		f = arr
	}
	if len(f) < 2 {
		return bad("%s needs a source and a destination", instr)
	}
	dest := f[len(f)-1]
	for _, src := range f[:len(f)-1] {
		if strings.Contains(src, "://") {
			return bad("%s from a URL is not supported", instr)
		}
		p.steps = append(p.steps, Step{Type: "COPY", Args: []string{src, dest, user, mode}})
	}
	return nil
}

// user parses USER: a user name (a group after ':' is dropped).
func (p *dfParser) user(rest string, bad badLine) error {
	if rest == "" {
		return bad("USER needs a user")
	}
	u, _, _ := strings.Cut(rest, ":")
	if !userRE.MatchString(u) {
		return bad("USER %q is not a valid user name", u)
	}
	p.sawUser = true
	p.steps = append(p.steps, Step{Type: "USER", Args: []string{u}})
	return nil
}

type logicalLine struct {
	n    int
	text string
}

// logicalLines joins backslash continuations and drops comments and blank
// lines; n is the first physical line.
func logicalLines(content string) []logicalLine {
	var out []logicalLine
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(strings.ReplaceAll(content, "\r\n", "\n"), "\n") {
		line := strings.TrimRight(raw, " \t")
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		out = append(out, logicalLine{n: start, text: cur.String()})
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, logicalLine{n: start, text: cur.String()})
	}
	return out
}

// execForm joins a JSON-array (exec form) command with spaces; a shell
// form is kept as it is.
func execForm(s string) string {
	if strings.HasPrefix(s, "[") {
		var arr []string
		if json.Unmarshal([]byte(s), &arr) == nil {
			return strings.Join(arr, " ")
		}
	}
	return s
}

// parseEnv parses ENV/ARG arguments: "k v", "k=v …", or "ARG k".
func parseEnv(instr, rest string) ([]string, error) {
	if rest == "" {
		return nil, fmt.Errorf("%s needs a name", instr)
	}
	k, v, hasEq := strings.Cut(rest, "=")
	if !hasEq || strings.ContainsAny(k, " \t") {
		name, val, _ := strings.Cut(rest, " ")
		if !envKeyRE.MatchString(name) {
			return nil, fmt.Errorf("%s: invalid name %q", instr, name)
		}
		if val == "" && instr == "ENV" {
			return nil, fmt.Errorf("ENV %s needs a value", name)
		}
		return []string{name, unquote(strings.TrimSpace(val))}, nil
	}
	_ = v
	var kv []string
	for _, w := range splitWords(rest) {
		name, val, ok := strings.Cut(w, "=")
		if !ok && instr == "ARG" {
			val = ""
		} else if !ok {
			return nil, fmt.Errorf("ENV: %q is not NAME=VALUE", w)
		}
		if !envKeyRE.MatchString(name) {
			return nil, fmt.Errorf("%s: invalid name %q", instr, name)
		}
		kv = append(kv, name, unquote(val))
	}
	return kv, nil
}

// splitWords splits at blanks outside quotes.
func splitWords(s string) []string {
	var out []string
	var cur strings.Builder
	var q rune
	for _, r := range s {
		switch {
		case q != 0:
			if r == q {
				q = 0
			}
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			q = r
			cur.WriteRune(r)
		case r == ' ' || r == '\t':
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' && s[len(s)-1] == '"' || s[0] == '\'' && s[len(s)-1] == '\'') {
		return s[1 : len(s)-1]
	}
	return s
}
