/* toml.c: set one table's string keys in a TOML text (see toml.h). */
#include "toml.h"
#include "sf_buf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define NAME_MAX_LEN 256
#define TEXT_MAX (16u << 20)

typedef struct scan {
    int ml;    /* inside a multi-line string: its quote, '"' or '\'' */
    int depth; /* [ and { nesting inside a value */
} scan;

/* Updates the scanner over one line of a value (or its continuation). 0 or -EINVAL. */
static int scan_value(scan *s, const char *p, size_t n)
{
    size_t i = 0;

    while (i < n) {
        char c = p[i];

        if (s->ml) {
            if (s->ml == '"' && c == '\\') {
                i += 2;
                continue;
            }
            if (c == s->ml && i + 2 < n && p[i + 1] == c && p[i + 2] == c) {
                s->ml = 0;
                i += 3;
                while (i < n && p[i] == c) /* up to two quotes may end the content */
                    i++;
                continue;
            }
            i++;
            continue;
        }
        if (c == '#')
            return 0;
        if (c == '"' || c == '\'') {
            if (i + 2 < n && p[i + 1] == c && p[i + 2] == c) {
                s->ml = c;
                i += 3;
                continue;
            }
            for (i++; i < n && p[i] != c; i++)
                if (c == '"' && p[i] == '\\')
                    i++;
            if (i >= n)
                return -EINVAL;
            i++;
            continue;
        }
        if (c == '[' || c == '{')
            s->depth++;
        else if ((c == ']' || c == '}') && --s->depth < 0)
            return -EINVAL;
        i++;
    }
    return 0;
}

/* A dotted key or table name, normalized: parts trimmed, quotes taken off, joined by '.'.
 * Stops at `stop` outside quotes. Returns where it stopped (n if never). */
static size_t read_name(const char *p, size_t n, char stop, char out[NAME_MAX_LEN])
{
    size_t i = 0, o = 0;

    out[0] = '\0';
    while (i < n && p[i] != stop) {
        char c = p[i];
        if (c == ' ' || c == '\t') {
            i++;
        } else if (c == '"' || c == '\'') {
            for (i++; i < n && p[i] != c; i++) {
                if (c == '"' && p[i] == '\\' && i + 1 < n)
                    i++;
                if (o + 1 < NAME_MAX_LEN)
                    out[o++] = p[i];
            }
            i++;
        } else {
            if (o + 1 < NAME_MAX_LEN)
                out[o++] = c;
            i++;
        }
    }
    out[o] = '\0';
    return i;
}

static int is_or_under(const char *name, const char *table)
{
    size_t tl = strlen(table);
    return !strncmp(name, table, tl) && (name[tl] == '\0' || name[tl] == '.');
}

/* The first part of a dotted key. */
static void first_part(const char *key, char out[NAME_MAX_LEN])
{
    size_t n = strcspn(key, ".");
    snprintf(out, NAME_MAX_LEN, "%.*s", (int)n, key);
}

static int in_list(const char *s, const cli_toml_kv *kv, size_t nkv, const char *const *drop,
                   size_t ndrop)
{
    for (size_t i = 0; i < nkv; i++)
        if (!strcmp(s, kv[i].key))
            return 1;
    for (size_t i = 0; i < ndrop; i++)
        if (!strcmp(s, drop[i]))
            return 1;
    return 0;
}

static int append_table(sf_buf *b, const char *table, const cli_toml_kv *kv, size_t nkv)
{
    int rc = sf_buf_appendf(b, "[%s]\n", table);

    for (size_t i = 0; rc == 0 && i < nkv; i++) {
        rc = sf_buf_appendf(b, "%s = \"", kv[i].key);
        for (const char *v = kv[i].value; rc == 0 && *v; v++) {
            unsigned char c = (unsigned char)*v;
            if (c == '"' || c == '\\')
                rc = sf_buf_appendf(b, "\\%c", c);
            else if (c < 0x20 || c == 0x7f)
                rc = sf_buf_appendf(b, "\\u%04x", c);
            else
                rc = sf_buf_append(b, v, 1);
        }
        if (rc == 0)
            rc = sf_buf_append(b, "\"\n", 2);
    }
    return rc;
}

