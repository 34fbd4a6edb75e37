#!/usr/bin/env bash
# The gateway's transports on one port, against the real stack (ctest fixture `stack`):
# curl over HTTP/1.1, h2c by Upgrade and by prior knowledge, TLS with ALPN http/1.1 and h2;
# h2load over h2c, TLS h2 and HTTP/1.1. Every answer is checked, not just the status.
set -uo pipefail
. "${SF_E2E_STATE:?}/env"
fail=0
ok() { printf 'ok   %s\n' "$1"; }
bad() { printf 'FAIL %s: %s\n' "$1" "$2"; fail=1; }
base=${SF_URL%/mcp}
tls_url=${SF_URL/http:/https:}
ping='{"jsonrpc":"2.0","id":7,"method":"ping"}'
hdr=(-H "Authorization: Bearer $SF_KEY_ALPHA" -H 'Content-Type: application/json'
     -H 'Accept: application/json, text/event-stream')

# check NAME WANT_VERSION CURL_ARGS...: the ping answer and the HTTP version curl used
check() {
    local name=$1 want=$2 out; shift 2
    out=$(curl -s --max-time 10 -w '\n%{http_version} %{http_code}' "$@") || { bad "$name" "curl failed"; return; }
    case $out in
    *'"id":7,"result":{}'*"$want 200") ok "$name" ;;
    *) bad "$name" "got: $out" ;;
    esac
}
check "HTTP/1.1" 1.1 --http1.1 "${hdr[@]}" -d "$ping" "$SF_URL"
check "h2c prior knowledge" 2 --http2-prior-knowledge "${hdr[@]}" -d "$ping" "$SF_URL"
check "TLS, ALPN http/1.1" 1.1 --http1.1 --cacert "$SF_TLS_CERT_FILE" "${hdr[@]}" -d "$ping" "$tls_url"
check "TLS, ALPN h2" 2 --http2 --cacert "$SF_TLS_CERT_FILE" "${hdr[@]}" -d "$ping" "$tls_url"
# curl --http2 offers Upgrade: h2c; a POST with a body is served as HTTP/1.1 (allowed)
check "Upgrade offered with a body" 1.1 --http2 "${hdr[@]}" -d "$ping" "$SF_URL"
# an answer of several HTTP/2 DATA frames (tools/list, ~30 KB): the same bytes everywhere
list='{"jsonrpc":"2.0","id":9,"method":"tools/list"}'
want=$(curl -s --max-time 10 --http1.1 "${hdr[@]}" -d "$list" "$SF_URL")
[ ${#want} -gt 20000 ] || bad "tools/list over HTTP/1.1" "${want:0:200}"
for how in "h2c prior knowledge|--http2-prior-knowledge|$SF_URL" "TLS h2|--http2|$tls_url" \
    "TLS http/1.1|--http1.1|$tls_url"; do
    IFS='|' read -r name opt url <<<"$how"
    got=$(curl -s --max-time 10 "$opt" --cacert "$SF_TLS_CERT_FILE" "${hdr[@]}" -d "$list" "$url")
    [ "$got" = "$want" ] && ok "tools/list, $name: the same ${#got} bytes" || bad "tools/list, $name" "${#got} bytes"
done
# a GET takes the upgrade: 101, then the answer and the next request on HTTP/2
out=$(curl -s --max-time 10 --http2 -w ' %{http_version}\n' "$base/healthz" "$base/healthz")
[ "$out" = '{"status":"ok"} 2
{"status":"ok"} 2' ] && ok "Upgrade: h2c (101, stream 1, then more streams)" || bad "Upgrade: h2c" "$out"

# h2load: every request answered 2xx over each transport
printf '%s' "$ping" >"$SF_STATE/ping.json"
h2() {
    local name=$1 out; shift
    out=$(h2load -n 2000 -c 8 -m 4 -d "$SF_STATE/ping.json" -H "Authorization: Bearer $SF_KEY_ALPHA" \
        -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "$@" 2>&1)
    if grep -q 'status codes: 2000 2xx' <<<"$out" && grep -q '2000 succeeded' <<<"$out"; then
        ok "$name ($(grep -o '[0-9.]* req/s' <<<"$out" | head -1))"
    else
        bad "$name" "$(grep -E 'requests:|status codes|error' <<<"$out" | head -3)"
    fi
}
h2 "h2load h2c" "$SF_URL"
h2 "h2load TLS h2" "$tls_url"
h2 "h2load HTTP/1.1" --h1 "$SF_URL"
printf '%s' "$list" >"$SF_STATE/ping.json" # answers of several frames, pipelined on HTTP/1.1
h2 "h2load h2c, tools/list" "$SF_URL"
h2 "h2load HTTP/1.1, tools/list" --h1 "$SF_URL"
# observability on the same port: readiness, Prometheus metrics, the access log
out=$(curl -s -w ' %{http_code}' "$base/readyz")
[ "$out" = '{"status":"ready","redis":true,"kafka":true} 200' ] && ok "/readyz" || bad "/readyz" "$out"
out=$(curl -s "$base/metrics")
if grep -q '^sandfleet_gateway_requests_total{method="POST",status="200"} [1-9]' <<<"$out" &&
    grep -q '^sandfleet_gateway_request_duration_seconds_count [1-9]' <<<"$out" &&
    grep -q '^sandfleet_gateway_jobs_in_flight ' <<<"$out" && grep -q '^sandfleet_gateway_refused_total{reason="timeout"}' <<<"$out"; then
    ok "/metrics"
else
    bad "/metrics" "$(head -5 <<<"$out")"
fi
list='{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"sandbox_list","arguments":{}}}'
rid=$(curl -s -D - -o /dev/null --http2-prior-knowledge "${hdr[@]}" -d "$list" "$SF_URL" | tr -d '\r' |
      awk 'tolower($1)=="x-request-id:"{print $2}')
for _ in $(seq 1 50); do
    line=$(grep "msg=access req=$rid " "$SF_STATE/logs/gateway.log" 2>/dev/null) && break
    sleep 0.05
done
[[ $line == *"status=200 proto=h2c"*" job=job_"* ]] && ok "access log: request id, protocol, job id" || bad "access log" "rid=$rid line=$line"
exit $fail
