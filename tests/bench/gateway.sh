#!/usr/bin/env bash
# tests/bench/gateway.sh [N]: the gateway against two baselines in one run, with h2load at 64
# connections (N requests per row, default 20000): the official MCP TypeScript SDK server
# (stateful, JSON responses; HTTP/1.1 only) and nginx returning a static body of the same
# size to POSTs. Rows: tools/list and ping over HTTP/1.1 and h2c, and sandbox_exec `true`
# through the whole pipeline (gateway only: the baselines run no sandboxes). Prints req/s,
# p50 and p99 (from h2load's per-request log), the server's CPU time per request (from
# /proc: all its threads or workers; for the gateway also its event-loop threads alone,
# without rdkafka's), the ratios gateway/SDK and gateway/nginx, (with
# valgrind) the gateway's user-space instructions and allocations per request, and (with
# strace) system calls per tools/list request for the gateway and nginx.
# Uses build/; starts and stops its own stack (access log off, log level warn).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/ops/lib.sh"
n=${1:-20000}
c=64
command -v h2load >/dev/null || sf_die "h2load is missing: apt-get install nghttp2-client"
command -v nginx >/dev/null || { apt-get install -y -qq nginx-light >/dev/null 2>&1 || sf_die "nginx is missing: apt-get install nginx-light"; }
[ -d "$root/tests/e2e/node_modules/@modelcontextprotocol/sdk" ] ||
    (cd "$root/tests/e2e" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || sf_die "npm ci failed"

state=$(mktemp -d /tmp/sf-gwbench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    [ -f "$state/nginx.pid" ] && kill "$(cat "$state/nginx.pid")" 2>/dev/null
    "$root/tests/integration/stack" down "$state" "$root/build" >/dev/null
    rm -rf "$state"
}
trap cleanup EXIT
export SF_TEAM_SANDBOX_LIMIT=1000 SF_MAX_PENDING_TEAM=100000 SF_MAX_SESSIONS_TEAM=1000
export SF_ACCESS_LOG=0 SF_LOG_LEVEL=warn SF_MAX_CONNS_PER_ADDR=4096
"$root/tests/integration/stack" up "$state" "$root/build" >/dev/null || sf_die "the stack failed to start"
. "$state/env"
gw=$SF_URL
hdr=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')

# A session on the gateway, and the tools/list body every server will send.
init='{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}'
sid=$(curl -s -D - -o /dev/null "${hdr[@]}" -H "Authorization: Bearer $SF_KEY_ALPHA" -d "$init" "$gw" |
      tr -d '\r' | awk 'tolower($1)=="mcp-session-id:"{print $2}')
[ -n "$sid" ] || sf_die "no session from the gateway"
printf '%s' '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' >"$state/list.json"
printf '%s' '{"jsonrpc":"2.0","id":1,"method":"ping"}' >"$state/ping.json"
curl -s "${hdr[@]}" -H "Authorization: Bearer $SF_KEY_ALPHA" -H "Mcp-Session-Id: $sid" \
    -d @"$state/list.json" "$gw" >"$state/list.response"
node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1]));require("fs").writeFileSync(process.argv[2],JSON.stringify(r.result))' \
    "$state/list.response" "$state/tools.json"
sb=$(curl -s "${hdr[@]}" -H "Authorization: Bearer $SF_KEY_ALPHA" -H "Mcp-Session-Id: $sid" \
    -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sandbox_create","arguments":{"name":"bench"}}}' "$gw" |
    grep -o '"id":"sb_[a-z0-9]*"' | head -1 | cut -d'"' -f4)
[ -n "$sb" ] || sf_die "could not create a sandbox"
printf '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"sandbox_id":"%s","command":"true"}}}' "$sb" >"$state/exec.json"

# The SDK server (HTTP/1.1), with its own session.
node "$root/tests/bench/sdk_server.mjs" "$state/tools.json" "$state/sdk.port" >"$state/sdk.log" 2>&1 &
pids+=($!)
sf_wait 20 "the SDK server" test -s "$state/sdk.port" || sf_die "the SDK server did not start"
sdk="http://127.0.0.1:$(cat "$state/sdk.port")/mcp"
sdk_sid=$(curl -s -D - -o /dev/null "${hdr[@]}" -d "$init" "$sdk" | tr -d '\r' | awk 'tolower($1)=="mcp-session-id:"{print $2}')
[ -n "$sdk_sid" ] || sf_die "no session from the SDK server"

