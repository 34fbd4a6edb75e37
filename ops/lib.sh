# ops/lib.sh: shared by ops/run, ops/test and the test stack. Source it; do not run it.
# Everything here is idempotent and quiet when there is nothing to do.

SF_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian packages the build, the stack and the tests need.
SF_PACKAGES="cmake pkg-config gcc make librdkafka-dev libhiredis-dev libmsgpack-dev
libnghttp2-dev libevent-dev libjansson-dev node-llhttp libseccomp-dev libcmocka-dev
libsodium-dev libssl-dev libcurl4-openssl-dev redis-server redis-tools busybox-static
iproute2 curl procps util-linux nghttp2-client openssl e2fsprogs lxcfs"
# the secret-proxy: nftables in each sandbox's namespace
SF_PACKAGES="$SF_PACKAGES nftables"
# tests/bench/proxy's reference relays: io_uring, and the kernel (sockmap) relay
SF_PACKAGES="$SF_PACKAGES liburing-dev clang libbpf-dev"
# the engines label (ops/dev-cluster): Java 17 for Apache Kafka, and Maven to fetch its jars
SF_PACKAGES="$SF_PACKAGES openjdk-17-jre-headless maven"
# the file tools: ZIPs of sandbox directories
SF_PACKAGES="$SF_PACKAGES libzip-dev"
# the qemu driver: QEMU, qemu-img, and what worker/vm/build-guest uses
SF_PACKAGES="$SF_PACKAGES qemu-system-x86 qemu-utils kmod cpio"
# the OAuth sign-in page's browser test (tests/e2e/signin_browser.test.mjs)
SF_PACKAGES="$SF_PACKAGES chromium"
# the built-in 'debian' template (worker/tpl/build-debian)
SF_PACKAGES="$SF_PACKAGES debootstrap"
# the test suite's check of the store's Lua scripts (luac5.1: tests/lint/lua.sh)
SF_PACKAGES="$SF_PACKAGES lua5.1"
# the hosted MCP servers' test: pip downloads the MCP Python SDK's wheels (sf_hosted_wheels)
SF_PACKAGES="$SF_PACKAGES python3-pip"

sf_log() { printf '\033[1m[sandfleet]\033[0m %s\n' "$*" >&2; }
sf_die() { printf '\033[1;31m[sandfleet]\033[0m %s\n' "$*" >&2; exit 1; }

sf_install() {
    local missing=() p
    for p in $SF_PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$p")
    done
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        missing+=(nodejs npm)
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        [ "$(id -u)" = 0 ] || sf_die "run as root: packages to install: ${missing[*]}"
        sf_log "installing: ${missing[*]}"
        # Another install (a second checkout's ops/test) may hold the dpkg lock: wait for it.
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null ||
            sf_die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends "${missing[@]}" >/dev/null ||
            sf_die "apt-get install failed: ${missing[*]}"
    fi
}

# sf_build DIR [cmake args...]: configure once, then an incremental build.
sf_build() {
    local dir=$1; shift
    if [ ! -f "$dir/CMakeCache.txt" ]; then
        cmake -S "$SF_ROOT" -B "$dir" "$@" >/dev/null || sf_die "cmake configure failed"
    fi
    cmake --build "$dir" -j"$(nproc)" -- --no-print-directory >"$dir.log" 2>&1 ||
        { tail -40 "$dir.log" >&2; sf_die "build failed (full log: $dir.log)"; }
}

# sf_hosted_wheels: the wheels of tests/e2e/hosted/requirements.txt (the official MCP Python
# SDK, pinned) in .test-cache/hosted-wheels, downloaded from PyPI once per lock file for the
# 'debian' template's CPython 3.11 (tests/e2e/hosted.test.mjs uploads them with its server).
sf_hosted_wheels() {
    local req="$SF_ROOT/tests/e2e/hosted/requirements.txt" dir="$SF_ROOT/.test-cache/hosted-wheels"
    [ -f "$dir/.sf-lock" ] && cmp -s "$req" "$dir/.sf-lock" && return 0
    sf_log "downloading the MCP Python SDK's wheels (pip download)"
    rm -rf "$dir" && mkdir -p "$dir" || sf_die "cannot make $dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        -r "$req" -d "$dir" >&2 || sf_die "pip download of $req failed (is PyPI reachable?)"
    cp "$req" "$dir/.sf-lock"
}

