/* oauth_page.c: the sign-in page and the error page of the authorization server: small
 * server-rendered HTML, no script, every value escaped, sent with headers that forbid
 * framing (clickjacking), caching and referrers. */
#include "oauth.h"
#include "sf_buf.h"

#include <stdio.h>
#include <string.h>

#define PAGE_MAX 65536

static const char style[] =
    "<style>body{font:16px/1.5 system-ui,sans-serif;max-width:28em;margin:3em auto;padding:0 1em;"
    "color:#222}h1{font-size:1.4em}label{display:block;margin:1em 0 .3em}input[type=password]"
    "{width:100%;padding:.5em;font:inherit;box-sizing:border-box}.app{font-weight:600}"
    ".err{background:#fde8e8;border:1px solid #e0a0a0;padding:.6em .8em;border-radius:4px}"
    "button{font:inherit;padding:.5em 1.2em;margin:1em .5em 0 0}.note{color:#666;font-size:.9em}"
    "</style>";

static void esc(sf_buf *b, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': sf_buf_append(b, "&lt;", 4); break;
        case '>': sf_buf_append(b, "&gt;", 4); break;
        case '&': sf_buf_append(b, "&amp;", 5); break;
        case '"': sf_buf_append(b, "&quot;", 6); break;
        case '\'': sf_buf_append(b, "&#39;", 5); break;
        default: sf_buf_append(b, s, 1);
        }
    }
}

char *gw_oauth_page(const char *client_name, const char *redirect_host, const char *csrf,
                    const char *error)
{
    sf_buf b;

    sf_buf_init(&b, PAGE_MAX);
    sf_buf_appendf(&b, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                       "<meta name=\"viewport\" content=\"width=device-width\">"
                       "<title>Sign in to sandfleet</title>%s</head><body>"
                       "<h1>Sign in to sandfleet</h1><p><span class=\"app\">", style);
    esc(&b, client_name);
    sf_buf_appendf(&b, "</span> asks to use your team's sandboxes: create them, run commands "
                       "in them and delete them. After you approve, you go back to <b>");
    esc(&b, redirect_host);
    sf_buf_appendf(&b, "</b>.</p>");
    if (error) {
        sf_buf_appendf(&b, "<p class=\"err\" role=\"alert\">");
        esc(&b, error);
        sf_buf_appendf(&b, "</p>");
    }
    sf_buf_appendf(&b, "<form method=\"post\" action=\"/oauth/authorize\">"
                       "<input type=\"hidden\" name=\"csrf\" value=\"");
    esc(&b, csrf);
    sf_buf_appendf(&b, "\"><label for=\"key\">Team API key</label>"
                       "<input id=\"key\" name=\"api_key\" type=\"password\" "
                       "autocomplete=\"off\" placeholder=\"sf_live_...\" required>"
                       "<p class=\"note\">Ask your sandfleet admin for one: "
                       "<code>sandfleet keys create --team NAME</code>. The application never "
                       "sees it; it gets a token that the key's revocation ends.</p>"
                       "<button type=\"submit\" name=\"decision\" value=\"approve\">Approve</button>"
                       "<button type=\"submit\" name=\"decision\" value=\"deny\" formnovalidate>"
                       "Deny</button></form></body></html>");
    if (!b.p) {
        sf_buf_fini(&b);
        return NULL;
    }
    return b.p;
}

char *gw_oauth_error_page(const char *title, const char *sentence)
{
    sf_buf b;

    sf_buf_init(&b, PAGE_MAX);
    sf_buf_appendf(&b, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                       "<title>sandfleet sign-in</title>%s</head><body><h1>", style);
    esc(&b, title);
    sf_buf_appendf(&b, "</h1><p class=\"err\" role=\"alert\">");
    esc(&b, sentence);
    sf_buf_appendf(&b, "</p></body></html>");
    if (!b.p) {
        sf_buf_fini(&b);
        return NULL;
    }
    return b.p;
}

const char *const *gw_oauth_page_headers(const char *cookie)
{
    static _Thread_local const char *h[16]; /* each event-loop thread answers its own */
    size_t i = 0;

    h[i++] = "Content-Security-Policy";
    h[i++] = "default-src 'none'; style-src 'unsafe-inline'; "
             "frame-ancestors 'none'; base-uri 'none'";
    h[i++] = "X-Frame-Options";
    h[i++] = "DENY";
    h[i++] = "Cache-Control";
    h[i++] = "no-store";
    h[i++] = "Referrer-Policy";
    h[i++] = "no-referrer";
    h[i++] = "X-Content-Type-Options";
    h[i++] = "nosniff";
    if (cookie) {
        h[i++] = "Set-Cookie";
        h[i++] = cookie;
    }
    h[i] = NULL;
    return h;
}
