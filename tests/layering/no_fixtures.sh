#!/usr/bin/env bash
# tests/layering/no_fixtures.sh PRODUCT TEST_BINARY: fails when the product binary holds a
# conformance fixture: a symbol whose name contains "fixture" (nm, local symbols too), or a
# fixture tool's name (test_simple_text ...) anywhere in its bytes. The same probes must find
# them in TEST_BINARY, so that the check is known to see what it looks for.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: no_fixtures.sh PRODUCT TEST_BINARY" >&2; exit 2; }
product=$1 test=$2
probe() { # probe BINARY: prints what it finds
    nm "$1" 2>/dev/null | awk '{print $NF}' | grep -i fixture
    grep -a -o -E 'test_(simple_text|image_content|tool_with_progress)' "$1" | sort -u
}
for b in "$product" "$test"; do
    [ -f "$b" ] || { echo "no_fixtures.sh: $b does not exist; build first" >&2; exit 2; }
done
found=$(probe "$product")
if [ -n "$found" ]; then
    echo "the product $product contains conformance fixtures (test code):"
    echo "$found" | head -20
    exit 1
fi
if [ -z "$(probe "$test")" ]; then
    echo "the probe finds no fixture in the test binary $test either: it no longer sees them"
    exit 1
fi
echo "no fixture in $product (the test binary has them)"
