/* sse.c: the incremental text/event-stream parser (see sse.h). */
#include "sse.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void cli_sse_init(cli_sse *s, size_t max)
{
    memset(s, 0, sizeof(*s));
    sf_buf_init(&s->line, max);
    sf_buf_init(&s->data, max);
    s->retry_ms = -1;
}

void cli_sse_fini(cli_sse *s)
{
    if (!s)
        return;
    sf_buf_fini(&s->line);
    sf_buf_fini(&s->data);
}

static int dispatch(cli_sse *s, cli_sse_cb cb, void *arg)
{
    int rc = 0;

    if (s->has_data) {
        size_t len = s->data.len;
        if (len > 0 && s->data.p[len - 1] == '\n')
            s->data.p[--len] = '\0';
        rc = cb(arg, s->event[0] ? s->event : "message", s->data.p ? s->data.p : "", len, s->id);
    }
    sf_buf_reset(&s->data);
    s->event[0] = '\0';
    s->has_data = 0;
    return rc;
}

static int field(cli_sse *s, const char *line, size_t n)
{
    const char *colon = memchr(line, ':', n);
    size_t nlen = colon ? (size_t)(colon - line) : n;
    const char *v = colon ? colon + 1 : line + n;
    size_t vlen = colon ? n - nlen - 1 : 0;
    int rc;

    if (vlen > 0 && *v == ' ') {
        v++;
        vlen--;
    }
    if (nlen == 4 && !memcmp(line, "data", 4)) {
        if ((rc = sf_buf_append(&s->data, v, vlen)) < 0 || (rc = sf_buf_append(&s->data, "\n", 1)) < 0)
            return rc;
        s->has_data = 1;
    } else if (nlen == 5 && !memcmp(line, "event", 5)) {
        snprintf(s->event, sizeof(s->event), "%.*s", (int)vlen, v);
    } else if (nlen == 2 && !memcmp(line, "id", 2)) {
        if (!memchr(v, '\0', vlen) && vlen < sizeof(s->id)) { /* longer ids are ignored */
            memcpy(s->id, v, vlen);
            s->id[vlen] = '\0';
        }
    } else if (nlen == 5 && !memcmp(line, "retry", 5)) {
        long ms = 0;
        size_t i;
        for (i = 0; i < vlen && v[i] >= '0' && v[i] <= '9' && ms < 100000000; i++)
            ms = ms * 10 + (v[i] - '0');
        if (vlen > 0 && i == vlen)
            s->retry_ms = ms;
    } /* comments (nlen == 0) and unknown fields are ignored */
    return 0;
}

static int end_line(cli_sse *s, cli_sse_cb cb, void *arg)
{
    int rc;

    if (s->line.len == 0)
        return dispatch(s, cb, arg);
    rc = field(s, s->line.p, s->line.len);
    sf_buf_reset(&s->line);
    return rc;
}

int cli_sse_feed(cli_sse *s, const char *p, size_t n, cli_sse_cb cb, void *arg)
{
    int rc;

    while (n > 0) {
        size_t i = 0;

        if (!s->bom_done) { /* the BOM may come split over chunks: check byte by byte */
            static const char bom[] = "\xEF\xBB\xBF";
            size_t have = s->line.len;
            if (have < 3 && (unsigned char)p[0] == (unsigned char)bom[have]) {
                if ((rc = sf_buf_append(&s->line, p, 1)) < 0)
                    return rc;
                p++;
                n--;
                if (s->line.len == 3) {
                    sf_buf_reset(&s->line);
                    s->bom_done = 1;
                }
                continue;
            }
            s->bom_done = 1; /* not a BOM: what was held is ordinary text */
        }
        if (s->cr && p[0] == '\n') { /* the LF of a CRLF split over two chunks */
            s->cr = 0;
            p++;
            n--;
            continue;
        }
        s->cr = 0;
        while (i < n && p[i] != '\n' && p[i] != '\r')
            i++;
        if ((rc = sf_buf_append(&s->line, p, i)) < 0)
            return rc;
        if (i == n)
            return 0; /* the line goes on in the next chunk */
        if (p[i] == '\r') {
            if (i + 1 < n && p[i + 1] == '\n')
                i++;
            else if (i + 1 == n)
                s->cr = 1;
        }
        p += i + 1;
        n -= i + 1;
        if ((rc = end_line(s, cb, arg)) < 0)
            return rc;
    }
    return 0;
}