sf_wait() { # sf_wait SECONDS WHAT CMD...: polls CMD every 50 ms
    local secs=$1 what=$2 i; shift 2
    for ((i = 0; i < secs * 20; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    sf_log "timed out waiting for $what"
    return 1
}

sf_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $((20000 + RANDOM % 20000))
}

# A free port p <= 55535 whose p+10000 is free too: Redis Cluster's bus listens there (and
# refuses to start on a port above 55535).
sf_free_port_cluster() {
    python3 -c '
import random, socket
for _ in range(500):
    p = random.randint(20000, 55535)
    try:
        a, b = socket.socket(), socket.socket()
        a.bind(("127.0.0.1", p)); b.bind(("127.0.0.1", p + 10000))
    except OSError:
        continue
    print(p); break
else:
    raise SystemExit(1)' 2>/dev/null || echo $((20000 + RANDOM % 20000))
}

# A process's start time (clock ticks since boot): with its pid, it names the process even
# after the pid is reused.
sf_starttime() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null; }

# sf_spawn STATE NAME CMD...: starts CMD in the background, logs to STATE/logs/NAME.log;
# STATE/pids/NAME holds its pid and NAME.start its start time, so a later `ops/run stop`
# (or a new ops/run) finds and stops it even when the shell that started it is gone.
sf_spawn() {
    local state=$1 name=$2; shift 2
    mkdir -p "$state/logs" "$state/pids"
    "$@" >>"$state/logs/$name.log" 2>&1 9>&- & # fd 9 is ops/run's lock: not for children
    echo $! >"$state/pids/$name"
    sf_starttime $! >"$state/pids/$name.start"
}

# sf_alive STATE NAME: the process STATE/pids/NAME names still runs (same start time).
sf_alive() {
    local f=$1/pids/$2 pid
    [ -f "$f" ] || return 1
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null || return 1
    [ ! -s "$f.start" ] || [ "$(sf_starttime "$pid")" = "$(cat "$f.start")" ]
}

# sf_stop_one STATE NAME [SECS]: TERM, up to SECS (default 10) for it to end, then KILL.
sf_stop_one() {
    local state=$1 name=$2 secs=${3:-10} pid i
    if sf_alive "$state" "$name"; then
        pid=$(cat "$state/pids/$name")
        kill -TERM "$pid" 2>/dev/null
        for ((i = 0; i < secs * 20; i++)); do sf_alive "$state" "$name" || break; sleep 0.05; done
        sf_alive "$state" "$name" && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$state/pids/$name" "$state/pids/$name.start"
}

# sf_daemon_env STATE BUILD: the settings the daemons share beside Kafka and Redis.
sf_daemon_env() {
    local state=$1 build=$2
    export SF_AUTH_SECRET_FILE="$state/auth.key"
    export SF_SCHEMAS_DIR="$SF_ROOT/schemas/tools"
    # the client ID metadata documents of well-known clients (sign-in without internet)
    export SF_OAUTH_CIMD_DIR=${SF_OAUTH_CIMD_DIR-$SF_ROOT/gateway/cimd}
    export SF_STATE_DIR="$state/worker"
    export SF_AGENT_PATH="$build/worker/agent/sandfleet-agent"
    export SF_HOST_ID=${SF_HOST_ID:-host-$(hostname | tr -c 'a-z0-9\n' '-' | cut -c1-40)}
    # the secret-proxy and the CLI (secrets); the proxy's control socket for the worker
    export SF_SECRETS_KEY_FILE=${SF_SECRETS_KEY_FILE:-$state/secrets.key}
    export SF_PROXY_CONTROL_SOCKET=$state/proxy.sock
    export SF_PROXY_CA_CERT_FILE=$state/egress-ca.pem SF_PROXY_CA_KEY_FILE=$state/egress-ca.key
}