# nginx: the same tools/list answer as a static body to POSTs, HTTP/1.1 and h2c.
np1=$(sf_free_port) np2=$(sf_free_port)
mkdir -p "$state/www"
cp "$state/list.response" "$state/www/list.json"
cat >"$state/nginx.conf" <<NGX
worker_processes $(nproc);
pid $state/nginx.pid;
error_log $state/nginx.err warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $state/nb; proxy_temp_path $state/np; fastcgi_temp_path $state/nf;
    uwsgi_temp_path $state/nu; scgi_temp_path $state/ns;
    keepalive_requests 1000000;
    # nginx at its best for a static file: no open/fstat/close per request, body by sendfile
    open_file_cache max=16 inactive=60s; open_file_cache_valid 60s;
    sendfile on; tcp_nopush on;
    server { listen 127.0.0.1:$np1; listen 127.0.0.1:$np2 http2;
             # a POST to a static file is a 405 inside nginx: error_page turns it into the file
             location = /mcp { default_type application/json; root $state/www;
                               error_page 405 =200 /list.json; try_files /list.json =404; }
             location = /list.json { default_type application/json; root $state/www; } }
}
NGX
nginx -c "$state/nginx.conf" -e "$state/nginx.err" || sf_die "nginx did not start ($state/nginx.err)"
sf_wait 10 nginx curl -sf -d x "http://127.0.0.1:$np1/mcp" || sf_die "nginx does not answer"
cmp -s <(curl -s -d x "http://127.0.0.1:$np1/mcp") "$state/list.response" ||
    sf_die "nginx's body differs from the gateway's tools/list answer"

# cpu_ticks PID...: user+system clock ticks of these processes (every thread) so far (a
# PID/task/TID counts that thread alone)
cpu_ticks() {
    local t=0 p
    for p in "$@"; do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}
gw_pid=$(cat "$state/pids/gateway")
ngx_pids=$(pgrep -P "$(cat "$state/nginx.pid")" | tr '\n' ' ')
sdk_pid=${pids[0]}
hz=$(getconf CLK_TCK)
# the gateway's event-loop threads (named like the process; rdkafka's are rdk:*)
gw_loop_tasks=$(for t in /proc/"$gw_pid"/task/*; do
    [ "$(cat "$t/comm")" = "$(cat /proc/"$gw_pid"/comm)" ] && echo "$gw_pid/task/${t##*/}"; done | tr '\n' ' ')

# run LABEL URL BODY PROTO PIDS [headers...]: one h2load row; prints
# "req/s p50_ms p99_ms cpu_us_per_request loop_us_per_request" (the CPU time of PIDS during
# the row; for the gateway also of its event-loop threads alone, else "-")
run() {
    local label=$1 url=$2 bodyf=$3 proto=$4 who=$5 log="$state/h2load.log"; shift 5
    local loops=-; [ "$who" = "$gw_pid" ] && loops=$gw_loop_tasks
    local args=(-n "$n" -c "$c" -m 1 -d "$bodyf" "${hdr[@]}" --log-file="$log")
    [ "$proto" = h1 ] && args+=(--h1)
    rm -f "$log"
    local out rps t0 t1 l0=0 l1=0
    t0=$(cpu_ticks $who)
    [ "$loops" != - ] && l0=$(cpu_ticks $loops)
    out=$(h2load "${args[@]}" "$@" "$url" 2>&1)
    t1=$(cpu_ticks $who)
    [ "$loops" != - ] && l1=$(cpu_ticks $loops)
    rps=$(grep -o 'finished in [^,]*, [0-9.]* req/s' <<<"$out" | awk '{print $(NF-1)}')
    if ! grep -q "status codes: $n 2xx" <<<"$out"; then
        printf '%-34s %s\n' "$label" "FAILED: $(grep -E 'status codes|requests:' <<<"$out" | tr '\n' ' ')" >&2
        echo "0 0 0 0 -"
        return
    fi
    sort -n -k3 "$log" | awk -v n="$(wc -l <"$log")" -v cpu="$(((t1 - t0) * 1000000 / hz))" -v reqs="$n" \
        -v loop="$([ "$loops" != - ] && echo $(((l1 - l0) * 1000000 / hz)) || echo -)" '
        NR==int(n*0.50+0.5){p50=$3} NR==int(n*0.99+0.5){p99=$3}
        END{printf "%s %.2f %.2f %.1f %s\n", "'"$rps"'", p50/1000, p99/1000, cpu/reqs,
            loop == "-" ? "-" : sprintf("%.1f", loop/reqs)}'
}

