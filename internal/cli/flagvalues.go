package cli

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
)

// The flag values below parse a flag straight into the field of a
// configuration (daemon.Config, router.Config) that the flag sets, so a
// command's configuration is complete when its flags are parsed. Each
// reads as the plain flag it replaces in --help (same type name, same
// default), and a bad value is a usage error naming the flag.

// sizeValue is a size flag ("2GiB", "500M", a number of bytes) into an
// int64. accept says whether a size is allowed and what it sets (0 may
// mean -1, "no cap"); a size it refuses, or no size, is an error saying
// want. An empty value leaves the field as it is.
type sizeValue struct {
	p      *int64
	text   string
	want   string
	accept func(n int64) (int64, bool)
}

func newSizeValue(p *int64, def, want string, accept func(int64) (int64, bool)) *sizeValue {
	v := &sizeValue{p: p, want: want, accept: accept}
	if err := v.Set(def); err != nil {
		panic(err)
	}
	return v
}

func (v *sizeValue) String() string { return v.text }
func (v *sizeValue) Type() string   { return "string" }

func (v *sizeValue) Set(s string) error {
	if s == "" {
		v.text = s
		return nil
	}
	n, err := parseBytes(s)
	ok := err == nil
	if ok {
		n, ok = v.accept(n)
	}
	if !ok {
		return errors.New(v.want)
	}
	*v.p, v.text = n, s
	return nil
}

// mbpsValue is a bandwidth in Mbit/s (an integer, not negative) into
// bytes per second.
type mbpsValue struct {
	p    *int64
	mbps int64
}

func (v *mbpsValue) String() string { return strconv.FormatInt(v.mbps, 10) }
func (v *mbpsValue) Type() string   { return "int" }

func (v *mbpsValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return errors.New("not an integer")
	}
	if n < 0 {
		return errors.New("must not be negative")
	}
	v.mbps, *v.p = n, n*1_000_000/8
	return nil
}

// listValue is a repeatable flag whose every value parse turns into one
// element of a slice field.
type listValue[T any] struct {
	p     *[]T
	texts []string
	parse func(s string, sofar []T) (T, error)
}

func (v *listValue[T]) String() string {
	if len(v.texts) == 0 {
		return ""
	}
	return "[" + strings.Join(v.texts, ",") + "]"
}

func (v *listValue[T]) Type() string { return "stringArray" }

func (v *listValue[T]) Set(s string) error {
	e, err := v.parse(s, *v.p)
	if err != nil {
		return err
	}
	*v.p = append(*v.p, e)
	v.texts = append(v.texts, s)
	return nil
}

// notValue is a bool flag that sets its field to the opposite: --audit
// sets NoAudit.
type notValue struct{ p *bool }

func (v notValue) String() string   { return strconv.FormatBool(!*v.p) }
func (v notValue) Type() string     { return "bool" }
func (v notValue) IsBoolFlag() bool { return true }

func (v notValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*v.p = !b
	return nil
}

// boolVarNot defines a bool flag that sets *p to the opposite of its
// value; it defaults to true (*p false).
func boolVarNot(fs *pflag.FlagSet, p *bool, name, usage string) {
	*p = false
	fs.Var(notValue{p}, name, usage)
	fs.Lookup(name).NoOptDefVal = "true"
}

// parseDenyCIDR parses one --deny-cidr value: a CIDR ("10.20.0.0/16",
// "fd00:1::/48") or a single address.
func parseDenyCIDR(v string, _ []netip.Prefix) (netip.Prefix, error) {
	s := strings.TrimSpace(v)
	pf, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, errors.New("not a CIDR (like 10.20.0.0/16 or fd00:1::/48) or an IP address")
		}
		pf = netip.PrefixFrom(a, a.BitLen())
	}
	if pf.Addr().Zone() != "" {
		return netip.Prefix{}, errors.New("a zone is not allowed")
	}
	return pf.Masked(), nil
}

// parseWarmTemplate parses one --warm-template NAME=N value; a NAME given
// before is an error.
func parseWarmTemplate(v string, sofar []fencedaemon.WarmTemplate) (fencedaemon.WarmTemplate, error) {
	name, n, ok := strings.Cut(v, "=")
	size, err := strconv.Atoi(n)
	if !ok || name == "" || err != nil || size < 1 || size > 64 {
		return fencedaemon.WarmTemplate{}, errors.New("want NAME=N with N between 1 and 64")
	}
	for _, w := range sofar {
		if w.Name == name {
			return fencedaemon.WarmTemplate{}, fmt.Errorf("%s given twice", name)
		}
	}
	return fencedaemon.WarmTemplate{Name: name, Size: size}, nil
}
