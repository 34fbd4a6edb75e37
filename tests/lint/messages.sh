#!/bin/bash
# tests/lint/messages.sh ROOT: every user-facing sentence is written once. A string literal
# that reads like a sentence (24+ characters and 4+ words once adjacent literals are joined;
# log lines "msg=\"...\"" are not sentences) may appear in only one place in the product's
# C sources; a sentence needed in two places goes into common/sf_msg.h (docs/internals/
# messages.md). tests/lint/messages.allow lists the few repeated literals that are not
# sentences for a user (one literal per line, as written in the source). Fails listing each
# repeated sentence and where it is.
set -u
root=${1:?usage: messages.sh ROOT}
cd "$root" || exit 1
allow=tests/lint/messages.allow
[ -f "$allow" ] || { echo "$allow is missing"; exit 1; }
files=$(find cli common gateway scheduler secret-proxy state worker -name '*.[ch]' \
             ! -path common/sf_msg.h | sort)
[ "$(wc -l <<<"$files")" -gt 100 ] || { echo "few C files under $root: wrong ROOT?"; exit 1; }
# shellcheck disable=SC2086
perl -e '
    my $allow = shift @ARGV;
    my %ok;
    open(my $fh, "<", $allow) or die "$allow: $!";
    while (<$fh>) { chomp; $ok{$1} = 1 if /^"(.*)"$/; }
    my (%seen, $n);
    for my $f (@ARGV) {
        open(my $h, "<", $f) or die "$f: $!";
        local $/; my $s = <$h>; $n++;
        # blank out comments and character literals, keeping line numbers
        $s =~ s{/\*.*?\*/|//[^\n]*|\x27(?:[^\x27\\\n]|\\.)*\x27|("(?:[^"\\\n]|\\.)*")}
               { defined $1 ? $1 : do { my $c = $&; $c =~ s/[^\n]//g; $c } }gse;
        while ($s =~ /((?:"(?:[^"\\\n]|\\.)*"\s*)+)/g) {
            my ($lits, $at) = ($1, $-[1]);
            my $text = join "", $lits =~ /"((?:[^"\\\n]|\\.)*)"/g;
            next if length($text) < 24 || ($text =~ tr/ //) < 3 || $text =~ /msg=\\"/;
            my @words = $text =~ /[A-Za-z]{2,}/g;
            next if @words < 4;
            next if $ok{$text};
            my $line = 1 + (substr($s, 0, $at) =~ tr/\n//);
            push @{$seen{$text}}, "$f:$line";
        }
    }
    my $bad = 0;
    for my $t (sort { scalar(@{$seen{$b}}) <=> scalar(@{$seen{$a}}) || $a cmp $b } keys %seen) {
        my @at = @{$seen{$t}};
        next if @at < 2;
        print "written ", scalar(@at), " times: \"$t\"\n", map({ "    $_\n" } @at);
        $bad++;
    }
    if ($bad) {
        print "$bad sentences are written more than once: put each in common/sf_msg.h ",
              "(docs/internals/messages.md), or list a literal that is not a sentence ",
              "in '"$allow"'\n";
        exit 1;
    }
    print "ok: no sentence is written twice in the $n C files\n";
' "$allow" $files
