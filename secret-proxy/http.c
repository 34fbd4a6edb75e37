/* Request heads: collected from llhttp callbacks into a bounded list, checked, and
 * written out again (never forwarded raw), so what the upstream reads is exactly what the
 * proxy parsed and judged. Placeholders are swapped here. */
#include "proxy.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void sp_head_init(sp_head *h)
{
    memset(h, 0, sizeof(*h));
    sf_buf_init(&h->url, 8192);
    sf_buf_init(&h->field, 256);
    sf_buf_init(&h->value, 8192);
    sf_buf_init(&h->arena, SP_HEAD_MAX + 2 * SP_HDRS_MAX);
}

void sp_head_reset(sp_head *h)
{
    h->n = 0;
    sf_buf_reset(&h->arena);
    h->in_value = 0;
    h->too_big = 0;
    sf_buf_reset(&h->url);
    sf_buf_reset(&h->field);
    sf_buf_reset(&h->value);
}

void sp_head_fini(sp_head *h)
{
    sp_head_reset(h);
    sf_buf_fini(&h->url);
    sf_buf_fini(&h->field);
    sf_buf_fini(&h->value);
    sf_buf_fini(&h->arena);
}

static int flush(sp_head *h)
{
    if (!h->in_value)
        return 0;
    h->in_value = 0;
    if (h->n == SP_HDRS_MAX) {
        h->too_big = 1;
        return -E2BIG;
    }
    char *old = h->arena.p;
    size_t at = h->arena.len;
    int rc;
    if ((rc = sf_buf_append(&h->arena, h->field.p ? h->field.p : "", h->field.len + 1)) < 0 ||
        (rc = sf_buf_append(&h->arena, h->value.p ? h->value.p : "", h->value.len + 1)) < 0) {
        h->arena.len = at;
        h->too_big = 1;
        return rc;
    }
    h->off[h->n][0] = at;
    h->off[h->n][1] = at + h->field.len + 1;
    h->n++;
    for (int i = old == h->arena.p ? h->n - 1 : 0; i < h->n; i++) { /* moved: re-point all */
        h->hdrs[i].name = h->arena.p + h->off[i][0];
        h->hdrs[i].value = h->arena.p + h->off[i][1];
    }
    sf_buf_reset(&h->field);
    sf_buf_reset(&h->value);
    return 0;
}

int sp_head_field(sp_head *h, const char *at, size_t n)
{
    int rc;

    if ((rc = flush(h)) < 0 || (rc = sf_buf_append(&h->field, at, n)) < 0)
        h->too_big = 1;
    return rc;
}

int sp_head_value(sp_head *h, const char *at, size_t n)
{
    int rc;

    h->in_value = 1;
    if ((rc = sf_buf_append(&h->value, at, n)) < 0)
        h->too_big = 1;
    return rc;
}

int sp_head_end(sp_head *h)
{
    return flush(h);
}

const char *sp_head_get(const sp_head *h, const char *name)
{
    for (int i = 0; i < h->n; i++)
        if (!strcasecmp(h->hdrs[i].name, name))
            return h->hdrs[i].value;
    return NULL;
}

int sp_head_prescan(const char *p, size_t n, const char **why)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n' && (i == 0 || p[i - 1] != '\r')) {
            *why = "line ends must be CRLF";
            return -EINVAL;
        }
        if (c == '\n' && i + 1 < n && (p[i + 1] == ' ' || p[i + 1] == '\t')) {
            *why = "folded header lines (obs-fold) are not accepted";
            return -EINVAL;
        }
        if ((c < 0x20 && c != '\r' && c != '\n' && c != '\t') || c == 0x7f) {
            *why = "control characters are not accepted in a request head";
            return -EINVAL;
        }
        if (c == '\r' && (i + 1 >= n || p[i + 1] != '\n')) {
            *why = "a bare CR is not accepted";
            return -EINVAL;
        }
    }
    return 0;
}

int sp_hostport(const char *s, size_t n, char host[SP_NAME_MAX], int *port, int def_port)
{
    const char *colon = NULL;
    size_t hl;
    int64_t p = def_port;

    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    while (n && (*s == ' ' || *s == '\t'))
        s++, n--;
    if (n == 0 || s[0] == '[')
        return -EINVAL; /* IPv6 literals: no IPv6 egress */
    for (size_t i = 0; i < n; i++)
        if (s[i] == ':')
            colon = s + i;
    hl = colon ? (size_t)(colon - s) : n;
    if (hl == 0 || hl >= SP_NAME_MAX)
        return -EINVAL;
    if (colon) {
        char num[8];
        size_t nl = n - hl - 1;
        if (nl == 0 || nl >= sizeof(num))
            return -EINVAL;
        memcpy(num, colon + 1, nl);
        num[nl] = '\0';
        if (sf_parse_i64(num, 1, 65535, &p) < 0)
            return -EINVAL;
    }
    for (size_t i = 0; i < hl; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '-' && c != '.' && c != '_')
            return -EINVAL;
        host[i] = (char)tolower(c);
    }
    if (host[hl - 1] == '.')
        hl--; /* "example.com." is example.com */
    if (hl == 0)
        return -EINVAL;
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