gwh=(-H "Authorization: Bearer $SF_KEY_ALPHA" -H "Mcp-Session-Id: $sid" -H "MCP-Protocol-Version: 2025-06-18")
sdkh=(-H "Mcp-Session-Id: $sdk_sid" -H "MCP-Protocol-Version: 2025-06-18")
declare -A R
for proto in h1 h2c; do
    for op in list ping; do
        R[gw_${op}_$proto]=$(run "gateway $op $proto" "$gw" "$state/$op.json" "$proto" "$gw_pid" "${gwh[@]}")
    done
    R[nginx_list_$proto]=$(run "nginx list $proto" "http://127.0.0.1:$([ $proto = h1 ] && echo $np1 || echo $np2)/mcp" "$state/list.json" "$proto" "$ngx_pids")
done
for op in list ping; do R[sdk_${op}_h1]=$(run "sdk $op h1" "$sdk" "$state/$op.json" h1 "$sdk_pid" "${sdkh[@]}"); done
ne=$((n / 4))
R[gw_exec_h1]=$(n=$ne; run "gateway exec h1" "$gw" "$state/exec.json" h1 "$gw_pid" "${gwh[@]}")
R[gw_exec_h2c]=$(n=$ne; run "gateway exec h2c" "$gw" "$state/exec.json" h2c "$gw_pid" "${gwh[@]}")

