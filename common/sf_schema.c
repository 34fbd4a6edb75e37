/* sf_schema: JSON Schema subset validator (see sf_schema.h). */
#include "sf_schema.h"
#include "sf_msg.h"

#include <errno.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SF_SCHEMA_PATH_MAX 256 /* longest field path quoted in a message */
#define SF_SCHEMA_RX_MAX   256 /* cached compiled patterns */
#define SF_SCHEMA_RX_LEN   512 /* longest pattern */

/* ------------------------------------------------------------------ regex cache */

typedef struct rx_entry {
    char *pat;
    regex_t re;
} rx_entry;

static pthread_mutex_t rx_lock = PTHREAD_MUTEX_INITIALIZER;
static rx_entry rx_cache[SF_SCHEMA_RX_MAX];
static size_t rx_count;

/* Refuses what POSIX regcomp would read differently from ECMA-262 (the pattern language
 * of JSON Schema), or could blow up on: \d (a literal 'd' for POSIX), stacked quantifiers
 * such as "+?" (lazy in ECMA, a repetition of a repetition in POSIX, and exponential in
 * glibc when long), bounds over 1000 and very long patterns. NULL when fine. */
static const char *rx_unsupported(const char *pat)
{
    int prev_quant = 0;

    if (strlen(pat) > SF_SCHEMA_RX_LEN)
        return "longer than 512 bytes";
    for (const char *p = pat; *p; p++) {
        int quant = 0;

        switch (*p) {
        case '\\':
            if (p[1] == 'd' || p[1] == 'D')
                return "\\d is not POSIX: write [0-9] (or [^0-9] for \\D)";
            if (p[1] != '\0')
                p++;
            break;
        case '[': /* bracket expression: skip to its end; ']' first is a literal */
            p++;
            if (*p == '^')
                p++;
            if (*p == ']')
                p++;
            while (*p && *p != ']') {
                if (*p == '[' && (p[1] == ':' || p[1] == '.' || p[1] == '=')) {
                    const char *end = strchr(p + 2, p[1]);
                    p = (end && end[1] == ']') ? end + 1 : p;
                }
                p++;
            }
            if (!*p)
                return NULL; /* unbalanced: regcomp reports it */
            break;
        case '*':
        case '+':
        case '?':
            quant = 1;
            break;
        case '{': { /* a bound: {m}, {m,}, {m,n}, and glibc's {,n} */
            const char *q = p + 1;
            char *end;
            unsigned long lo = 0, hi = 0;
            int digits = 0;

            if (*q >= '0' && *q <= '9') {
                lo = hi = strtoul(q, &end, 10);
                q = end;
                digits = 1;
            }
            if (*q == ',') {
                q++;
                hi = 0;
                if (*q >= '0' && *q <= '9') {
                    hi = strtoul(q, &end, 10);
                    q = end;
                    digits = 1;
                }
            }
            if (*q != '}' || !digits)
                break; /* not a bound: regcomp decides */
            if (lo > 1000 || hi > 1000)
                return "uses a repetition bound over 1000";
            p = q;
            quant = 1;
            break;
        }
        default:
            break;
        }
        if (quant && prev_quant)
            return "stacks quantifiers (like +? or a{2}*), which POSIX and JSON Schema read "
                   "differently";
        prev_quant = quant;
    }
    return NULL;
}

/* Matches s[0..n) against pat (unanchored search). 1 match, 0 no match, -EINVAL bad
 * pattern, -ENOMEM. */
static int rx_match(const char *pat, const char *s, size_t n)
{
    regex_t tmp, *re = NULL;
    regmatch_t m[1];
    int rc, cached = 0;

    pthread_mutex_lock(&rx_lock);
    for (size_t i = 0; i < rx_count; i++) {
        if (strcmp(rx_cache[i].pat, pat) == 0) {
            re = &rx_cache[i].re;
            cached = 1;
            break;
        }
    }
    if (!re) {
        if (rx_unsupported(pat)) {
            pthread_mutex_unlock(&rx_lock);
            return -EINVAL;
        }
        rc = regcomp(&tmp, pat, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            pthread_mutex_unlock(&rx_lock);
            return rc == REG_ESPACE ? -ENOMEM : -EINVAL;
        }
        re = &tmp;
        if (rx_count < SF_SCHEMA_RX_MAX) {
            char *copy = strdup(pat);
            if (copy) {
                rx_cache[rx_count].pat = copy;
                rx_cache[rx_count].re = tmp;
                re = &rx_cache[rx_count].re;
                rx_count++;
                cached = 1;
            }
        }
    }
    rc = 1;
    if (s) {
        m[0].rm_so = 0;
        m[0].rm_eo = (regoff_t)n;
        rc = regexec(re, s, 1, m, REG_STARTEND);
        rc = rc == 0 ? 1 : rc == REG_NOMATCH ? 0 : rc == REG_ESPACE ? -ENOMEM : -EINVAL;
    }
    if (!cached)
        regfree(re);
    pthread_mutex_unlock(&rx_lock);
    return rc;
}

