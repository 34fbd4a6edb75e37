#!/usr/bin/env bash
# tests/layering/mutual.sh [options] OBJ|DIR...: the file-to-file dependencies among the
# object files named (an argument may list several, separated by ';', as CMake's
# $<TARGET_OBJECTS:target> gives them) or found under DIR (recursively; a build folder may
# hold stale objects of deleted files: prefer TARGET_OBJECTS), from `nm`: file A depends on
# file B when A uses a symbol B defines. Fails (exit 1, one line per offence) when
#   - two files depend on each other (a mutual pair), unless the pair is allowed, or
#   - a file named by --leaves depends on another --leaves file (leaves never call each
#     other: they call the layer below, and the layer above dispatches to them).
# Options:
#   --allow A:B     the mutual pair A <-> B is known and accepted (repeatable; file names
#                   without .c.o, e.g. --allow jobs:route)
#   --leaves a,b,c  files that must not depend on one another in either direction
#   --list          also print every dependency edge (A -> B)
# A file is named by its object's base name without .c.o/.o (http/http1.c.o -> http1); two
# objects of one name under DIR are one file. Static symbols are not seen: a file's own
# helpers never count. Exit 2 on bad usage or when no object is found.
set -uo pipefail
allow=() leaves="" list=0 dirs=()
while [ $# -gt 0 ]; do
    case $1 in
    --allow) allow+=("$2"); shift 2 ;;
    --leaves) leaves=$2; shift 2 ;;
    --list) list=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "mutual.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) IFS=';' read -r -a more <<<"$1"; dirs+=("${more[@]}"); shift ;;
    esac
done
[ ${#dirs[@]} -gt 0 ] || { echo "mutual.sh: name object files or a folder of them (see --help)" >&2; exit 2; }
mapfile -t objs < <(find "${dirs[@]}" -name '*.o' -type f | sort)
[ ${#objs[@]} -gt 0 ] || { echo "mutual.sh: no object files under ${dirs[*]}; build first" >&2; exit 2; }

tab=$(mktemp) || exit 2
trap 'rm -f "$tab"' EXIT
for o in "${objs[@]}"; do
    f=$(basename "$o"); f=${f%.o}; f=${f%.c}
    nm --defined-only -g "$o" 2>/dev/null | awk -v f="$f" 'NF>=3{print "D", f, $3}'
    nm -u "$o" 2>/dev/null | awk -v f="$f" '{print "U", f, $NF}'
done >"$tab"

awk -v allow="$(IFS=,; echo "${allow[*]:-}")" -v leaves="$leaves" -v list="$list" '
$1=="D" { def[$3]=$2; next }
$1=="U" { use[NR]=$2; sym[NR]=$3 }
END {
    n=split(allow, al, ","); for (i=1;i<=n;i++) { split(al[i], p, ":"); ok[p[1]":"p[2]]=1; ok[p[2]":"p[1]]=1 }
    n=split(leaves, lv, ","); for (i=1;i<=n;i++) leaf[lv[i]]=1
    for (i in use) { b=def[sym[i]]; a=use[i]
        if (b=="" || b==a) continue
        if (!((a":"b) in why)) why[a":"b]=sym[i]; edge[a":"b]=1 }
    bad=0; pairs=0
    for (e in edge) { split(e, p, ":"); a=p[1]; b=p[2]
        if (list) printf "edge %s -> %s (%s)\n", a, b, why[e]
        if ((b":"a) in edge && a<b) { pairs++
            if ((a":"b) in ok) printf "allowed mutual %s <-> %s (%s; %s)\n", a, b, why[a":"b], why[b":"a]
            else { printf "MUTUAL %s <-> %s: %s uses %s, %s uses %s\n", a, b, a, why[a":"b], b, why[b":"a]; bad=1 } }
        if ((a in leaf) && (b in leaf)) { printf "LEAF %s -> %s: leaves never call each other (%s)\n", a, b, why[e]; bad=1 } }
    printf "%d dependency edges, %d mutual pairs\n", length(edge), pairs > "/dev/stderr"
    exit bad
}' "$tab"