# sf_dev_cert DIR: a self-signed certificate for localhost / 127.0.0.1 (made once) for the
# gateway's TLS; exports SF_TLS_CERT_FILE and SF_TLS_KEY_FILE.
sf_dev_cert() {
    local dir=$1
    mkdir -p "$dir"
    if [ ! -s "$dir/cert.pem" ] || [ ! -s "$dir/key.pem" ]; then
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
            -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1" \
            -keyout "$dir/key.pem" -out "$dir/cert.pem" >/dev/null 2>&1 ||
            { sf_log "could not make a dev certificate in $dir"; return 1; }
        chmod 600 "$dir/key.pem"
    fi
    export SF_TLS_CERT_FILE="$dir/cert.pem" SF_TLS_KEY_FILE="$dir/key.pem"
}

# sf_redis_cli ARGS...: redis-cli on SF_REDIS_URL, following redirects; with several seeds
# (a Redis Cluster) the first that can be reached (a lost node is skipped).
sf_redis_cli() {
    local seeds s
    case ${SF_REDIS_URL:-} in
    redis://*,*) ;;
    *) redis-cli -c -u "${SF_REDIS_URL:-}" "$@"; return ;;
    esac
    seeds=${SF_REDIS_URL#redis://}
    for s in ${seeds//,/ }; do
        redis-cli -c -u "redis://$s" "$@" 2>/dev/null && return 0
    done
    return 1
}

sf_wait_worker() {
    # The qemu driver builds its guest and template snapshot on its first start (about a
    # minute under TCG; cached in /var/cache/sandfleet/vm after that).
    local secs=20
    if [ "${SF_DRIVER:-jail}" = qemu ]; then
        secs=900
        sf_log "worker on the qemu driver: the first start builds the microVM template (about a minute)"
    fi
    local i
    for ((i = 0; i < secs * 20; i++)); do
        sf_redis_cli zscore sf:hosts "$SF_HOST_ID" 2>/dev/null | grep -q . && return 0
        if [ -n "${state:-}" ] && ! sf_alive "$state" worker; then
            sf_log "the worker exited while starting; see $state/logs/worker.log"
            return 1
        fi
        sleep 0.05
    done
    sf_log "timed out waiting for the worker's heartbeat"
    return 1
}

# sf_spawn_daemon STATE BUILD NAME: starts one daemon of the stack (redis, kafka,
# secret-proxy, scheduler, worker, gateway) with the settings sf_stack_start exported, as
# sf_stack_start does and as ops/run does again when one exits (the same Redis port and
# Kafka addresses, so the others find it by themselves).
sf_spawn_daemon() {
    local state=$1 build=$2 name=$3
    case $name in
    redis)
        # ops/run keeps Redis on disk (append-only file: API keys and sandboxes survive
        # restarts); the test stacks are throwaway.
        local persist=no cluster=()
        [ "${SF_REDIS_PERSIST:-0}" = 1 ] && persist=yes
        # Bounded: at maxmemory Redis refuses writes that would grow it (noeviction: it
        # never drops a key) and sandfleet answers "the platform is full".
        # SF_REDIS_CLUSTER=1: a one-node Redis Cluster owning every slot, which refuses any
        # command or script whose keys span hash slots (the cluster suite, tests/cluster).
        [ "${SF_REDIS_CLUSTER:-0}" = 1 ] && cluster=(--cluster-enabled yes --cluster-config-file nodes.conf)
        sf_spawn "$state" redis redis-server --bind 127.0.0.1 --port "$(cat "$state/redis/port")" \
            --dir "$state/redis" --save '' --appendonly "$persist" --appendfsync everysec \
            --protected-mode yes --maxmemory "${SF_REDIS_MAXMEMORY:-1gb}" \
            --maxmemory-policy noeviction "${cluster[@]}" ;;
    kafka)
        # kafka.ports keeps the addresses: a restarted broker listens on them again, so the
        # daemons find it by themselves.
        rm -f "$state/kafka.bootstrap"
        sf_spawn "$state" kafka "$build/ops/sandfleet-kafka" --bootstrap-file "$state/kafka.bootstrap" \
            --ports-file "$state/kafka.ports" ;;
    secret-proxy | scheduler | worker | gateway)
        sf_spawn "$state" "$name" "$build/$name/sandfleet-$name" ;;
    *) sf_log "sf_spawn_daemon: no daemon named $name"; return 1 ;;
    esac
}

