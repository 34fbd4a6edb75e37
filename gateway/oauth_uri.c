/* oauth_uri.c: the rules for the redirect URIs a client may use (oauth.h), shared by
 * dynamic registration (oauth.c) and client ID metadata documents (oauth_cimd.c). */
#include "oauth.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

/* A plain authority: a host (letters, digits, '-' and '.', or a bracketed IPv6 literal)
 * and an optional ":port" of 1 to 5 digits; no userinfo, nothing else. *hostlen: the
 * host's length. */
static int authority_plain(const char *a, size_t n, size_t *hostlen)
{
    size_t h = 0, i;

    if (n > 0 && a[0] == '[') {
        for (h = 1; h < n && a[h] != ']'; h++)
            if (!isxdigit((unsigned char)a[h]) && a[h] != ':' && a[h] != '.')
                return 0;
        if (h == n || h == 1)
            return 0;
        h++;
    } else {
        while (h < n && (isalnum((unsigned char)a[h]) || a[h] == '-' || a[h] == '.'))
            h++;
        if (h == 0)
            return 0;
    }
    if (h < n) {
        if (a[h] != ':' || n - h - 1 == 0 || n - h - 1 > 5)
            return 0;
        for (i = h + 1; i < n; i++)
            if (!isdigit((unsigned char)a[i]))
                return 0;
    }
    *hostlen = h;
    return 1;
}

int gw_oauth_redirect_uri_ok(const char *u, const char **why)
{
    size_t n = strlen(u), alen, hlen;
    const char *a;

    for (size_t i = 0; i < n; i++)
        if ((unsigned char)u[i] <= 0x20 || u[i] == 0x7f || u[i] == '\\') {
            *why = "a redirect URI may not hold spaces, control characters or backslashes";
            return 0;
        }
    if (n == 0 || n > GW_OAUTH_URI_MAX || strchr(u, '#')) {
        *why = "each redirect URI must be an absolute URI without a fragment";
        return 0;
    }
    if (!strncasecmp(u, "https://", 8))
        a = u + 8;
    else if (!strncasecmp(u, "http://", 7))
        a = u + 7;
    else {
        *why = "a redirect URI must be an absolute https URI, or http on a loopback host "
               "(http://127.0.0.1, http://[::1] or http://localhost)";
        return 0;
    }
    alen = strcspn(a, "/?");
    if (memchr(a, '@', alen)) {
        *why = "a redirect URI may not carry a user name or password before its host";
        return 0;
    }
    if (!authority_plain(a, alen, &hlen)) {
        *why = "a redirect URI must name a plain host (and at most a numeric port)";
        return 0;
    }
    if (a == u + 7 && !(hlen == 9 && !strncasecmp(a, "localhost", 9)) &&
        !(hlen == 9 && !strncmp(a, "127.0.0.1", 9)) && !(hlen == 5 && !strncmp(a, "[::1]", 5))) {
        *why = "plain http redirect URIs are allowed only on loopback (localhost, 127.0.0.1, [::1])";
        return 0;
    }
    return 1;
}

/* The loopback host of an http URI (its length in *hostlen) and where its port ends, or
 * NULL when u is not http on localhost, 127.0.0.1 or [::1]. */
static const char *loopback_rest(const char *u, size_t *hostlen)
{
    const char *a = u + 7;
    size_t alen, h;

    if (strncasecmp(u, "http://", 7) != 0)
        return NULL;
    alen = strcspn(a, "/?#");
    if (!authority_plain(a, alen, &h) ||
        !((h == 9 && !strncasecmp(a, "localhost", 9)) || (h == 9 && !strncmp(a, "127.0.0.1", 9)) ||
          (h == 5 && !strncmp(a, "[::1]", 5))))
        return NULL;
    *hostlen = h;
    return a + alen;
}

int gw_oauth_redirect_matches(const char *registered, const char *requested)
{
    const char *r1, *r2;
    size_t h1, h2;

    if (!strcmp(registered, requested))
        return 1;
    /* RFC 8252 7.3: a native app's loopback redirect may come on any port */
    if (!(r1 = loopback_rest(registered, &h1)) || !(r2 = loopback_rest(requested, &h2)))
        return 0;
    return h1 == h2 && !strncasecmp(registered + 7, requested + 7, h1) && !strcmp(r1, r2);
}
