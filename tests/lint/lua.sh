#!/bin/bash
# tests/lint/lua.sh SRC_DIR BUILT_DIR STORE_C: every Lua script of the store parses as
# Redis's Lua 5.1 (luac5.1 -p, Debian's lua5.1): the files in state/lua/ and lib/, and each
# script as Redis runs it (<build>/state/lua/: lib/ spliced in). It also fails a script that
# sets a global (Redis refuses that at run time) or reads one Redis does not provide (a
# typo), and a script file that state/sf_store.c does not load (or the other way round).
set -u
shopt -s nullglob
src=$1 built=$2 store=$3
command -v luac5.1 >/dev/null ||
    { echo "luac5.1 is missing: install Debian's lua5.1 (ops/lib.sh lists it)"; exit 1; }
allowed=" ARGV KEYS redis cjson cmsgpack bit struct string table math tonumber tostring"
allowed+=" ipairs pairs unpack type next select pcall error assert rawget rawset setmetatable"
allowed+=" getmetatable "
fail=0 n=0
for f in "$src"/*.lua "$src"/lib/*.lua "$built"/*.lua; do
    n=$((n + 1))
    if ! out=$(luac5.1 -p -l "$f" 2>&1); then
        echo "$f: does not parse as Lua 5.1: $out"; fail=1; continue
    fi
    # the sources use what lib/ defines: the globals are checked on the scripts as run
    [ "${f#"$built"/}" = "$f" ] && continue
    while read -r op name; do
        if [ "$op" = SETGLOBAL ]; then
            echo "$f: sets the global '$name' (Redis refuses it; make it local)"; fail=1
        elif [[ "$allowed" != *" $name "* ]]; then
            echo "$f: reads the global '$name', which Redis's Lua does not have"; fail=1
        fi
    done < <(grep -o '[GS]ETGLOBAL.*' <<<"$out" | awk '{print $1, $NF}' | sort -u)
done
for f in "$src"/*.lua; do
    name=$(basename "$f" .lua)
    grep -q "^S($name);" "$store" || { echo "$f: state/sf_store.c does not load it (S($name);)"; fail=1; }
done
for name in $(sed -n 's/^S(\([a-z_0-9]*\));$/\1/p' "$store"); do
    [ -f "$src/$name.lua" ] || { echo "state/sf_store.c loads $name, but there is no $src/$name.lua"; fail=1; }
done
[ "$n" -gt 40 ] || { echo "only $n scripts found under $src and $built"; fail=1; }
[ $fail = 0 ] && echo "ok: $n Lua files parse as Lua 5.1 and use only Redis's globals"
exit $fail