# sf_stack_start STATE BUILD GW_PORT: Redis, the embedded broker (unless SF_REDIS_URL /
# SF_KAFKA_BROKERS point elsewhere), scheduler, one worker, gateway. Writes STATE/env.
sf_stack_start() {
    local state=$1 build=$2 gw_port=$3 redis_port kafka
    mkdir -p "$state/redis" "$state/worker"
    if [ -z "${SF_REDIS_URL:-}" ]; then
        local pick=sf_free_port
        [ "${SF_REDIS_CLUSTER:-0}" = 1 ] && pick=sf_free_port_cluster
        redis_port=${SF_REDIS_PORT:-$(cat "$state/redis/port" 2>/dev/null || $pick)}
        echo "$redis_port" >"$state/redis/port"
        sf_spawn_daemon "$state" "$build" redis
        export SF_REDIS_URL="redis://127.0.0.1:$redis_port"
        sf_wait 10 redis redis-cli -p "$redis_port" ping || return 1
        if [ "${SF_REDIS_CLUSTER:-0}" = 1 ]; then
            redis-cli -p "$redis_port" cluster addslotsrange 0 16383 >/dev/null || return 1
            sf_wait 10 "the Redis cluster" sh -c "redis-cli -p $redis_port cluster info | grep -q cluster_state:ok"
        fi
    fi
    if [ -z "${SF_KAFKA_BROKERS:-}" ]; then
        sf_spawn_daemon "$state" "$build" kafka
        sf_wait 10 "the embedded Kafka broker" test -s "$state/kafka.bootstrap" || return 1
        SF_KAFKA_BROKERS=$(cat "$state/kafka.bootstrap")
        export SF_KAFKA_BROKERS
    fi
    export SF_PORT=$gw_port
    # preview URLs (issue 22): {port}-{sandbox}.preview.localhost on the gateway's port;
    # the worker builds them, the gateway recognises them
    export SF_PREVIEW_DOMAIN=${SF_PREVIEW_DOMAIN:-preview.localhost:$gw_port}
    export SF_PREVIEW_SCHEME=${SF_PREVIEW_SCHEME:-http}
    sf_daemon_env "$state" "$build"
    sf_spawn_daemon "$state" "$build" secret-proxy
    sf_wait 10 "the secret-proxy" test -S "$SF_PROXY_CONTROL_SOCKET" || return 1
    sf_spawn_daemon "$state" "$build" scheduler
    sf_spawn_daemon "$state" "$build" worker
    sf_spawn_daemon "$state" "$build" gateway
    sf_wait 20 "the gateway" curl -sf "http://127.0.0.1:$gw_port/readyz" || return 1
    sf_wait_worker || return 1
    cat >"$state/env" <<ENV
SF_URL=http://127.0.0.1:$gw_port/mcp
SF_REDIS_URL=$SF_REDIS_URL
SF_KAFKA_BROKERS=$SF_KAFKA_BROKERS
SF_AUTH_SECRET_FILE=$SF_AUTH_SECRET_FILE
SF_SECRETS_KEY_FILE=$SF_SECRETS_KEY_FILE
SF_PROXY_CONTROL_SOCKET=$SF_PROXY_CONTROL_SOCKET
SF_BUILD=$build
SF_STATE=$state
SF_DRIVER=${SF_DRIVER:-jail}
SF_VM_DIR=${SF_VM_DIR:-}
SF_PREVIEW_DOMAIN=$SF_PREVIEW_DOMAIN
SF_PREVIEW_SCHEME=$SF_PREVIEW_SCHEME
ENV
}

