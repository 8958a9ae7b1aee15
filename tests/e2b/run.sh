#!/usr/bin/env bash
# run.sh: run the official e2b JavaScript SDK (pinned in package.json)
# against a fresh fence daemon, with Node's built-in test runner.
#
# Builds bin/fence if missing, starts `fence serve` on a free port with a
# throwaway data dir under /var/tmp, points E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL
# at it, runs `node --test test/`, stops the daemon and exits with the test
# status. Needs root (the native backend) and the `base` and `minimal`
# templates in $FENCE_TEMPLATES_DIR (default /var/lib/fence/templates), and
# code-interpreter for test/code-interpreter.test.mjs, mcp-gateway for
# test/mcp-gateway.test.mjs.
# FENCE_E2B_BACKEND=gvisor (or a first argument `--backend gvisor`) runs
# the daemon with `--backend gvisor`, so every sandbox the tests make is a
# gVisor one (runsc from scripts/build-runsc.sh); the default is native.
# The tests read the backend as FENCE_E2B_BACKEND.
# FENCE_E2B_TEAM_KEY=1 runs the tests with the API key of a team made for
# the run (fence team create, fence key create) instead of the daemon's own
# key, the admin of the default team.
# Extra arguments go to `node --test` (e.g. a single test file);
# `run.sh --bench` runs bench.mjs against the daemon instead of the tests,
# `run.sh --bench-ci` bench-code-interpreter.mjs, `run.sh --bench-desktop`
# bench-desktop.mjs. FENCE_E2B_SERVE_EXTRA adds arguments to `fence serve`
# (e.g. '--warm-template desktop=2').
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
templates="${FENCE_TEMPLATES_DIR:-/var/lib/fence/templates}"
backend="${FENCE_E2B_BACKEND:-native}"
if [[ "${1:-}" == --backend ]]; then
	backend="${2:?run.sh: --backend needs native or gvisor}"
	shift 2
fi
case "$backend" in
native | gvisor) ;;
*)
	echo "run.sh: unknown backend $backend: native or gvisor" >&2
	exit 2
	;;
esac
export FENCE_E2B_BACKEND="$backend"

if [[ ! -x "$repo/bin/fence" || -n "${FENCE_REBUILD:-}" ]]; then
	"$repo/scripts/build.sh"