int cli_toml_set_table(const char *text, size_t len, const char *table, const cli_toml_kv *kv,
                       size_t nkv, const char *const *drop, size_t ndrop, char **out, char *why,
                       size_t whylen)
{
    char current[NAME_MAX_LEN] = "", name[NAME_MAX_LEN], full[2 * NAME_MAX_LEN + 2];
    scan s = {0, 0};
    sf_buf b;
    size_t i = 0, lineno = 0;
    int placed = 0, dropping = 0, rc = 0;
    enum { KEEP, OURS_MAIN, OURS_DROP } where = KEEP;

    why[0] = '\0';
    sf_buf_init(&b, TEXT_MAX);
    while (i < len && rc == 0) {
        const char *line = text + i, *nl = memchr(line, '\n', len - i);
        size_t n = nl ? (size_t)(nl - line) : len - i, next = nl ? n + 1 : n, k = 0;
        int keep = 1;

        lineno++;
        if (s.ml || s.depth > 0) { /* a value goes on: it goes where its key went */
            if ((rc = scan_value(&s, line, n)) < 0)
                break;
            keep = !dropping;
        } else {
            while (k < n && (line[k] == ' ' || line[k] == '\t'))
                k++;
            dropping = 0;
            if (k < n && line[k] == '[') { /* a table header */
                int array = k + 1 < n && line[k + 1] == '[';
                read_name(line + k + 1 + array, n - k - 1 - array, ']', name);
                snprintf(current, sizeof(current), "%s", name);
                if (is_or_under(name, table) && array) {
                    snprintf(why, whylen, "line %zu makes %s an array of tables; edit that "
                             "entry by hand.", lineno, table);
                    rc = -EEXIST;
                    break;
                }
                if (!strcmp(name, table)) {
                    if (placed) {
                        snprintf(why, whylen, "[%s] appears twice (line %zu); edit the file by "
                                 "hand.", table, lineno);
                        rc = -EEXIST;
                        break;
                    }
                    where = OURS_MAIN;
                    placed = 1;
                    keep = 0;
                    rc = append_table(&b, table, kv, nkv);
                } else if (is_or_under(name, table)) {
                    char sub[NAME_MAX_LEN];
                    first_part(name + strlen(table) + 1, sub);
                    where = in_list(sub, NULL, 0, drop, ndrop) ? OURS_DROP : KEEP;
                    keep = where != OURS_DROP;
                } else {
                    where = KEEP;
                }
            } else if (k < n && line[k] != '#' && line[k] != '\r') { /* key = value */
                size_t eq = k + read_name(line + k, n - k, '=', name);
                if (eq >= n) {
                    snprintf(why, whylen, "line %zu is neither a table, a key nor a comment.",
                             lineno);
                    rc = -EINVAL;
                    break;
                }
                snprintf(full, sizeof(full), "%s%s%s", current, current[0] ? "." : "", name);
                if (is_or_under(full, table) && !is_or_under(current, table)) {
                    snprintf(why, whylen, "line %zu defines %s with dotted keys or an inline "
                             "table; edit that entry by hand.", lineno, table);
                    rc = -EEXIST;
                    break;
                }
                if (where == OURS_MAIN) {
                    char key[NAME_MAX_LEN];
                    first_part(name, key);
                    dropping = in_list(key, kv, nkv, drop, ndrop);
                } else {
                    dropping = where == OURS_DROP;
                }
                keep = !dropping;
                if ((rc = scan_value(&s, line + eq + 1, n - eq - 1)) < 0)
                    break;
            } else { /* blank or comment */
                keep = where != OURS_DROP;
            }
        }
        if (keep && rc == 0)
            rc = sf_buf_append(&b, line, next);
        i += next;
    }
    if (rc == -EINVAL && !why[0])
        snprintf(why, whylen, "line %zu has a string or array that does not end; fix the file "
                 "first.", lineno);
    if (rc == 0 && (s.ml || s.depth > 0)) {
        snprintf(why, whylen, "a string or array does not end before the end of the file; fix "
                 "the file first.");
        rc = -EINVAL;
    }
    if (rc == 0 && !placed) {
        if (b.len > 0 && b.p[b.len - 1] != '\n')
            rc = sf_buf_append(&b, "\n", 1);
        if (rc == 0 && b.len > 0)
            rc = sf_buf_append(&b, "\n", 1);
        if (rc == 0)
            rc = append_table(&b, table, kv, nkv);
    }
    if (rc == 0 && !b.p)
        rc = sf_buf_append(&b, "", 0);
    if (rc < 0) {
        if (rc == -E2BIG || rc == -ENOMEM)
            snprintf(why, whylen, "out of memory (or the file is over %u MiB).", TEXT_MAX >> 20);
        sf_buf_fini(&b);
        return rc == -E2BIG ? -ENOMEM : rc;
    }
    *out = b.p;
    return 0;
}