# sf_stack_ready URL KEY: one MCP call through the whole pipeline (scheduler joined).
sf_stack_ready() {
    curl -sf -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' \
        -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_list","arguments":{}}}' \
        "$1" | grep -q '"sandboxes"'
}

# sf_stack_stop STATE: every daemon STATE/pids names (the workers, gateways and schedulers
# first, in parallel: each may drain for a few seconds), then Kafka and Redis. Works from the
# pid files alone, so it also stops a stack whose ops/run was killed.
sf_stack_stop() {
    local state=$1 f name last=() stoppers=()
    [ -d "$state/pids" ] || return 0
    for f in "$state"/pids/*; do
        [ -f "$f" ] || continue
        name=${f##*/}
        case $name in *.start) continue ;; kafka | redis) last+=("$name"); continue ;; esac
        sf_stop_one "$state" "$name" 15 &
        stoppers+=($!)
    done
    [ ${#stoppers[@]} -eq 0 ] || wait "${stoppers[@]}"
    for name in "${last[@]}"; do sf_stop_one "$state" "$name" 10; done
}

# sf_drain_worker STATE BUILD HOST: the worker of HOST (pid file STATE/pids/worker or
# worker-HOST) kills its sandboxes (`sandfleet hosts drain HOST --wait`) before a stop that
# must leave nothing behind: a plain stop keeps them for the next worker
# (docs/internals/restart.md). Needs SF_REDIS_URL; quiet; never fails the caller; 10 s at most.
sf_drain_worker() {
    local state=$1 build=$2 host=$3
    [ -n "$host" ] || return 0
    sf_alive "$state" worker || sf_alive "$state" "worker-$host" || return 0
    # (at most 10 s: teardowns that stop themselves half-way, the attack profile's, never
    # end; the worker's stop then waits for them as before, and sf_kill_kept is the rest)
    timeout 10 "$build/cli/sandfleet" hosts drain "$host" --wait >/dev/null 2>&1 ||
        sf_log "host $host did not drain within 10 s before its stop"
}

# sf_kill_kept STATE: after the stack's workers stopped, the sandboxes they left running for
# a next worker (and their lxcfs) end too, with their cgroups: for test stacks, whose state
# folder no worker starts on again. Only processes whose pid and start time match what
# the worker recorded (STATE/worker*/adopt/<id>/handle, lxcfs.pid) are killed.
sf_kill_kept() {
    local state=$1 h id v pid start rest d
    for h in "$state"/worker*/adopt/*/handle; do
        [ -f "$h" ] || continue
        id=${h%/handle}
        id=${id##*/}
        read -r v pid start rest <"$h" || continue
        [ "$v" = v1 ] && [ "$(sf_starttime "$pid")" = "$start" ] && kill -KILL "$pid" 2>/dev/null
        for ((i = 0; i < 100; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.02; done
        # (a qemu handle's 4th word: the VM's folder, which names its cgroup, without a dot)
        d=${rest%% *}
        [[ $d =~ ^[0-9]+$ ]] || id=${d#.}
        for d in /sys/fs/cgroup/sandfleet/*/"$id" /sys/fs/cgroup/*/sandfleet/*/"$id"; do
            [ -d "$d" ] || continue
            rmdir "$d"/box "$d"/agent 2>/dev/null
            rmdir "$d" 2>/dev/null
        done
    done
    for h in "$state"/worker*/lxcfs.pid; do
        [ -f "$h" ] || continue
        pid=$(cat "$h")
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = lxcfs ] && kill -KILL "$pid" 2>/dev/null
    done
    return 0
}

# sf_stack_running STATE: some daemon of the stack in STATE still runs.
sf_stack_running() {
    local f
    for f in "$1"/pids/*; do
        [ -f "$f" ] && [ "${f%.start}" = "$f" ] && sf_alive "$1" "${f##*/}" && return 0
    done
    return 1
}
