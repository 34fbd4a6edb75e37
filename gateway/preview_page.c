/* preview_page.c: the pages the gateway answers on a preview host by itself (no sandbox
 * was reached): small HTML, no script, no external resource, never a cookie but the
 * preview's own, and `Connection: close` (the next request starts afresh). */
#include "preview.h"

#include <errno.h>
#include <string.h>

static const char *reason(int status)
{
    switch (status) {
    case 302: return "Found";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 429: return "Too Many Requests";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
    }
}

static int esc(sf_buf *b, const char *s)
{
    for (; *s; s++) {
        const char *r = NULL;

        switch (*s) {
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '&': r = "&amp;"; break;
        case '"': r = "&quot;"; break;
        case '\'': r = "&#39;"; break;
        }
        if (r ? sf_buf_append(b, r, strlen(r)) < 0 : sf_buf_append(b, s, 1) < 0)
            return -ENOSPC;
    }
    return 0;
}

int gw_pv_page(sf_buf *out, int status, const char *title, const char *text, const char *extra)
{
    sf_buf body;
    int rc = -ENOSPC;

    sf_buf_init(&body, 8192);
    if (sf_buf_appendf(&body, "<!doctype html>\n<html><head><meta charset=\"utf-8\">"
                              "<title>%d ", status) < 0 ||
        esc(&body, title) < 0 ||
        sf_buf_appendf(&body, "</title><style>body{font:16px/1.5 system-ui,sans-serif;"
                              "max-width:40em;margin:3em auto;padding:0 1em;color:#222}"
                              "small{color:#777}</style></head>\n<body><h1>") < 0 ||
        esc(&body, title) < 0 || sf_buf_appendf(&body, "</h1>\n<p>") < 0 ||
        esc(&body, text) < 0 ||
        sf_buf_appendf(&body, "</p>\n<p><small>sandfleet preview &middot; %d</small></p>"
                              "</body></html>\n", status) < 0)
        goto out;
    if (sf_buf_appendf(out, "HTTP/1.1 %d %s\r\nContent-Type: text/html; charset=utf-8\r\n"
                            "Content-Length: %zu\r\nCache-Control: no-store\r\n"
                            "X-Content-Type-Options: nosniff\r\n"
                            "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n"
                            "Connection: close\r\n%s\r\n",
                       status, reason(status), body.len, extra ? extra : "") < 0 ||
        sf_buf_append(out, body.p, body.len) < 0)
        goto out;
    rc = 0;
out:
    sf_buf_fini(&body);
    return rc;
}