void sf_schema_cache_clear(void)
{
    pthread_mutex_lock(&rx_lock);
    for (size_t i = 0; i < rx_count; i++) {
        regfree(&rx_cache[i].re);
        free(rx_cache[i].pat);
        rx_cache[i].pat = NULL;
    }
    rx_count = 0;
    pthread_mutex_unlock(&rx_lock);
}

/* ------------------------------------------------------------------ small helpers */

static int is_annotation(const char *k)
{
    static const char *const ignored[] = {"description", "title", "default", "examples",
                                          "$schema", "$id", "$comment"};
    if (strcmp(k, "x-maxBytes") == 0) /* our one enforced extension */
        return 0;
    if (strncmp(k, "x-", 2) == 0)
        return 1;
    for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
        if (strcmp(k, ignored[i]) == 0)
            return 1;
    return 0;
}

static const char *got_name(const json_t *x)
{
    switch (json_typeof(x)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "null";
    }
}

static const struct {
    const char *name, *phrase;
} type_names[] = {
    {"object", "an object"}, {"array", "an array"},   {"string", "a string"}, {"integer", "an integer"},
    {"number", "a number"},  {"boolean", "a boolean"}, {"null", "null"},
};

static const char *type_phrase(const char *t)
{
    for (size_t i = 0; i < sizeof(type_names) / sizeof(type_names[0]); i++)
        if (strcmp(t, type_names[i].name) == 0)
            return type_names[i].phrase;
    return NULL;
}

static int type_matches(const char *t, const json_t *x)
{
    if (strcmp(t, "object") == 0)
        return json_is_object(x);
    if (strcmp(t, "array") == 0)
        return json_is_array(x);
    if (strcmp(t, "string") == 0)
        return json_is_string(x);
    if (strcmp(t, "integer") == 0)
        return json_is_integer(x);
    if (strcmp(t, "number") == 0)
        return json_is_number(x);
    if (strcmp(t, "boolean") == 0)
        return json_is_boolean(x);
    if (strcmp(t, "null") == 0)
        return json_is_null(x);
    return 0;
}

static void fmt_num(const json_t *n, char *out, size_t len)
{
    if (json_is_integer(n))
        snprintf(out, len, "%" JSON_INTEGER_FORMAT, json_integer_value(n));
    else
        snprintf(out, len, "%.15g", json_number_value(n));
}

/* <0, 0, >0 like strcmp; exact for two integers. */
static int num_cmp(const json_t *a, const json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b)) {
        json_int_t x = json_integer_value(a), y = json_integer_value(b);
        return (x > y) - (x < y);
    }
    {
        double x = json_number_value(a), y = json_number_value(b);
        return (x > y) - (x < y);
    }
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            c++;
    return c;
}

/* A non-negative integer keyword, or -1 when absent or not one. */
static json_int_t count_kw(const json_t *s, const char *kw)
{
    const json_t *v = json_object_get(s, kw);
    return (json_is_integer(v) && json_integer_value(v) >= 0) ? json_integer_value(v) : -1;
}

/* Field paths: "a.b[2].c", truncated with "..." when too long. */
typedef struct path {
    char s[SF_SCHEMA_PATH_MAX];
    size_t len;
} path;