printf '\ngateway vs the official MCP SDK server vs nginx (static body of the same size)\n'
printf 'h2load -c %d -m 1, %d requests per row (exec: %d); %d cores; p50/p99 per request\n\n' "$c" "$n" "$ne" "$(nproc)"
printf 'load average at the end: %s\n\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '| server | operation | proto | req/s | p50 ms | p99 ms | CPU us/req | loop threads us/req |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n'
row() { local v=(${R[$1]}); printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$2" "$3" "$4" "${v[0]}" "${v[1]}" "${v[2]}" "${v[3]}" "${v[4]}"; }
for proto in h1 h2c; do
    row gw_list_$proto gateway tools/list $proto
    row nginx_list_$proto nginx "static body" $proto
    row gw_ping_$proto gateway ping $proto
done
row sdk_list_h1 "SDK server" tools/list h1
row sdk_ping_h1 "SDK server" ping h1
row gw_exec_h1 gateway "sandbox_exec true" h1
row gw_exec_h2c gateway "sandbox_exec true" h2c
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2fx", a / b; else printf "n/a" }'; }
g1=(${R[gw_list_h1]}) g2=(${R[gw_list_h2c]}) s1=(${R[sdk_list_h1]}) x1=(${R[nginx_list_h1]}) x2=(${R[nginx_list_h2c]})
gp=(${R[gw_ping_h1]}) sp=(${R[sdk_ping_h1]})
printf '\nratios (req/s): tools/list gateway/SDK h1 %s (h2c gateway vs SDK h1: %s), ping gateway/SDK h1 %s;\n' \
    "$(ratio "${g1[0]}" "${s1[0]}")" "$(ratio "${g2[0]}" "${s1[0]}")" "$(ratio "${gp[0]}" "${sp[0]}")"
printf '                tools/list gateway/nginx h1 %s, h2c %s\n' "$(ratio "${g1[0]}" "${x1[0]}")" "$(ratio "${g2[0]}" "${x2[0]}")"
printf 'goals: >= 25x SDK, >= 0.8x nginx on tools/list, p99 <= 5 ms\n'

# Instructions and allocations per request (load-independent): a second gateway with one
# event-loop thread, the stack's settings and its own port, under callgrind; counters
# zeroed after 200 warm-up requests, then 2000 requests at 64 connections; only the
# event-loop thread's profile is read (rdkafka's threads poll by the clock, not per request).
instr() { # instr LABEL OP PROTO
    local label=$1 op=$2 proto=$3 port vp f n=2000 out="$state/cg"
    local args=(-c "$c" -m 1 -d "$state/$op.json" "${hdr[@]}" "${gwh[@]}")
    [ "$proto" = h1 ] && args+=(--h1)
    port=$(sf_free_port)
    rm -f "$out"*
    env -i $(tr '\0' '\n' <"/proc/$gw_pid/environ" | grep -v -e '^SF_PORT=' -e '^SF_GATEWAY_ID=' -e '^SF_THREADS=') \
        SF_PORT="$port" SF_THREADS=1 SF_GATEWAY_ID=bench-cg \
        valgrind --tool=callgrind --separate-threads=yes --compress-strings=no \
        --callgrind-out-file="$out" "$root/build/gateway/sandfleet-gateway" >"$state/cg.log" 2>&1 &
    vp=$!
    if ! sf_wait 120 "the gateway under callgrind" curl -sf "http://127.0.0.1:$port/healthz"; then
        kill "$vp" 2>/dev/null; wait "$vp" 2>/dev/null
        printf '| %s | n/a | n/a |\n' "$label"
        return
    fi
    h2load -n 200 "${args[@]}" "http://127.0.0.1:$port/mcp" >/dev/null 2>&1
    callgrind_control -z "$vp" >/dev/null 2>&1
    h2load -n "$n" "${args[@]}" "http://127.0.0.1:$port/mcp" >"$state/cg.h2" 2>&1
    callgrind_control -d "$vp" >/dev/null 2>&1
    kill "$vp" 2>/dev/null; wait "$vp" 2>/dev/null
    f=$(ls -t "$out".*-01 2>/dev/null | head -1)
    if [ -z "$f" ] || ! grep -q "status codes: $n 2xx" "$state/cg.h2"; then
        printf '| %s | n/a | n/a |\n' "$label"
        return
    fi
    awk -v n="$n" -v l="$label" '
        /^summary:/ {ir = $2}
        /^fn=/ {fn = substr($0, 4)} /^cfn=/ {cfn = substr($0, 5)}
        /^calls=/ && (cfn == "malloc" || cfn == "calloc" || cfn == "realloc") &&
            fn != "malloc" && fn != "calloc" && fn != "realloc" && fn != "_int_realloc" {
            split(substr($0, 7), a, " "); al += a[1] }
        END {printf "| %s | %.0f | %.1f |\n", l, ir / n, al / n}' "$f"
}
if command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
    printf '\nuser-space instructions and allocations per request of the gateway (callgrind on its event-loop thread, %d requests)\n\n' 2000
    printf '| row | instructions | allocations |\n| --- | ---: | ---: |\n'
    instr "tools/list h1" list h1
    instr "tools/list h2c" list h2c
    instr "ping h1" ping h1
    instr "ping h2c" ping h2c
fi

# System calls per tools/list request (load-independent): strace -c on the gateway's
# event-loop threads and on nginx's workers during one more HTTP/1.1 and h2c row each.
command -v strace >/dev/null || exit 0
gw_loops=$(for t in /proc/"$gw_pid"/task/*; do
    [ "$(cat "$t/comm")" = "$(cat /proc/"$gw_pid"/comm)" ] && echo "-p ${t##*/}"; done)
count() { # count LABEL PROTO URL "STRACE-ARGS" [headers...]
    local label=$1 proto=$2 url=$3 who=$4 sp; shift 4
    local args=(-n "$n" -c "$c" -m 1 -d "$state/list.json" "${hdr[@]}")
    [ "$proto" = h1 ] && args+=(--h1)
    strace -c -o "$state/strace.out" $who 2>/dev/null & sp=$!
    sleep 1 # attached
    h2load "${args[@]}" "$@" "$url" >/dev/null 2>&1
    kill -INT "$sp"; wait "$sp"
    awk -v n="$n" -v l="$label" '$4 ~ /^[0-9]+$/ && $NF != "total" && $4 / n >= 0.01 {s = s sprintf(" %s %.2f,", $NF, $4 / n)}
        $NF == "total" {t = $4 / n} END {printf "| %s | %.2f |%s |\n", l, t, s}' "$state/strace.out"
}
printf '\nsystem calls per tools/list request (strace -c, %d requests; gateway: event-loop threads, nginx: workers)\n\n' "$n"
printf '| server, proto | per request | the calls (>= 0.01 per request) |\n| --- | ---: | --- |\n'
count "gateway h1" h1 "$gw" "$gw_loops" "${gwh[@]}"
count "nginx h1" h1 "http://127.0.0.1:$np1/mcp" "$(printf -- '-p %s ' $ngx_pids)"
count "gateway h2c" h2c "$gw" "$gw_loops" "${gwh[@]}"
count "nginx h2c" h2c "http://127.0.0.1:$np2/mcp" "$(printf -- '-p %s ' $ngx_pids)"
