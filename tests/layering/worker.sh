#!/usr/bin/env bash
# tests/layering/worker.sh SRC TARGET=OBJ:OBJ... ...: the worker's layers hold (issue 21).
# The targets are wkdriver, wkjail, wkqemu, wktemplates and sandfleet-worker, each with its
# object files (tests/layering/CMakeLists.txt passes them: $<TARGET_OBJECTS:...>).
#   1. No file of a driver folder (worker/jail/, worker/qemu/) includes a header of the
#      other driver, of worker/templates/ or of the daemon (worker/*.h), and worker/driver/
#      includes neither driver nor the daemon: checked on the sources.
#   2. No object of a driver library uses a symbol that the other driver, the templates
#      library or the daemon defines; the driver library uses none of theirs: checked with
#      nm on the built objects (the link would refuse most of it already; this names it).
#   3. No two of the daemon's objects depend on each other (A uses a symbol B defines and B
#      one A defines): the handler files and the call module form layers, not a knot
#      (tests/layering/mutual.sh, the check the gateway and the scheduler use).
# Exit 0 when all hold; otherwise each failure on its own line, exit 1.
set -u
src=${1:?usage: worker.sh SRC TARGET=OBJ:OBJ... ...}
shift
declare -A OBJS
for a in "$@"; do OBJS[${a%%=*}]=${a#*=}; done
w=$src/worker
fail=0
bad() { echo "layering: $*"; fail=1; }

# ---- 1. includes ----
hdrs() { (cd "$1" && ls *.h 2>/dev/null); }
check_includes() { # folder, then the folders whose headers it must not name
    local dir=$1 f h o; shift
    for o in "$@"; do
        for h in $(hdrs "$o"); do
            for f in "$dir"/*.c "$dir"/*.h; do
                [ -e "$f" ] || continue
                grep -q "^#include \"$h\"" "$f" && bad "${f#$src/} includes $h (${o#$src/}/)"
            done
        done
    done
}
check_includes "$w/jail" "$w/qemu" "$w/templates" "$w"
check_includes "$w/qemu" "$w/jail" "$w/templates" "$w"
check_includes "$w/driver" "$w/jail" "$w/qemu" "$w/templates" "$w"

# ---- 2 and 3. symbols ----
objs() { local o=${OBJS[$1]:-}; [ -n "$o" ] && tr ':' '\n' <<<"$o" | sort; }
defs() { nm --defined-only "$@" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBRVW]/ {print $3}' | sort -u; }
undefs() { nm --undefined-only "$@" 2>/dev/null | awk '{print $NF}' | sort -u; }
for t in wkdriver wkjail wkqemu wktemplates sandfleet-worker; do
    [ -n "$(objs $t)" ] || { bad "no objects given for $t"; }
done
[ $fail -eq 0 ] || exit 1
forbid() { # library, then the targets whose symbols it must not use
    local lib=$1 t s; shift
    local u; u=$(undefs $(objs "$lib"))
    for t in "$@"; do
        for s in $(comm -12 <(echo "$u") <(defs $(objs "$t"))); do
            bad "$lib uses $s, defined by $t"
        done
    done
}
forbid wkdriver wkjail wkqemu wktemplates sandfleet-worker
forbid wkjail wkqemu wktemplates sandfleet-worker
forbid wkqemu wkjail wktemplates sandfleet-worker
forbid wktemplates wkjail wkqemu sandfleet-worker

# 3. the daemon's mutual pairs: the one generic check, mutual.sh (as for the gateway and
# the scheduler).
mapfile -t d < <(objs sandfleet-worker)
"$src/tests/layering/mutual.sh" "${d[@]}" || bad "the daemon's files depend on each other (above)"
[ $fail -eq 0 ] && echo "layering: worker ok (${#d[@]} daemon objects, no mutual pair)"
exit $fail