fi
need=(base minimal)
# code-interpreter and desktop only for the runs that use them (all tests,
# their file, their bench).
if [[ $# -eq 0 || "$*" == *code-interpreter* || "${1:-}" == --bench-ci ]]; then
	need+=(code-interpreter)
fi
# mcp-gateway (from base, seconds to build) for the MCP gateway's tests.
if [[ $# -eq 0 || "$*" == *mcp-gateway* ]]; then
	need+=(mcp-gateway)
fi
if [[ $# -eq 0 || "$*" == *desktop* ]]; then
	need+=(desktop)
fi
for t in "${need[@]}"; do
	if [[ ! -d "$templates/$t" ]]; then
		echo "run.sh: template $t missing in $templates: run 'bin/fence template build $t'" >&2
		exit 2
	fi
done

# The data dir's ancestors must be o+x: sandboxes run as unprivileged uids.
mkdir -p /var/tmp/fence-e2b
chmod 711 /var/tmp/fence-e2b
work="$(mktemp -d /var/tmp/fence-e2b/run.XXXXXX)"
chmod 711 "$work"
port="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
key="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"

# The fake package registries' network (test/templates.test.mjs): a network
# namespace joined to the host by a veth pair, on a random /29 of
# 198.18.0.0/15 (a range sandboxes reach only through an allow rule inside
# it). The daemon's build allowlist admits REG_IP:8080 (--build-allow) and
# points pip at its index (--pip-index-url); DENIED_IP, in the same
# namespace, is on no allowlist.
serve_extra=(--backend "$backend")
reg_ns=""
if [[ $EUID -eq 0 ]] && command -v ip >/dev/null; then
	n=$(( (RANDOM * 32768 + RANDOM) % 16384 * 8 ))
	net="198.$(( 18 + n / 65536 )).$(( n / 256 % 256 )).$(( n % 256 ))"
	base="${net%.*}"; last="${net##*.}"
	reg_ns="fence-e2b-reg-$$"
	reg_if="fe2b$$"
	ip netns add "$reg_ns"
	trap 'ip netns del "$reg_ns" 2>/dev/null || true' EXIT
	ip link add "$reg_if" type veth peer name eth0 netns "$reg_ns"
	ip addr add "$base.$(( last + 1 ))/29" dev "$reg_if"
	ip link set "$reg_if" up
	ip -n "$reg_ns" addr add "$base.$(( last + 2 ))/29" dev eth0
	ip -n "$reg_ns" addr add "$base.$(( last + 3 ))/29" dev eth0
	ip -n "$reg_ns" link set eth0 up
	ip -n "$reg_ns" link set lo up
	export FENCE_E2B_REGISTRY_NS="$reg_ns"
	export FENCE_E2B_REGISTRY_IP="$base.$(( last + 2 ))"
	export FENCE_E2B_DENIED_IP="$base.$(( last + 3 ))"
	serve_extra+=(--build-allow "$FENCE_E2B_REGISTRY_IP:8080" --pip-index-url "http://$FENCE_E2B_REGISTRY_IP:8080/simple")
fi

# shellcheck disable=SC2206 # FENCE_E2B_SERVE_EXTRA is split into words on purpose
serve_extra+=(${FENCE_E2B_SERVE_EXTRA:-})
FENCE_API_KEY="$key" "$repo/bin/fence" serve --addr "127.0.0.1:$port" \
	--data-dir "$work/data" --templates-dir "$templates" "${serve_extra[@]}" >"$work/daemon.log" 2>&1 &
daemon=$!
cleanup() {
	kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
	if [[ -n "$reg_ns" ]]; then
		ip netns pids "$reg_ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
		ip netns del "$reg_ns" 2>/dev/null || true
	fi
	# The daemon may leave its disk mounts behind; unmount them, deepest
	# first, so the data dir can be removed.
	awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
	if [[ "${status:-1}" == 0 && -z "${FENCE_KEEP:-}" ]]; then
		rm -rf "$work"
	else
		echo "run.sh: daemon log and data kept in $work" >&2
	fi
}
trap cleanup EXIT

for _ in $(seq 100); do
	if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$daemon" 2>/dev/null; then
		cat "$work/daemon.log" >&2
		exit 2
	fi
	sleep 0.1
done

export E2B_API_KEY="$key"
if [[ -n "${FENCE_E2B_TEAM_KEY:-}" ]]; then
	team="$(FENCE_URL="http://127.0.0.1:$port" FENCE_API_KEY="$key" "$repo/bin/fence" team create e2b-tests)"
	E2B_API_KEY="$(FENCE_URL="http://127.0.0.1:$port" FENCE_API_KEY="$key" "$repo/bin/fence" key create sdk --team "$team")"
	echo "run.sh: as team $team" >&2
fi
export E2B_API_URL="http://127.0.0.1:$port"
export E2B_SANDBOX_URL="http://127.0.0.1:$port"
# The SDK's Volume content client has its own base URL.
export E2B_VOLUME_API_URL="http://127.0.0.1:$port"
unset E2B_DEBUG E2B_DOMAIN

cd "$here"
# Installed again whenever package-lock.json changed since the last
# install (a stamp of its hash is kept in node_modules).
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [[ ! -d node_modules || "$(cat node_modules/.fence-lock-sha256 2>/dev/null)" != "$lock_sum" ]]; then
	npm ci --no-audit --no-fund
	echo "$lock_sum" > node_modules/.fence-lock-sha256
fi
status=0
if [[ "${1:-}" == --bench ]]; then
	node bench.mjs || status=$?
elif [[ "${1:-}" == --bench-ci ]]; then
	node bench-code-interpreter.mjs || status=$?
elif [[ "${1:-}" == --bench-desktop ]]; then
	node bench-desktop.mjs || status=$?
else
	[[ $# -gt 0 ]] || set -- test/
	node --test --test-concurrency=2 "$@" | tee "$work/tests.tap" || status=$?
	if [[ "$status" != 0 ]]; then
		# The failures again, whole, at the end of the output (where a
		# CI log's excerpt shows them), with the daemon's errors.
		echo "run.sh: the failed tests, as reported above:" >&2
		awk '/^ *not ok / { on = 1; end = substr($0, 1, match($0, /[^ ]/) - 1) "  ..." }
			on { print }
			on && $0 == end { on = 0 }' "$work/tests.tap" >&2
		echo "run.sh: the daemon's last errors and warnings:" >&2
		grep -E 'level=(ERROR|WARN)' "$work/daemon.log" | tail -n 40 >&2 || true
	fi
fi
if grep -q "sandbox stopped unexpectedly" "$work/daemon.log"; then
	n="$(grep -c "sandbox stopped unexpectedly" "$work/daemon.log")"
	echo "run.sh: warning: $n sandbox(es) died without a kill request; see $work/daemon.log" >&2
fi
exit "$status"
