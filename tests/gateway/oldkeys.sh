#!/usr/bin/env bash
# tests/gateway/oldkeys.sh: an API key stored in the layout before the {apikeys} slot
# (main 1cc2ccd: record sf:apikey:{<hash>}, index sf:apikeys, producer credential
# sf:pkey:{<pid>}) keeps working after the upgrade. On the e2e stack: a key is made with
# today's CLI and put back into the old layout (what the old CLI wrote, field for field);
# the stack's gateway, started before, refuses it (401: nothing reads the old layout at a
# lookup, so this test fails without the migration); a second gateway started now (its
# start moves the old keys: state/sf_apikeys.c sf_apikeys_migrate) answers a tools/call
# made with it (gateway -> scheduler -> reply), the old keys are gone and the new record,
# index entry and credential hold what the old ones held; `sandfleet keys revoke` then
# revokes it and the gateway refuses it again.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../ops/lib.sh"
. "${SF_E2E_STATE:?}/env"
export SF_REDIS_URL SF_KAFKA_BROKERS SF_AUTH_SECRET_FILE
cli=$SF_BUILD/cli/sandfleet
rport=${SF_REDIS_URL##*:}
rport=${rport%%/*}
r() { redis-cli -p "$rport" --no-raw "$@" | sed 's/^"\(.*\)"$/\1/; s/^(integer) //; s/^(nil)$//'; }
fail() { echo "FAIL: $*"; exit 1; }
team=oldkeys$$

call() { # URL KEY: the HTTP status of a tools/call sandbox_list made with KEY
    curl -s -o "$work/body" -w '%{http_code}' -H "Authorization: Bearer $2" \
        -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
        -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_list","arguments":{}}}' \
        "$1"
}

work=$SF_STATE/oldkeys
rm -rf "$work"
mkdir -p "$work/logs" "$work/pids"

# 1. a key in the old layout
key=$("$cli" keys create --team "$team" --name legacy 2>/dev/null) || fail "keys create"
id=$("$cli" keys list --team "$team" | awk -v t="$team" '$2 == t {print $1}')
hash=$(r HGET 'sf:apikeys:{apikeys}' "$id")
[ ${#hash} -eq 64 ] || fail "no new-layout record for $id ($hash)"
created=$(r HGET "sf:apikey:{apikeys}:$hash" created)
pid=$(r HGET "sf:apikey:{apikeys}:$hash" pid)
psk=$(r HGET "sf:pkey:{apikeys}:$pid" psk)
[ -n "$pid" ] && [ -n "$psk" ] || fail "no producer credential for $id"
r DEL "sf:apikey:{apikeys}:$hash" "sf:pkey:{apikeys}:$pid" >/dev/null
r HDEL 'sf:apikeys:{apikeys}' "$id" >/dev/null
# as 1cc2ccd's cli/keys.c wrote them
r HSET "sf:pkey:{$pid}" team "$team" key "$hash" psk "$psk" >/dev/null
r HSET "sf:apikey:{$hash}" id "$id" team "$team" name legacy created "$created" pid "$pid" >/dev/null
r HSET sf:apikeys "$id" "$hash" >/dev/null

# 2. the running gateway (started before the key was moved back) does not know it
st=$(call "$SF_URL" "$key")
[ "$st" = 401 ] || fail "the stack's gateway answered $st to an old-layout key before any migration (want 401)"

# 3. a gateway started now moves it, and the key works through it
gw_port=$(sf_free_port)
(
    sf_daemon_env "$SF_STATE" "$SF_BUILD"
    export SF_PORT=$gw_port SF_LOG_LEVEL=info
    unset SF_TLS_CERT_FILE SF_TLS_KEY_FILE
    sf_spawn "$work" gateway "$SF_BUILD/gateway/sandfleet-gateway"
)
cleanup() {
    [ -f "$work/pids/gateway" ] && kill -TERM "$(cat "$work/pids/gateway")" 2>/dev/null
    sf_wait 10 "the second gateway to stop" sh -c "! kill -0 $(cat "$work/pids/gateway") 2>/dev/null"
}
trap cleanup EXIT
sf_wait 20 "the second gateway" curl -sf "http://127.0.0.1:$gw_port/healthz" || { tail "$work/logs/gateway.log"; exit 1; }
grep -q 'API keys moved to the {apikeys} slot' "$work/logs/gateway.log" || fail "the second gateway logged no migration"
st=$(call "http://127.0.0.1:$gw_port/mcp" "$key")
[ "$st" = 200 ] && grep -q '"sandboxes"' "$work/body" ||
    fail "the migrated key through the new gateway: HTTP $st: $(head -c 300 "$work/body")"
st=$(call "$SF_URL" "$key") # the stack's gateway reads the new layout on a miss
[ "$st" = 200 ] || fail "the stack's gateway after the migration: $st"

# 4. old keys gone, new ones whole
[ "$(r EXISTS "sf:apikey:{$hash}" "sf:pkey:{$pid}")" = 0 ] || fail "old-layout keys left"
[ -z "$(r HGET sf:apikeys "$id")" ] || fail "the old index still names $id"
[ "$(r HGET 'sf:apikeys:{apikeys}' "$id")" = "$hash" ] || fail "the new index lacks $id"
[ "$(r HGET "sf:apikey:{apikeys}:$hash" team)" = "$team" ] &&
    [ "$(r HGET "sf:apikey:{apikeys}:$hash" name)" = legacy ] &&
    [ "$(r HGET "sf:apikey:{apikeys}:$hash" created)" = "$created" ] &&
    [ "$(r HGET "sf:apikey:{apikeys}:$hash" pid)" = "$pid" ] || fail "the new record differs"
[ "$(r HGET "sf:pkey:{apikeys}:$pid" psk)" = "$psk" ] &&
    [ "$(r HGET "sf:pkey:{apikeys}:$pid" team)" = "$team" ] || fail "the producer credential differs"

# 5. revoked like any key
"$cli" keys revoke "$id" >/dev/null || fail "keys revoke $id"
sf_wait 5 "the revocation to reach the gateway" sh -c \
    "[ \"\$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer $key' -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' -d '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}' http://127.0.0.1:$gw_port/mcp)\" = 401 ]" ||
    fail "the revoked key still works"
cleanup
trap - EXIT
if grep -lE 'ERROR: AddressSanitizer|runtime error:|LeakSanitizer' "$work/logs/gateway.log"; then
    grep -hE -A15 'ERROR: AddressSanitizer|runtime error:|leak of' "$work/logs/gateway.log" | head -60
    fail "sanitizer reports in the second gateway's log"
fi
echo "ok: an old-layout key was moved at the gateway's start and works; revoked after"
