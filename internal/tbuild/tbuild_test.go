package tbuild

import (
	"errors"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
)

func TestParseDockerfile(t *testing.T) {
	df, err := ParseDockerfile(`# a comment
ARG VERSION=3
FROM python:3 AS app
ENV A=1 B="two words"
ENV C three
COPY --chown=user:user --chmod=755 a.txt b/ /dest/
RUN apt-get update && \
    apt-get install -y curl
RUN ["echo", "exec form"]
EXPOSE 8000
CMD ["python", "-m", "http.server"]
`)
	if err != nil {
		t.Fatal(err)
	}
	if df.FromImage != "python:3" || df.StartCmd != "python -m http.server" || df.ReadyCmd != "sleep 20" {
		t.Errorf("df = %+v", df)
	}
	var got []string
	for _, s := range df.Steps {
		got = append(got, s.Type+" "+strings.Join(s.Args, "|"))
	}
	want := []string{"USER root", "WORKDIR /", "ENV A|1|B|two words", "ENV C|three",
		"COPY a.txt|/dest/|user|0755", "COPY b/|/dest/|user|0755",
		"RUN apt-get update &&      apt-get install -y curl", "RUN echo exec form", "USER user", "WORKDIR /home/user"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, c := range []struct{ in, want string }{
		{"RUN x", "line 1: RUN before FROM"},
		{"FROM a\nFROM b", "line 2: multi-stage"},
		{"FROM a\n\nHEALTHCHECK CMD true", "line 3: unsupported instruction HEALTHCHECK"},
		{"FROM a\nADD https://x/y /z", "line 2: ADD from a URL"},
		{"FROM a\nCOPY --from=b /x /y", "line 2: COPY --from is not supported"},
		{"ENV A=1", "line 1: ENV before FROM"},
		{"", "no FROM"},
	} {
		_, err := ParseDockerfile(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("ParseDockerfile(%q) = %v, want an error with %q", c.in, err, c.want)
		}
	}
}

func TestBuildAllowAndPipIndex(t *testing.T) {
	if err := CheckAllow([]string{"mirror.internal:8080", "10.1.2.3:3142", "*.corp.example", "@pypi", "198.18.0.0/29:80,443"}); err != nil {
		t.Errorf("CheckAllow(good entries): %v", err)
	}
	for _, bad := range []string{"", "foo bar", "mirror:99999", "10.0.0.0/33", "http://mirror/"} {
		if err := CheckAllow([]string{bad}); err == nil {
			t.Errorf("CheckAllow(%q) = nil, want an error", bad)
		}
	}
	p, err := ParsePipIndex("http://10.1.2.3:8080/simple")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.allow(); got != "10.1.2.3:8080" {
		t.Errorf("allow entry %q", got)
	}
	env := p.env()
	if env["PIP_INDEX_URL"] != "http://10.1.2.3:8080/simple" || env["PIP_TRUSTED_HOST"] != "10.1.2.3:8080" {
		t.Errorf("env %v", env)
	}
	if p, err := ParsePipIndex("https://pypi.corp.example/root/simple/"); err != nil || p.allow() != "pypi.corp.example:443" || p.env()["PIP_TRUSTED_HOST"] != "" {
		t.Errorf("https index: %+v %v", p, err)
	}
	for _, bad := range []string{"ftp://x/simple", "http:///simple", "http://u:p@x/simple", "http://x/simple?a=1", "x/simple", "http://x/sim ple"} {
		if _, err := ParsePipIndex(bad); err == nil {
			t.Errorf("ParsePipIndex(%q) = nil error", bad)
		}
	}
}
