#!/usr/bin/env bash
# Server CPU time per request, measured from the process's own utime+stime, with the server pinned to CPU 0 and
# h2load (Debian package nghttp2-client) on CPU 1. The review is the real API server capture grown to ~6 KB.
#
#   loadtest/server-cpu.sh h1 32 100000      # protocol (h1|h2), concurrent connections, requests
#
# Prints the CPU per request and h2load's summary. Interim tool until the load harness (loadtest crate) lands.
set -euo pipefail
proto=${1:-h1} clients=${2:-32} requests=${3:-100000}
cd "$(dirname "$0")/.."
review=$(mktemp)
python3 - "$review" <<'PY'
import json, sys
r = json.load(open('../shared/corpus/reviews/apiserver-1.20-pod-create.json'))
o = r['request']['object']; i = 0
while len(json.dumps(r, separators=(',', ':'))) < 6000:
    if i % 4 == 0:
        o['metadata'].setdefault('annotations', {})[f'example.com/note-{i}'] = f'a "quoted" note number {i}'
    else:
        o['spec']['containers'][0].setdefault('env', []).append({'name': f'SETTING_{i}', 'value': f'value-{i}-' + 'x' * 24})
    i += 1
open(sys.argv[1], 'w').write(json.dumps(r, separators=(',', ':')))
PY
cargo build --release -q
taskset -c 0 ./target/release/sidecar-injector serve --listen 127.0.0.1:18443 --metrics-listen 127.0.0.1:19090 \
    --shutdown-delay 0s --dev-ca-file "$review.ca.pem" 2>/dev/null &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; rm -f "$review" "$review.ca.pem"' EXIT
sleep 1
args=(-c "$clients" -d "$review" -H 'content-type: application/json')
if [ "$proto" = h1 ]; then args+=(--h1); else args+=(-m 8); fi
url=https://127.0.0.1:18443/mutate?timeout=10s
taskset -c 1 h2load "${args[@]}" -n 2000 "$url" >/dev/null   # warm-up
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
before=$(cpu)
out=$(taskset -c 1 h2load "${args[@]}" -n "$requests" "$url")
after=$(cpu)
python3 -c "import os; print('$proto c=$clients: %.1f µs server CPU per request' % (($after - $before) / os.sysconf('SC_CLK_TCK') * 1e6 / $requests))"
echo "$out" | grep -E "finished in|requests:|status codes|time for request"
