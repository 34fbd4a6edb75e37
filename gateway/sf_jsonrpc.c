#include "sf_jsonrpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *why, size_t whylen, int code, const char *text)
{
    snprintf(why, whylen, "%s", text);
    return code;
}

/* ---- the fast path: the fixed shapes of the hot methods ----
 *
 * Most requests are small messages of one shape, {"jsonrpc":"2.0","id":<id>,"method":"ping"}
 * (or tools/list), and parsing them with jansson (a dozen allocations) was 6% of a request's
 * CPU time. rpc_fast() reads exactly these: an object whose members are "jsonrpc" ("2.0"),
 * "id" (an integer of at most 18 digits, or a string of printable ASCII without escapes)
 * and "method" (one of fast_methods), each once, in any order, with JSON whitespace around
 * the tokens, nothing else. Anything else (params, other members, escapes, numbers with a
 * fraction or exponent, duplicates, trailing bytes) returns 0 and the full parser decides,
 * so the fast path only ever accepts what the full parser accepts, with the same result. */

static const char *const fast_methods[] = {"ping", "tools/list"};

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* A string without escapes: its content in [*s, *s + *n), p past the closing quote. */
static const char *fast_string(const char *p, const char *end, const char **s, size_t *n)
{
    const char *q;

    if (p >= end || *p != '"')
        return NULL;
    for (q = ++p; q < end && *q != '"'; q++)
        if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e || *q == '\\')
            return NULL;
    if (q >= end)
        return NULL;
    *s = p;
    *n = (size_t)(q - p);
    return q + 1;
}

/* 1: m is filled (m->msg owns the id); 0: another shape (m untouched); -1: no memory. */
static int rpc_fast(const char *body, size_t len, sf_rpc_msg *m)
{
    const char *p = body, *end = body + len, *s, *method = NULL;
    json_t *id = NULL;
    int have_version = 0;
    size_t n;

    p = skip_ws(p, end);
    if (p >= end || *p++ != '{')
        return 0;
    for (;;) {
        p = skip_ws(p, end);
        if (!(p = fast_string(p, end, &s, &n)))
            goto other;
        p = skip_ws(p, end);
        if (p >= end || *p++ != ':')
            goto other;
        p = skip_ws(p, end);
        if (n == 7 && !memcmp(s, "jsonrpc", 7) && !have_version) {
            if (!(p = fast_string(p, end, &s, &n)) || n != 3 || memcmp(s, "2.0", 3) != 0)
                goto other;
            have_version = 1;
        } else if (n == 6 && !memcmp(s, "method", 6) && !method) {
            if (!(p = fast_string(p, end, &s, &n)))
                goto other;
            for (size_t i = 0; i < sizeof(fast_methods) / sizeof(fast_methods[0]); i++)
                if (strlen(fast_methods[i]) == n && !memcmp(fast_methods[i], s, n))
                    method = fast_methods[i];
            if (!method)
                goto other;
        } else if (n == 2 && !memcmp(s, "id", 2) && !id) {
            if (p < end && *p == '"') {
                if (!(p = fast_string(p, end, &s, &n)))
                    goto other;
                id = json_stringn(s, n);
            } else {
                const char *d = p + (p < end && *p == '-');
                char num[24];

                for (s = d; s < end && *s >= '0' && *s <= '9'; s++)
                    ;
                n = (size_t)(s - p);
                if (s == d || s - d > 18 || (*d == '0' && s - d > 1) ||
                    (s < end && (*s == '.' || *s == 'e' || *s == 'E')))
                    goto other;
                memcpy(num, p, n);
                num[n] = '\0';
                id = json_integer(strtoll(num, NULL, 10));
                p = s;
            }
            if (!id)
                return -1;
        } else {
            goto other;
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p >= end || *p++ != '}')
            goto other;
        break;
    }
    if (skip_ws(p, end) != end || !have_version || !method || !id)
        goto other;
    memset(m, 0, sizeof(*m));
    m->msg = id;
    m->id = id;
    m->method = method;
    m->kind = SF_RPC_REQUEST;
    return 1;
other:
    json_decref(id);
    return 0;
}

int sf_rpc_parse(const char *body, size_t len, sf_rpc_msg *m, char *why, size_t whylen)
{
    json_error_t jerr;
    json_t *id, *params;
    const char *version;

    if (rpc_fast(body, len, m) > 0)
        return 0; /* else (another shape, or no memory) the full parser decides */
    memset(m, 0, sizeof(*m));
    if (!(m->msg = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr))) {
        snprintf(why, whylen, "Parse error: the body is not valid JSON (%s at line %d).",
                 jerr.text, jerr.line);
        return SF_RPC_PARSE_ERROR;
    }
    if (json_is_array(m->msg))
        return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                    "Invalid Request: JSON-RPC batches are not supported; send one message per "
                    "request.");
    version = json_string_value(json_object_get(m->msg, "jsonrpc"));
    if (!json_is_object(m->msg) || !version || strcmp(version, "2.0") != 0)
        return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                    "Invalid Request: send a JSON-RPC 2.0 object with \"jsonrpc\": \"2.0\".");
    id = json_object_get(m->msg, "id");
    if (id && !json_is_null(id) && !json_is_string(id) && !json_is_integer(id))
        return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                    "Invalid Request: 'id' must be a string or an integer.");
    m->id = json_is_null(id) ? NULL : id;
    m->method = json_string_value(json_object_get(m->msg, "method"));
    if (!m->method) {
        if (json_object_get(m->msg, "method"))
            return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                        "Invalid Request: 'method' must be a string.");
        if (json_object_get(m->msg, "result") || json_object_get(m->msg, "error")) {
            m->kind = SF_RPC_RESPONSE;
            return 0;
        }
        return fail(why, whylen, SF_RPC_INVALID_REQUEST, "Invalid Request: 'method' is missing.");
    }
    m->kind = m->id ? SF_RPC_REQUEST : SF_RPC_NOTIFICATION;
    params = json_object_get(m->msg, "params");
    if (json_is_object(params))
        m->params = params;
    else if (params && m->kind == SF_RPC_REQUEST) /* a notification is never answered */
        return fail(why, whylen, SF_RPC_INVALID_PARAMS,
                    "Invalid params: 'params' must be an object.");
    return 0;
}

void sf_rpc_msg_fini(sf_rpc_msg *m)
{
    if (!m)
        return;
    json_decref(m->msg);
    memset(m, 0, sizeof(*m));
}
