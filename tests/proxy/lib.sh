# tests/proxy/lib.sh: shared by env, cases and the benchmark. Source it.
. "$(dirname "${BASH_SOURCE[0]}")/../../ops/lib.sh"

# sp_world_vars STATE [NET16]: names and addresses of this world (also written to
# STATE/world); NET16 is the /16 its upstream network comes from (198.18 by default; the
# e2e stacks' upstream takes 198.19, so the two never share an address).
sp_world_vars() {
    local state=$1 net16=${2:-198.18} h o dev i
    h=$(printf '%s' "$state" | md5sum | cut -c1-6)
    SP_SFX=$h
    SP_UPNS=sfup-$h SP_VETH_H=sfh-$h SP_VETH_U=sfu-$h
    # the /24: the hash's, or the next one no other world's veth holds (two worlds up at once
    # whose hashes met shared addresses: one's requests reached the other's servers)
    o=$((16#${h:0:2} % 250 + 1))
    for ((i = 0; i < 250; i++)); do
        dev=$(ip -o route show to exact "$net16.$o.0/24" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
        if [ -z "$dev" ] || [ "$dev" = "$SP_VETH_H" ]; then break; fi
        o=$((o % 250 + 1))
    done
    SP_NET=$net16.$o
    SP_API=$SP_NET.10 SP_OTHER=$SP_NET.20 SP_TLS=$SP_NET.30 SP_DNS=$SP_NET.53 SP_NOWHERE=$SP_NET.40
    SP_HOSTIP=$SP_NET.1
}

# sp_netns_new STATE NAME: a sandbox namespace set up as the worker does it.
sp_netns_new() {
    local state=$1 name=$2
    ip netns add "$name" || return 1
    echo "$name" >>"$state/netns"
    "$SP_BUILD/tests/proxy/sp_spctl" setup "/run/netns/$name" "/etc/netns/$name" \
        "$state/egress-ca.pem" || return 1
}

sp_ctl() { "$SP_BUILD/tests/proxy/sp_spctl" call "$SP_STATE/proxy.sock" "$@"; }

# sp_register STATE NAME SANDBOX TEAM JSON_EXTRA: netns NAME registered as SANDBOX.
sp_register() {
    local state=$1 name=$2 sb=$3 team=$4 extra=${5:-}
    sp_ctl "{\"op\":\"register\",\"sandbox\":\"$sb\",\"team\":\"$team\"$extra}" "/run/netns/$name"
}

sp_test_ca() { # a CA and one server certificate for the three upstream names
    local d=$1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=sandfleet test upstream CA" -keyout "$d/up-ca.key" -out "$d/up-ca.pem" \
        2>/dev/null || return 1
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=upstream" \
        -keyout "$d/up.key" -out "$d/up.csr" 2>/dev/null || return 1
    printf 'subjectAltName=DNS:api.example.test,DNS:other.test,DNS:tls.example.test\n' >"$d/up.ext"
    openssl x509 -req -in "$d/up.csr" -CA "$d/up-ca.pem" -CAkey "$d/up-ca.key" \
        -CAcreateserial -days 2 -extfile "$d/up.ext" -out "$d/up.pem" 2>/dev/null
}

# sp_upstream_up STATE BUILD: the upstream namespace (the test internet) with its servers,
# the test CA, and the proxy's hosts file and (dead) resolver for the test names, in
# STATE; exports SP_STATE, SP_BUILD. sp_world_vars first.
sp_upstream_up() {
    local state=$1 build=$2
    SP_STATE=$state SP_BUILD=$build
    mkdir -p "$state/logs" "$state/pids"
    # upstream namespace and its veth
    ip netns del "$SP_UPNS" 2>/dev/null; ip link del "$SP_VETH_H" 2>/dev/null
    ip netns add "$SP_UPNS" || return 1
    ip link add "$SP_VETH_H" type veth peer name "$SP_VETH_U" || return 1
    ip link set "$SP_VETH_U" netns "$SP_UPNS"
    ip addr add "$SP_HOSTIP/24" dev "$SP_VETH_H"
    ip link set "$SP_VETH_H" up
    ip -n "$SP_UPNS" link set lo up
    for a in 10 20 30 40 53; do ip -n "$SP_UPNS" addr add "$SP_NET.$a/24" dev "$SP_VETH_U"; done
    ip -n "$SP_UPNS" link set "$SP_VETH_U" up
    sp_test_ca "$state" || return 1
    mkdir -p "$state/files" # served at http://api.example.test/files/ (tests/e2e/hosted.test.mjs)
    local uplog=(--log "$state/upstream.jsonl")
    [ "${SP_BENCH:-0}" = 1 ] && uplog=() # the benchmark's upstream logs nothing
    ip netns exec "$SP_UPNS" "$build/tests/proxy/sp_upstream" --http 80 --https 443 --udp 53 --udp 9999 \
        --dns 5353 --dns-addr "$SP_DNS" --dns-answer "$SP_API" \
        --cert "$state/up.pem" --key "$state/up.key" "${uplog[@]}" --files "$state/files" \
        >>"$state/logs/upstream.log" 2>&1 &
    echo $! >"$state/pids/upstream"
    sf_wait 10 "the upstream servers" ip netns exec "$SP_UPNS" bash -c 'exec 3<>/dev/tcp/127.0.0.1/443' ||
        return 1
    printf '%s api.example.test\n%s other.test\n%s tls.example.test\n%s nowhere.test\n%s self.test\n' \
        "$SP_API" "$SP_OTHER" "$SP_TLS" "$SP_NOWHERE" "$SP_HOSTIP" >"$state/hosts"
    # the proxy's upstream resolver: dead, or (SP_FAKE_RESOLVER=1, the attack suite) the
    # upstream's fake one that records every name it is asked
    if [ "${SP_FAKE_RESOLVER:-0}" = 1 ]; then
        printf 'nameserver %s:5353\noptions timeout:1 attempts:1\n' "$SP_DNS" >"$state/resolv.conf"
    else
        printf 'nameserver 127.0.0.1:9\noptions timeout:1 attempts:1\n' >"$state/resolv.conf"
    fi
}

# sp_upstream_down STATE: stops the upstream servers, removes the namespace and veth.
sp_upstream_down() {
    local state=$1 pid i
    if [ -f "$state/pids/upstream" ]; then
        pid=$(cat "$state/pids/upstream")
        kill -TERM "$pid" 2>/dev/null
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        kill -KILL "$pid" 2>/dev/null
        rm -f "$state/pids/upstream"
    fi
    ip netns del "$SP_UPNS" 2>/dev/null
    ip link del "$SP_VETH_H" 2>/dev/null
    return 0
}

# sp_world_up STATE BUILD: upstream, Redis, two proxies (SP_PROXY_BIN: another proxy
# binary, e.g. an old build to show an attack test fails there), the shared sandbox.
sp_world_up() {
    local state=$1 build=$2 redis_port
    sp_world_vars "$state"
    SP_STATE=$state SP_BUILD=$build
    mkdir -p "$state/logs" "$state/pids"
    cat >"$state/world" <<W
SP_STATE=$state
SP_BUILD=$build
W
    sp_upstream_up "$state" "$build" || return 1
    # Redis
    redis_port=$(sf_free_port)
    sf_spawn "$state" redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$state" \
        --save '' --appendonly no
    export SF_REDIS_URL=redis://127.0.0.1:$redis_port
    sf_wait 10 redis redis-cli -p "$redis_port" ping || return 1
    # the proxy
    export SF_SECRETS_KEY_FILE=$state/secrets.key
    SF_PROXY_CONTROL_SOCKET=$state/proxy.sock SF_PROXY_CA_CERT_FILE=$state/egress-ca.pem \
        SF_PROXY_CA_KEY_FILE=$state/egress-ca.key SF_PROXY_UPSTREAM_CA_FILE=$state/up-ca.pem \
        SF_PROXY_HOSTS_FILE=$state/hosts SF_PROXY_RESOLV_CONF=$state/resolv.conf \
        SF_SECRET_REFRESH_MS=200 SF_LOG_LEVEL=${SP_LOG_LEVEL:-debug} \
        sf_spawn "$state" proxy "${SP_PROXY_BIN:-$build/secret-proxy/sandfleet-secret-proxy}"
    sf_wait 10 "the secret-proxy" test -S "$state/proxy.sock" || return 1
    # a second proxy with the other settings: the reference's default-allow semantics and
    # placeholders to foreign hosts refused instead of passed on
    SF_PROXY_CONTROL_SOCKET=$state/proxy2.sock SF_PROXY_CA_CERT_FILE=$state/egress-ca.pem \
        SF_PROXY_CA_KEY_FILE=$state/egress-ca.key SF_PROXY_UPSTREAM_CA_FILE=$state/up-ca.pem \
        SF_PROXY_HOSTS_FILE=$state/hosts SF_PROXY_RESOLV_CONF=$state/resolv.conf \
        SF_EGRESS_DEFAULT=allow SF_PROXY_REFUSE_UNMATCHED=1 SF_LOG_LEVEL=${SP_LOG_LEVEL:-debug} \
        sf_spawn "$state" proxy2 "${SP_PROXY_BIN:-$build/secret-proxy/sandfleet-secret-proxy}"
    sf_wait 10 "the second secret-proxy" test -S "$state/proxy2.sock" || return 1
    cat >>"$state/world" <<W
SF_REDIS_URL=$SF_REDIS_URL
SF_SECRETS_KEY_FILE=$SF_SECRETS_KEY_FILE
REDIS_PORT=$redis_port
W
    sp_world_populate "$state" "$build"
}

sp_world_down() {
    local state=$1 name pid i
    [ -f "$state/world" ] || return 0
    sp_world_vars "$state"
    for name in proxy proxy2 upstream redis; do # all at once, then wait for each
        [ -f "$state/pids/$name" ] && kill -TERM "$(cat "$state/pids/$name")" 2>/dev/null
    done
    for name in proxy proxy2 upstream redis; do
        [ -f "$state/pids/$name" ] || continue
        pid=$(cat "$state/pids/$name")
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        kill -KILL "$pid" 2>/dev/null
        rm -f "$state/pids/$name"
    done
    if [ -f "$state/netns" ]; then
        while read -r name; do
            ip netns del "$name" 2>/dev/null
            rm -rf "/etc/netns/$name"
        done <"$state/netns"
        rm -f "$state/netns"
    fi
    ip netns del "$SP_UPNS" 2>/dev/null
    ip link del "$SP_VETH_H" 2>/dev/null
    rm -f "$state/world"
    return 0
}

# in the sandbox named $1: run the rest
sb() { local n=$1; shift; ip netns exec "$n" "$@"; }

# The shared sandbox of the suites: team alpha, secrets API_TOKEN (any header, plain HTTP
# too, for api.example.test) and GH (Authorization: Bearer {}, plain HTTP too, for
# tls.example.test) bound. (The attack suite's tests/attack/egress makes secrets with the
# defaults: Authorization only, HTTPS only.)
SP_VAL_API=alpha-real-api-token-0001
SP_VAL_GH=alpha-real-gh-token-0002
SP_VAL_BETA=beta-real-token-0003

sp_world_populate() {
    local state=$1 build=$2 reply cli="$build/cli/sandfleet"
    printf '%s\n' "$SP_VAL_API" | "$cli" secrets create --team alpha --name API_TOKEN \
        --allowed-host api.example.test --any-header --allow-http >/dev/null || return 1
    printf '%s' "$SP_VAL_GH" | "$cli" secrets create --team alpha --name GH \
        --allowed-host tls.example.test --header Authorization --format 'Bearer {}' \
        --allow-http >/dev/null || return 1
    printf '%s\n' "$SP_VAL_BETA" | "$cli" secrets create --team beta --name BETA_TOKEN \
        --allowed-host api.example.test --any-header --allow-http >/dev/null || return 1
    sp_netns_new "$state" "sfsb-$SP_SFX" || return 1
    reply=$(sp_register "$state" "sfsb-$SP_SFX" sb-main alpha \
        ",\"allow_out\":[\"api.example.test\",\"other.test\",\"tls.example.test\",\"$SP_API\"],\"secrets\":{\"API_KEY\":\"API_TOKEN\",\"GH_TOKEN\":\"GH\"}") ||
        { echo "register failed: $reply"; return 1; }
    cat >>"$state/world" <<W
SP_NS=sfsb-$SP_SFX
PH_API=$(printf '%s' "$reply" | grep -o '"API_KEY":"[^"]*"' | cut -d'"' -f4)
PH_GH=$(printf '%s' "$reply" | grep -o '"GH_TOKEN":"[^"]*"' | cut -d'"' -f4)
W
}
