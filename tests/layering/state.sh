#!/bin/bash
# tests/layering/state.sh ROOT: common/ is infrastructure only. No file in common/ names a
# Redis key or a Lua script: every key name (SF_RK_*, the gateways' channel SF_CH_*, any
# "sf:..." string) and every script (redis.call, sf_store_*) belongs to state/. Fails with
# each offending line.
set -u
root=${1:?usage: state.sh ROOT}
cd "$root" || exit 1
# code only: a comment may say where things live
hits=$(for f in common/*.c common/*.h common/*/*.c common/*/*.h; do
    [ -f "$f" ] || continue
    # drop /* ... */ comments (also across lines) and // comments, keep line numbers
    perl -0777 -pe 's{/\*.*?\*/}{ my $c = $&; $c =~ s/[^\n]//g; $c }gse; s{//[^\n]*}{}g' "$f" |
        grep -nE 'SF_RK_|SF_CH_|"sf:|redis\.call|sf_store_|#include "sf_(store|records|timers|snapshots|secrets|netlog|claim|templates|apikeys)\.h"' |
        sed "s|^|$f:|"
done)
if [ -n "$hits" ]; then
    echo "common/ names Redis keys or scripts; move this to state/ (state/README.md):"
    echo "$hits"
    exit 1
fi
n=$(ls common/*.c common/*.h | wc -l)
[ "$n" -gt 10 ] || { echo "only $n files in $root/common: wrong ROOT?"; exit 1; }
echo "ok: none of common/'s $n files names a Redis key or script"