int sp_url_split(const char *url, char host[SP_NAME_MAX], int *port, const char **path)
{
    const char *a, *end;

    if (strncasecmp(url, "http://", 7) != 0)
        return -EINVAL;
    a = url + 7;
    end = a + strcspn(a, "/?#");
    if (memchr(a, '@', (size_t)(end - a)))
        return -EINVAL; /* userinfo: never */
    if (sp_hostport(a, (size_t)(end - a), host, port, 80) < 0)
        return -EINVAL;
    *path = *end == '/' ? end : *end ? end : "/";
    if (*end == '?')
        *path = end; /* "http://h?q" -> "?q": written as "/?q" by the caller */
    return 0;
}

static int is_hop(const char *name)
{
    return !strcasecmp(name, "proxy-connection") || !strcasecmp(name, "proxy-authorization");
}

/* 1 when b's value may go into header hname of a request to host: one of its allowed
 * hosts; its named header, else Authorization unless it was made --any-header; over TLS
 * unless it was made --allow-http. */
static int swap_ok(const sp_binding *b, const char *hname, const char *host, int tls)
{
    int host_ok = 0;

    if (!b->sec.value || (!tls && !b->sec.allow_http))
        return 0;
    if (b->sec.header[0] ? strcasecmp(b->sec.header, hname) != 0
                         : !b->sec.any_header && strcasecmp(hname, "authorization") != 0)
        return 0;
    for (size_t k = 0; k < b->sec.hosts_n && !host_ok; k++)
        host_ok = sf_secret_host_match(b->sec.hosts[k], host);
    return host_ok;
}

/* Appends value with the sandbox's placeholders swapped (or not) for host. */
static int swap_value(sf_buf *out, const char *hname, const char *v, const sp_sandbox *sb,
                      const char *host, int tls, int *injected, int *foreign)
{
    size_t n = strlen(v), i = 0, start = 0;
    int rc;

    while (i + SF_PLACEHOLDER_LEN <= n) {
        const sp_binding *b;
        if (v[i] != 's' || !sf_placeholder_at(v + i, n - i) ||
            !(b = sp_sandbox_binding(sb, v + i))) {
            i++;
            continue;
        }
        if (!swap_ok(b, hname, host, tls)) {
            (*foreign)++;
            i += SF_PLACEHOLDER_LEN;
            continue;
        }
        if (b->sec.format[0]) { /* the whole value becomes the format */
            const char *at = strstr(b->sec.format, "{}");
            if ((rc = sf_buf_append(out, b->sec.format, (size_t)(at - b->sec.format))) < 0 ||
                (rc = sf_buf_append(out, b->sec.value, b->sec.value_len)) < 0 ||
                (rc = sf_buf_append(out, at + 2, strlen(at + 2))) < 0)
                return rc;
            (*injected)++;
            return 0;
        }
        if ((rc = sf_buf_append(out, v + start, i - start)) < 0 ||
            (rc = sf_buf_append(out, b->sec.value, b->sec.value_len)) < 0)
            return rc;
        (*injected)++;
        i += SF_PLACEHOLDER_LEN;
        start = i;
    }
    return sf_buf_append(out, v + start, n - start);
}

int sp_head_write(sf_buf *out, const char *method, const char *path, int http_minor,
                  const sp_head *h, const sp_sandbox *sb, const char *host, int tls,
                  int *injected, int *foreign)
{
    int rc;

    *injected = *foreign = 0;
    if ((rc = sf_buf_append(out, method, strlen(method))) < 0 ||
        (rc = sf_buf_append(out, " /", path[0] == '?' ? 2 : 1)) < 0 ||
        (rc = sf_buf_append(out, path, strlen(path))) < 0 ||
        (rc = sf_buf_append(out, http_minor ? " HTTP/1.1\r\n" : " HTTP/1.0\r\n", 11)) < 0)
        return rc;
    for (int i = 0; i < h->n; i++) {
        if (is_hop(h->hdrs[i].name))
            continue;
        if ((rc = sf_buf_append(out, h->hdrs[i].name, strlen(h->hdrs[i].name))) < 0 ||
            (rc = sf_buf_append(out, ": ", 2)) < 0 ||
            (rc = swap_value(out, h->hdrs[i].name, h->hdrs[i].value, sb, host, tls,
                             injected, foreign)) < 0 ||
            (rc = sf_buf_append(out, "\r\n", 2)) < 0)
            return rc;
    }
    return sf_buf_append(out, "\r\n", 2);
}