static size_t path_push(path *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(path *p, const char *fmt, ...)
{
    size_t old = p->len, room = sizeof(p->s) - p->len;
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(p->s + p->len, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= room) {
        p->len = sizeof(p->s) - 1;
        memcpy(p->s + sizeof(p->s) - 4, "...", 4);
    } else {
        p->len += (size_t)n;
    }
    return old;
}

static void path_pop(path *p, size_t old)
{
    p->len = old;
    p->s[old] = '\0';
}

static size_t path_push_key(path *p, const char *key)
{
    return path_push(p, "%s%s", p->len ? "." : "", key);
}

/* ------------------------------------------------------------------ validation */

typedef struct vctx {
    path p;
    const json_t *root; /* where "#/$defs/..." references resolve */
    const char *key; /* set while a property name is checked against propertyNames */
    char *why;
    size_t whylen;
} vctx;

/* Bytes of key to quote: at most 64, never half a UTF-8 character. */
static int quoted_len(const char *key)
{
    size_t n = strnlen(key, 64);

    while (n > 0 && ((unsigned char)key[n] & 0xc0) == 0x80)
        n--;
    return (int)n;
}

static int vfail(vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int vfail(vctx *v, const char *fmt, ...)
{
    char label[SF_SCHEMA_PATH_MAX + 96];
    char msg[768];
    va_list ap;

    if (v->key && v->p.len)
        snprintf(label, sizeof(label), "Key '%.*s' in argument '%s'", quoted_len(v->key), v->key,
                 v->p.s);
    else if (v->key)
        snprintf(label, sizeof(label), "Argument name '%.*s'", quoted_len(v->key), v->key);
    else if (v->p.len)
        snprintf(label, sizeof(label), "Argument '%s'", v->p.s);
    else
        snprintf(label, sizeof(label), "Arguments");
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (v->why && v->whylen)
        snprintf(v->why, v->whylen, "%s %s", label, msg);
    return -EINVAL;
}

static int vschema_fail(vctx *v, const char *what)
{
    if (v->why && v->whylen)
        snprintf(v->why, v->whylen, "Schema error at argument '%s': %s. Fix the tool schema.",
                 v->p.len ? v->p.s : "(top level)", what);
    return -EINVAL;
}

static int validate(vctx *v, const json_t *s, const json_t *x, int depth);

/* Instance nesting bound where no schema walks the value. */
static int deep_check(vctx *v, const json_t *x, int depth)
{
    const char *k;
    json_t *e;
    size_t i, old;
    int rc = 0;

    if (depth > SF_SCHEMA_MAX_DEPTH)
        return vfail(v, SF_MSG_SCHEMA_TOO_DEEP_FMT, SF_SCHEMA_MAX_DEPTH);
    if (json_is_object(x)) {
        json_object_foreach((json_t *)x, k, e) {
            old = path_push_key(&v->p, k);
            rc = deep_check(v, e, depth + 1);
            path_pop(&v->p, old);
            if (rc)
                return rc;
        }
    } else if (json_is_array(x)) {
        json_array_foreach(x, i, e) {
            old = path_push(&v->p, "[%zu]", i);
            rc = deep_check(v, e, depth + 1);
            path_pop(&v->p, old);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int check_type(vctx *v, const json_t *t, const json_t *x)
{
    char list[256];
    size_t n = 0, i, cnt;
    json_t *e;

    if (!t)
        return 0;
    if (json_is_string(t)) {
        const char *ph = type_phrase(json_string_value(t));
        if (!ph)
            return vschema_fail(v, "unknown type");
        if (type_matches(json_string_value(t), x))
            return 0;
        return vfail(v, "must be %s (got %s).", ph, got_name(x));
    }
    if (!json_is_array(t))
        return vschema_fail(v, "'type' must be a string or an array");
    cnt = json_array_size(t);
    list[0] = '\0';
    json_array_foreach(t, i, e) {
        const char *ph = json_is_string(e) ? type_phrase(json_string_value(e)) : NULL;
        if (!ph)
            return vschema_fail(v, "unknown type");
        if (type_matches(json_string_value(e), x))
            return 0;
        if (n < sizeof(list))
            n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s",
                                  i == 0 ? "" : (i + 1 == cnt ? " or " : ", "), ph);
    }
    if (cnt == 0)
        return vschema_fail(v, "'type' is an empty array");
    return vfail(v, "must be %s (got %s).", list, got_name(x));
}

static int check_enum(vctx *v, const json_t *s, const json_t *x)
{
    const json_t *en = json_object_get(s, "enum"), *c = json_object_get(s, "const");
    char list[512];
    size_t n = 0, i;
    json_t *e;

    if (c && !json_equal((json_t *)c, (json_t *)x)) {
        char *d = json_dumps(c, JSON_ENCODE_ANY | JSON_COMPACT);
        int rc = vfail(v, "must be %s.", d ? d : "a fixed value");
        free(d);
        return rc;
    }
    if (!json_is_array(en))
        return 0;
    json_array_foreach(en, i, e) {
        if (json_equal(e, (json_t *)x))
            return 0;
    }
    list[0] = '\0';
    json_array_foreach(en, i, e) {
        char *d = json_is_string(e) ? NULL : json_dumps(e, JSON_ENCODE_ANY | JSON_COMPACT);
        const char *txt = json_is_string(e) ? json_string_value(e) : d ? d : "?";
        if (n < sizeof(list))
            n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", txt);
        free(d);
    }
    return vfail(v, "must be one of: %s.", list);
}

static int check_number(vctx *v, const json_t *s, const json_t *x)
{
    static const struct {
        const char *kw, *phrase;
        int bad_sign; /* fails when num_cmp(x, bound) has this sign... */
        int bad_zero; /* ...or is zero and this is set */
    } kws[] = {
        {"minimum", "at least", -1, 0},
        {"maximum", "at most", 1, 0},
        {"exclusiveMinimum", "greater than", -1, 1},
        {"exclusiveMaximum", "less than", 1, 1},
    };
    char num[64];

    for (size_t i = 0; i < sizeof(kws) / sizeof(kws[0]); i++) {
        const json_t *b = json_object_get(s, kws[i].kw);
        int c;
        if (!json_is_number(b))
            continue;
        c = num_cmp(x, b);
        if (c == kws[i].bad_sign || (c == 0 && kws[i].bad_zero)) {
            fmt_num(b, num, sizeof(num));
            return vfail(v, "must be %s %s.", kws[i].phrase, num);
        }
    }
    return 0;
}

static int check_string(vctx *v, const json_t *s, const json_t *x)
{
    const char *str = json_string_value(x);
    size_t bytes = json_string_length(x), chars = utf8_chars(str, bytes);
    json_int_t minl = count_kw(s, "minLength"), maxl = count_kw(s, "maxLength");
    json_int_t maxb = count_kw(s, "x-maxBytes");
    const json_t *pat = json_object_get(s, "pattern");

    if (minl >= 0 && (json_int_t)chars < minl)
        return vfail(v, "must be at least %" JSON_INTEGER_FORMAT " character%s long.", minl,
                     minl == 1 ? "" : "s");
    if (maxl >= 0 && (json_int_t)chars > maxl)
        return vfail(v, "must be at most %" JSON_INTEGER_FORMAT " character%s long.", maxl,
                     maxl == 1 ? "" : "s");
    if (maxb >= 0 && (json_int_t)bytes > maxb)
        return vfail(v, "must be at most %" JSON_INTEGER_FORMAT " byte%s long in UTF-8 (got %zu).",
                     maxb, maxb == 1 ? "" : "s", bytes);
    if (json_is_string(pat)) {
        int rc = rx_match(json_string_value(pat), str, bytes);
        if (rc == -ENOMEM)
            return -ENOMEM;
        if (rc < 0)
            return vschema_fail(v, "invalid 'pattern'");
        if (rc == 0)
            return vfail(v, "must match the pattern %s.", json_string_value(pat));
    }
    return 0;
}

static int check_object(vctx *v, const json_t *s, const json_t *x, int depth)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *addl = json_object_get(s, "additionalProperties");
    const json_t *req = json_object_get(s, "required");
    const json_t *pn = json_object_get(s, "propertyNames");
    json_int_t maxp = count_kw(s, "maxProperties"), minp = count_kw(s, "minProperties");
    json_int_t maxb = count_kw(s, "x-maxBytes");
    size_t size = json_object_size(x), i, old;
    const char *k;
    json_t *e;
    int rc;

    if (!json_is_object(props))
        props = NULL;
    if (maxp >= 0 && (json_int_t)size > maxp)
        return vfail(v, "must have at most %" JSON_INTEGER_FORMAT " entr%s (got %zu).", maxp,
                     maxp == 1 ? "y" : "ies", size);
    if (minp >= 0 && (json_int_t)size < minp)
        return vfail(v, "must have at least %" JSON_INTEGER_FORMAT " entr%s.", minp,
                     minp == 1 ? "y" : "ies");

    /* keys first: a typo reads better as "unknown 'comand'" than as "'command' is required" */
    json_object_foreach((json_t *)x, k, e) {
        if (pn) {
            json_t *ks = json_stringn(k, strlen(k));
            if (!ks)
                return -ENOMEM;
            v->key = k;
            rc = validate(v, pn, ks, depth + 1);
            v->key = NULL;
            json_decref(ks);
            if (rc)
                return rc;
        }
        if (json_is_false(addl) && !(props && json_object_get(props, k))) {
            char list[512];
            size_t n = 0;
            const char *pk;
            json_t *pv;
            int plen = (int)v->p.len; /* the parent's path */

            list[0] = '\0';
            if (props) {
                json_object_foreach((json_t *)props, pk, pv) {
                    if (n < sizeof(list))
                        n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", n ? ", " : "", pk);
                }
            }
            old = path_push_key(&v->p, k);
            if (v->why && v->whylen) {
                if (!plen && n)
                    snprintf(v->why, v->whylen, "Unknown argument '%s'; valid arguments are: %s.",
                             v->p.s, list);
                else if (!plen)
                    snprintf(v->why, v->whylen, "Unknown argument '%s'; this tool takes no arguments.",
                             v->p.s);
                else if (n)
                    snprintf(v->why, v->whylen, "Unknown argument '%s'; valid keys of '%.*s' are: %s.",
                             v->p.s, plen, v->p.s, list);
                else
                    snprintf(v->why, v->whylen, "Unknown argument '%s'; '%.*s' takes no keys.", v->p.s,
                             plen, v->p.s);
            }
            path_pop(&v->p, old);
            return -EINVAL;
        }
    }
    if (json_is_array(req)) {
        json_array_foreach(req, i, e) {
            if (json_is_string(e) && !json_object_get(x, json_string_value(e))) {
                old = path_push_key(&v->p, json_string_value(e));
                rc = vfail(v, "is required.");
                path_pop(&v->p, old);
                return rc;
            }
        }
    }
    if (maxb >= 0) { /* on an object: keys and string values together, e.g. metadata */
        size_t bytes = 0;
        json_object_foreach((json_t *)x, k, e) {
            bytes += strlen(k) + (json_is_string(e) ? json_string_length(e) : 0);
        }
        if ((json_int_t)bytes > maxb)
            return vfail(v, "must take at most %" JSON_INTEGER_FORMAT
                            " bytes of keys and values in all (got %zu); shorten or drop some.",
                         maxb, bytes);
    }
    json_object_foreach((json_t *)x, k, e) {
        const json_t *sub = props ? json_object_get(props, k) : NULL;
        if (!sub && json_is_object(addl))
            sub = addl;
        old = path_push_key(&v->p, k);
        rc = sub ? validate(v, sub, e, depth + 1) : deep_check(v, e, depth + 1);
        path_pop(&v->p, old);
        if (rc)
            return rc;
    }
    return 0;
}

static int check_array(vctx *v, const json_t *s, const json_t *x, int depth)
{
    json_int_t mini = count_kw(s, "minItems"), maxi = count_kw(s, "maxItems");
    const json_t *items = json_object_get(s, "items");
    size_t n = json_array_size(x), i, old;
    json_t *e;
    int rc;

    if (mini >= 0 && (json_int_t)n < mini)
        return vfail(v, "must have at least %" JSON_INTEGER_FORMAT " item%s (got %zu).", mini,
                     mini == 1 ? "" : "s", n);
    if (maxi >= 0 && (json_int_t)n > maxi)
        return vfail(v, "must have at most %" JSON_INTEGER_FORMAT " item%s (got %zu).", maxi,
                     maxi == 1 ? "" : "s", n);
    json_array_foreach(x, i, e) {
        old = path_push(&v->p, "[%zu]", i);
        rc = (items && !json_is_array(items)) ? validate(v, items, e, depth + 1)
                                              : deep_check(v, e, depth + 1);
        path_pop(&v->p, old);
        if (rc)
            return rc;
    }
    return 0;
}

/* The schema a "$ref" names: only "#/$defs/NAME" of the root schema; NULL when not. */
static const json_t *ref_target(const json_t *root, const json_t *ref)
{
    const char *r = json_string_value(ref);

    if (!r || strncmp(r, "#/$defs/", 8) != 0 || !r[8] || strchr(r + 8, '/') || strchr(r + 8, '~'))
        return NULL;
    return json_object_get(json_object_get(root, "$defs"), r + 8);
}

static int validate(vctx *v, const json_t *s, const json_t *x, int depth)
{
    const json_t *ref;
    int rc;

    if (depth > SF_SCHEMA_MAX_DEPTH)
        return vfail(v, SF_MSG_SCHEMA_TOO_DEEP_FMT, SF_SCHEMA_MAX_DEPTH);
    if (json_is_true(s))
        return deep_check(v, x, depth);
    if (json_is_false(s))
        return vfail(v, "is not allowed.");
    if (!json_is_object(s))
        return vschema_fail(v, "a schema must be an object or a boolean");
    if ((ref = json_object_get(s, "$ref"))) { /* then the keywords beside it, as in 2020-12 */
        const json_t *t = ref_target(v->root, ref);
        if (!t)
            return vschema_fail(v, "a $ref must name #/$defs/NAME of the same schema");
        if ((rc = validate(v, t, x, depth + 1)) != 0)
            return rc;
    }
    if ((rc = check_type(v, json_object_get(s, "type"), x)) != 0)
        return rc;
    if ((rc = check_enum(v, s, x)) != 0)
        return rc;
    switch (json_typeof(x)) {
    case JSON_OBJECT:
        return check_object(v, s, x, depth);
    case JSON_ARRAY:
        return check_array(v, s, x, depth);
    case JSON_STRING:
        return check_string(v, s, x);
    case JSON_INTEGER:
    case JSON_REAL:
        return check_number(v, s, x);
    default:
        return 0;
    }
}

int sf_schema_validate(const json_t *schema, const json_t *instance, char *why, size_t whylen)
{
    vctx v;

    if (!schema || !instance) {
        if (why && whylen)
            snprintf(why, whylen, "Arguments are missing.");
        return -EINVAL;
    }
    memset(&v, 0, sizeof(v));
    v.root = schema;
    v.why = why;
    v.whylen = whylen;
    return validate(&v, schema, instance, 0);
}

/* ------------------------------------------------------------------ schema check */

typedef struct cctx {
    path p;
    const json_t *root;
    char *why;
    size_t whylen;
} cctx;

static int cfail(cctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfail(cctx *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->why && c->whylen) {
        if (c->p.len)
            snprintf(c->why, c->whylen, "Schema error at '%s': %s", c->p.s, msg);
        else
            snprintf(c->why, c->whylen, "Schema error at the top level: %s", msg);
    }
    return -EINVAL;
}

static int check(cctx *c, const json_t *s, int depth);

static int check_sub(cctx *c, const char *seg, const json_t *s, int depth)
{
    size_t old = path_push_key(&c->p, seg);
    int rc = check(c, s, depth + 1);
    path_pop(&c->p, old);
    return rc;
}

static int check_type_kw(cctx *c, const json_t *t)
{
    size_t i, j;
    json_t *e, *f;

    if (json_is_string(t)) {
        if (!type_phrase(json_string_value(t)))
            return cfail(c, "unknown type '%s'; use object, array, string, integer, number, "
                            "boolean or null.", json_string_value(t));
        return 0;
    }
    if (!json_is_array(t) || json_array_size(t) == 0)
        return cfail(c, "'type' must be a type name or a non-empty array of type names.");
    json_array_foreach(t, i, e) {
        if (!json_is_string(e) || !type_phrase(json_string_value(e)))
            return cfail(c, "'type' lists an unknown type; use object, array, string, integer, "
                            "number, boolean or null.");
        json_array_foreach(t, j, f) {
            if (j < i && json_equal(e, f))
                return cfail(c, "'type' lists '%s' twice.", json_string_value(e));
        }
    }
    return 0;
}

static int check(cctx *c, const json_t *s, int depth)
{
    static const char *const counts[] = {"minLength", "maxLength", "minItems", "maxItems",
                                         "maxProperties", "minProperties", "x-maxBytes"};
    static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum"};
    const json_t *props = json_object_get(s, "properties");
    const char *k;
    json_t *val;
    int rc;

    if (depth > SF_SCHEMA_MAX_DEPTH)
        return cfail(c, "the schema is nested too deeply (the limit is %d levels).",
                     SF_SCHEMA_MAX_DEPTH);
    if (json_is_boolean(s))
        return 0;
    if (!json_is_object(s))
        return cfail(c, "a schema must be an object or a boolean (got %s).", got_name(s));

    json_object_foreach((json_t *)s, k, val) {
        int known = 0;

        if (is_annotation(k))
            continue;
        for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
            if (strcmp(k, counts[i]) == 0) {
                if (!json_is_integer(val) || json_integer_value(val) < 0)
                    return cfail(c, "'%s' must be a non-negative integer.", k);
                known = 1;
            }
        }
        for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++) {
            if (strcmp(k, bounds[i]) == 0) {
                if (json_is_boolean(val))
                    return cfail(c, "'%s' must be a number (the draft-4 boolean form is not "
                                    "supported).", k);
                if (!json_is_number(val))
                    return cfail(c, "'%s' must be a number.", k);
                known = 1;
            }
        }
        if (known)
            continue;
        if (strcmp(k, "type") == 0) {
            if ((rc = check_type_kw(c, val)) != 0)
                return rc;
        } else if (strcmp(k, "properties") == 0) {
            const char *pk;
            json_t *pv;
            size_t old;

            if (!json_is_object(val))
                return cfail(c, "'properties' must be an object.");
            json_object_foreach(val, pk, pv) {
                old = path_push_key(&c->p, "properties");
                rc = check_sub(c, pk, pv, depth);
                path_pop(&c->p, old);
                if (rc)
                    return rc;
            }
        } else if (strcmp(k, "required") == 0) {
            size_t i;
            json_t *e;

            if (!json_is_array(val))
                return cfail(c, SF_MSG_SCHEMA_REQUIRED_ARRAY);
            json_array_foreach(val, i, e) {
                if (!json_is_string(e))
                    return cfail(c, SF_MSG_SCHEMA_REQUIRED_ARRAY);
                if (json_is_false(json_object_get(s, "additionalProperties")) &&
                    !(json_is_object(props) && json_object_get(props, json_string_value(e))))
                    return cfail(c, "'%s' is required but not in 'properties', so no value "
                                    "could pass.", json_string_value(e));
            }
        } else if (strcmp(k, "additionalProperties") == 0 || strcmp(k, "propertyNames") == 0) {
            if ((rc = check_sub(c, k, val, depth)) != 0)
                return rc;
        } else if (strcmp(k, "items") == 0) {
            if (json_is_array(val))
                return cfail(c, "'items' as an array (tuple form) is not supported; give one "
                                "schema.");
            if ((rc = check_sub(c, k, val, depth)) != 0)
                return rc;
        } else if (strcmp(k, "enum") == 0) {
            if (!json_is_array(val) || json_array_size(val) == 0)
                return cfail(c, "'enum' must be a non-empty array.");
        } else if (strcmp(k, "const") == 0) {
            /* any value */
        } else if (strcmp(k, "$defs") == 0) {
            const char *dk;
            json_t *dv;
            size_t old;

            if (s != c->root || !json_is_object(val))
                return cfail(c, "'$defs' must be an object, at the top level of the schema.");
            json_object_foreach(val, dk, dv) {
                old = path_push_key(&c->p, "$defs");
                rc = check_sub(c, dk, dv, depth);
                path_pop(&c->p, old);
                if (rc)
                    return rc;
            }
        } else if (strcmp(k, "$ref") == 0) {
            if (!ref_target(c->root, val))
                return cfail(c, "'$ref' must name a schema of this one's '$defs' as "
                                "\"#/$defs/NAME\".");
        } else if (strcmp(k, "pattern") == 0) {
            const char *why;
            if (!json_is_string(val))
                return cfail(c, "'pattern' must be a string.");
            if ((why = rx_unsupported(json_string_value(val))) != NULL)
                return cfail(c, "'pattern' %s: %s.", json_string_value(val), why);
            rc = rx_match(json_string_value(val), NULL, 0);
            if (rc == -ENOMEM)
                return -ENOMEM;
            if (rc < 0)
                return cfail(c, "'pattern' %s is not a valid POSIX extended regular expression.",
                             json_string_value(val));
        } else {
            return cfail(c, "unsupported keyword '%s'.", k);
        }
    }
    return 0;
}

int sf_schema_check(const json_t *schema, char *why, size_t whylen)
{
    cctx c;

    if (!schema) {
        if (why && whylen)
            snprintf(why, whylen, "Schema error: no schema.");
        return -EINVAL;
    }
    memset(&c, 0, sizeof(c));
    c.root = schema;
    c.why = why;
    c.whylen = whylen;
    return check(&c, schema, 0);
}
