/* oauth_cimd.c: client ID metadata documents (the MCP authorization spec; IETF draft
 * "OAuth Client ID Metadata Document"): a client whose client_id is an https URL publishes
 * its metadata (client_name, redirect_uris) as a JSON document at that URL, and needs no
 * registration. The gateway fetches the document when the sign-in starts:
 *   - only over HTTPS (certificate checked against the system's CAs), no redirects, no
 *     proxy, at most oauth_cimd_max_bytes, within oauth_cimd_timeout_ms;
 *   - only from public addresses: every address libcurl is about to connect to (after DNS,
 *     so a name that resolves to a private address is refused too, and a rebinding answer
 *     cannot slip through) is checked, and loopback, private, link-local, carrier-grade
 *     NAT, documentation, multicast and reserved ranges are refused before any packet;
 *   - a few at a time per event loop (MAX_FETCHES), at most HOST_FETCHES from one host (so
 *     one slow host cannot hold every slot), never blocking the loop (sf_curl);
 *   - once for all who ask together (later callers wait on the running fetch), and the
 *     answer is kept for oauth_cimd_cache_s (a refusal: REFUSED_CACHE_S), in a cache of at
 *     most CACHE_MAX documents per event loop (the oldest go first).
 * The document must name itself (client_id equal to the URL), list acceptable redirect
 * URIs, and be a public client (no secret). */
#include "oauth.h"
#include "sf_buf.h"
#include "sf_curl.h"
#include "sf_log.h"
#include "sf_map.h"
#include "sf_util.h"
#include "sf_msg.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FETCHES 32     /* fetches running at once per event loop */
#define HOST_FETCHES 2     /* ...of them from one host */
#define MAX_WAITERS 64     /* callers waiting on one fetch */
#define CACHE_MAX 1024     /* documents (and refusals) kept per event loop */
#define REFUSED_CACHE_S 10 /* a refusal is kept this long (the client may fix its document) */
#define CIMD_URL_MAX 2048
#define NAME_MAX_LEN 200
#define MAX_REDIRECTS 10
#define WHY_MAX 400

/* A caller of gw_cimd_get waiting for its fetch. */
typedef struct waiter {
    struct waiter *next;
    gw_cimd_cb cb;
    void *arg;
} waiter;

/* A kept answer: the client record, or NULL and why it was refused. */
typedef struct cached {
    json_t *client;
    char why[WHY_MAX];
    int64_t until;   /* sf_mono_ms */
    uint64_t seq;    /* insertion order: the oldest goes first when the cache is full */
} cached;

typedef struct gw_cimd {
    sf_curl *http;
    struct fetch *live; /* fetches running, for gw_cimd_stop */
    int n;
    sf_map *cache;      /* URL -> cached */
    uint64_t seq;
} gw_cimd;

typedef struct fetch {
    struct fetch *next;
    gw_ctx *ctx;
    CURL *easy;
    struct curl_slist *headers;
    waiter *waiters;    /* everyone asking for this URL, the first caller last */
    int nwait;
    char url[CIMD_URL_MAX + 1];
    char *body;
    size_t len, max;
    int too_big;
    char refused[INET6_ADDRSTRLEN]; /* an address refused as not public */
    char errbuf[CURL_ERROR_SIZE];
} fetch;

/* ------------------------------------------------------------------ addresses */

static int v4_public(uint32_t a)
{
    static const struct {
        uint32_t net;
        int bits;
    } deny[] = {
        {0x00000000, 8},  /* "this" network */
        {0x0A000000, 8},  /* private */
        {0x64400000, 10}, /* carrier-grade NAT */
        {0x7F000000, 8},  /* loopback */
        {0xA9FE0000, 16}, /* link-local (and cloud metadata services) */
        {0xAC100000, 12}, /* private */
        {0xC0000000, 24}, /* IETF protocol assignments */
        {0xC0000200, 24}, /* documentation */
        {0xC0586300, 24}, /* 6to4 relay anycast */
        {0xC0A80000, 16}, /* private */
        {0xC6120000, 15}, /* benchmarking */
        {0xC6336400, 24}, /* documentation */
        {0xCB007100, 24}, /* documentation */
        {0xE0000000, 4},  /* multicast */
        {0xF0000000, 4},  /* reserved, broadcast */
    };

    for (size_t i = 0; i < SF_ARRAY_LEN(deny); i++)
        if ((a & ~(0xFFFFFFFFu >> deny[i].bits)) == deny[i].net)
            return 0;
    return 1;
}

int gw_cimd_addr_public(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return v4_public(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
    if (sa->sa_family == AF_INET6) {
        const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};
        if (!memcmp(b, mapped, 12) || !memcmp(b, nat64, 12)) /* an IPv4 address inside */
            return v4_public((uint32_t)b[12] << 24 | (uint32_t)b[13] << 16 |
                             (uint32_t)b[14] << 8 | b[15]);
        if ((b[0] & 0xE0) != 0x20) /* only global unicast (2000::/3) */
            return 0;
        if (b[0] == 0x20 && b[1] == 0x01 && b[2] < 0x02) /* 2001::/23 IETF (Teredo, ...) */
            return 0;
        if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) /* documentation */
            return 0;
        if (b[0] == 0x20 && b[1] == 0x02) /* 6to4: an IPv4 address of any kind inside */
            return 0;
        if (b[0] == 0x3f && b[1] == 0xff && (b[2] & 0xf0) == 0) /* 3fff::/20 documentation */
            return 0;
        return 1;
    }
    return 0;
}

/* libcurl asks for a socket to connect to addr: only a public one gets it. */
static curl_socket_t open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *addr)
{
    fetch *f = arg;

    if (purpose != CURLSOCKTYPE_IPCXN || !gw_cimd_addr_public(&addr->addr)) {
        const void *a = addr->family == AF_INET6
                            ? (const void *)&((struct sockaddr_in6 *)&addr->addr)->sin6_addr
                            : (const void *)&((struct sockaddr_in *)&addr->addr)->sin_addr;
        if (!inet_ntop(addr->family, a, f->refused, sizeof(f->refused)))
            snprintf(f->refused, sizeof(f->refused), "a non-IP address");
        return CURL_SOCKET_BAD;
    }
    return socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
}

/* ------------------------------------------------------------------ the URL */

int gw_cimd_is_url(const char *client_id)
{
    return client_id && (!strncasecmp(client_id, "https://", 8) ||
                         !strncasecmp(client_id, "http://", 7)); /* http: refused, and said why */
}

/* The rules of the draft: https, a host, a path, no user or password, no fragment, no dot
 * segments; and printable ASCII without quotes, spaces or angle brackets (it is shown and
 * stored). NULL when fine, else why not. */
static const char *url_problem(const char *u)
{
    size_t n = strlen(u);
    const char *host = u + 8, *path;

    if (n > CIMD_URL_MAX)
        return "the client_id URL is too long (at most 2048 characters)";
    if (strncmp(u, "https://", 8) != 0)
        return "a client_id URL must use https";
    for (size_t i = 0; i < n; i++)
        if (u[i] <= ' ' || u[i] >= 127 || strchr("\"'<>\\^`{|}", u[i]))
            return "the client_id URL holds characters a URL cannot hold unencoded";
    if (strchr(u, '#'))
        return "a client_id URL must not have a fragment";
    path = host + strcspn(host, "/?");
    if (memchr(host, '@', (size_t)(path - host)))
        return "a client_id URL must not hold a user name or password";
    if (path == host)
        return "the client_id URL names no host";
    if (*path != '/' || path[1] == '\0' || path[1] == '?')
        return "a client_id URL must have a path (https://host/some/path)";
    for (const char *s = path; *s && *s != '?'; s = s + 1 + strcspn(s + 1, "/?")) {
        size_t seg = strcspn(s + 1, "/?");
        if ((seg == 1 && s[1] == '.') || (seg == 2 && s[1] == '.' && s[2] == '.'))
            return "a client_id URL must not have . or .. path segments";
    }
    return NULL;
}

/* ------------------------------------------------------------------ the document */

static const char *jstr(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* The client record (as registration makes one) from the document at url, or NULL and
 * why. */
static json_t *client_from(const char *url, json_t *doc, char *why, size_t n)
{
    json_t *uris = json_object_get(doc, "redirect_uris"), *u, *list;
    const char *name = jstr(doc, "client_name"), *auth = jstr(doc, "token_endpoint_auth_method");
    const char *bad = NULL, *host = url + 8;
    char shown[NAME_MAX_LEN + 300];
    size_t i;

    if (!json_is_object(doc)) {
        snprintf(why, n, "Its client metadata document is not a JSON object.");
        return NULL;
    }
    if (!jstr(doc, "client_id") || strcmp(jstr(doc, "client_id"), url) != 0) {
        snprintf(why, n, "Its client metadata document must hold \"client_id\" equal to its own "
                         "address.");
        return NULL;
    }
    if (json_object_get(doc, "client_secret") || (auth && strcmp(auth, "none") != 0)) {
        snprintf(why, n, "Its client metadata document asks for client authentication; only "
                         "public clients (token_endpoint_auth_method \"none\") are supported.");
        return NULL;
    }
    if (!json_is_array(uris) || json_array_size(uris) == 0 || json_array_size(uris) > MAX_REDIRECTS) {
        snprintf(why, n, "Its client metadata document must list 1 to 10 redirect_uris.");
        return NULL;
    }
    json_array_foreach(uris, i, u)
        if (!json_is_string(u) || !gw_oauth_redirect_uri_ok(json_string_value(u), &bad)) {
            snprintf(why, n, "Its client metadata document lists a refused redirect URI: %s.",
                     bad ? bad : "not a string");
            return NULL;
        }
    if (name && strlen(name) > NAME_MAX_LEN) {
        snprintf(why, n, "Its client_name is too long (at most 200 characters).");
        return NULL;
    }
    /* the name is the client's own claim: the page shows where the document lives too */
    snprintf(shown, sizeof(shown), "%s (%.*s)", name ? name : "An application",
             (int)strcspn(host, "/?"), host);
    list = json_deep_copy(uris);
    return json_pack("{s:s, s:s, s:o, s:b}", "client_id", url, "client_name", shown,
                     "redirect_uris", list, "metadata_document", 1);
}

/* ------------------------------------------------------------------ fetching */

static size_t on_body(char *p, size_t size, size_t nmemb, void *arg)
{
    fetch *f = arg;
    size_t n = size * nmemb;

    if (f->len + n > f->max) {
        f->too_big = 1;
        return 0; /* aborts the transfer */
    }
    memcpy(f->body + f->len, p, n);
    f->len += n;
    return n;
}

static void fetch_free(fetch *f)
{
    gw_cimd *c = f->ctx->cimd;

    for (fetch **pp = &c->live; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            c->n--;
            break;
        }
    if (f->easy) {
        sf_curl_remove(c->http, f->easy);
        curl_easy_cleanup(f->easy);
    }
    curl_slist_free_all(f->headers);
    free(f->body);
    free(f);
}

/* ------------------------------------------------------------------ the cache */

static void cached_free(cached *e)
{
    json_decref(e->client);
    free(e);
}

static void cache_drop(gw_cimd *c, const char *url)
{
    cached *e = sf_map_del(c->cache, url);

    if (e)
        cached_free(e);
}

typedef struct oldest {
    const char *key;
    uint64_t seq;
} oldest;

static void find_oldest(const char *key, void *val, void *arg)
{
    oldest *o = arg;
    const cached *e = val;

    if (!o->key || e->seq < o->seq) {
        o->key = key;
        o->seq = e->seq;
    }
}

/* Keeps url's answer (client, or NULL and why) for ttl_s; when the cache is full, the
 * oldest entry goes (an expired one goes when it is next asked for, or as the oldest). */
static void cache_put(gw_cimd *c, const char *url, json_t *client, const char *why, int64_t ttl_s)
{
    cached *e;

    if (ttl_s <= 0 || !c->cache || !(e = calloc(1, sizeof(*e))))
        return;
    cache_drop(c, url);
    if (sf_map_len(c->cache) >= CACHE_MAX) {
        oldest o = {0};
        char victim[CIMD_URL_MAX + 1];
        sf_map_foreach(c->cache, find_oldest, &o);
        if (o.key) {
            snprintf(victim, sizeof(victim), "%s", o.key); /* the key goes with its entry */
            cache_drop(c, victim);
        }
    }
    e->client = json_incref(client);
    snprintf(e->why, sizeof(e->why), "%s", why ? why : "");
    e->until = sf_mono_ms() + ttl_s * 1000;
    e->seq = ++c->seq;
    if (sf_map_put(c->cache, url, e) < 0)
        cached_free(e);
}

/* url's kept answer, or NULL (none, or expired: then dropped). */
static cached *cache_get(gw_cimd *c, const char *url)
{
    cached *e = c->cache ? sf_map_get(c->cache, url) : NULL;

    if (e && e->until <= sf_mono_ms()) {
        cache_drop(c, url);
        return NULL;
    }
    return e;
}

/* ------------------------------------------------------------------ answers */

/* Answers every waiter of f (f is already freed by then: they get their own copies). */
static void answer_all(waiter *w, json_t *client, const char *why)
{
    while (w) {
        waiter *next = w->next;
        w->cb(w->arg, client, client ? NULL : why);
        free(w);
        w = next;
    }
}

static void on_done(void *arg, CURLcode result)
{
    fetch *f = arg;
    long status = 0;
    char why[WHY_MAX], url[CIMD_URL_MAX + 1];
    json_t *doc = NULL, *client = NULL;
    waiter *w = f->waiters;
    gw_cimd *c = f->ctx->cimd;
    int64_t ttl = f->ctx->cfg.oauth_cimd_cache_s;

    curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &status);
    if (f->refused[0]) {
        /* the address goes to the log only: the page is no oracle for internal names */
        sf_info("msg=\"client metadata document host is not public\" url=\"%s\" addr=%s",
                f->url, f->refused);
        snprintf(why, sizeof(why), "Its client metadata document's host is a loopback, private "
                 "or reserved address; documents are fetched only from public addresses.");
    } else if (f->too_big || result == CURLE_FILESIZE_EXCEEDED) {
        snprintf(why, sizeof(why), "Its client metadata document is larger than %zu bytes.",
                 f->max);
    } else if (result == CURLE_OPERATION_TIMEDOUT) {
        snprintf(why, sizeof(why), "Its client metadata document did not arrive within %lld ms.",
                 (long long)f->ctx->cfg.oauth_cimd_timeout_ms);
    } else if (result != CURLE_OK) {
        snprintf(why, sizeof(why), "Its client metadata document could not be fetched: %s.",
                 f->errbuf[0] ? f->errbuf : curl_easy_strerror(result));
    } else if (status != 200) {
        snprintf(why, sizeof(why), "Its client metadata document's address answered HTTP %ld "
                 "(redirects are not followed).", status);
    } else if (!(doc = json_loadb(f->body, f->len, JSON_REJECT_DUPLICATES, NULL))) {
        snprintf(why, sizeof(why), "Its client metadata document is not valid JSON.");
    } else {
        client = client_from(f->url, doc, why, sizeof(why));
    }
    if (!client)
        sf_info("msg=\"client metadata document refused\" url=\"%s\" why=\"%s\"", f->url, why);
    json_decref(doc);
    snprintf(url, sizeof(url), "%s", f->url);
    f->waiters = NULL;
    fetch_free(f);
    cache_put(c, url, client, why, client ? ttl : (ttl < REFUSED_CACHE_S ? ttl : REFUSED_CACHE_S));
    answer_all(w, client, why);
    json_decref(client);
}

/* The length of url's authority (host and port): fetches per host are counted by it. */
static size_t host_len(const char *url)
{
    return strcspn(url + 8, "/?");
}

void gw_cimd_get(gw_ctx *ctx, const char *client_id, gw_cimd_cb cb, void *arg)
{
    const char *problem = url_problem(client_id);
    char why[WHY_MAX];
    gw_cimd *c = ctx->cimd;
    fetch *f = NULL;

    if (problem) {
        snprintf(why, sizeof(why), "Its client_id is not a usable metadata document address: %s.",
                 problem);
        cb(arg, NULL, why);
        return;
    }
    if (ctx->cimd_local) { /* the operator's */
        json_t *mine = gw_cimd_local_find(ctx->cimd_local, client_id);
        if (mine) {
            cb(arg, mine, NULL);
            json_decref(mine);
            return;
        }
    }
    if (!c && (!(c = ctx->cimd = calloc(1, sizeof(*c))) ||
               !(c->http = sf_curl_new(ctx->d.base)) || !(c->cache = sf_map_new(CACHE_MAX)))) {
        if (c) {
            sf_curl_free(c->http);
            free(c);
        }
        ctx->cimd = NULL;
        cb(arg, NULL, SF_MSG_CIMD_FETCH_FAILED);
        return;
    }
    {
        cached *e = cache_get(c, client_id);
        if (e) {
            json_t *client = json_incref(e->client);
            snprintf(why, sizeof(why), "%s", e->why);
            cb(arg, client, client ? NULL : why);
            json_decref(client);
            return;
        }
    }
    {
        size_t hl = host_len(client_id);
        int from_host = 0;
        for (fetch *l = c->live; l; l = l->next) {
            if (!strcmp(l->url, client_id)) { /* being fetched: wait for that answer */
                waiter *w;
                if (l->nwait >= MAX_WAITERS || !(w = malloc(sizeof(*w)))) {
                    cb(arg, NULL, "The server is fetching this client metadata document for "
                                  "too many sign-ins at once; retry in a few seconds.");
                    return;
                }
                w->cb = cb;
                w->arg = arg;
                w->next = l->waiters;
                l->waiters = w;
                l->nwait++;
                return;
            }
            if (host_len(l->url) == hl && !strncmp(l->url + 8, client_id + 8, hl))
                from_host++;
        }
        if (from_host >= HOST_FETCHES) {
            cb(arg, NULL, "The server is already fetching client metadata documents from that "
                          "host; retry in a few seconds.");
            return;
        }
    }
    if (c->n >= MAX_FETCHES) {
        cb(arg, NULL, "The server is fetching too many client metadata documents at once; retry "
                      "in a few seconds.");
        return;
    }
    if (!(f = calloc(1, sizeof(*f))) || !(f->body = malloc((size_t)ctx->cfg.oauth_cimd_max_bytes)) ||
        !(f->easy = curl_easy_init()) ||
        !(f->headers = curl_slist_append(NULL, "Accept: application/json")) ||
        !(f->waiters = calloc(1, sizeof(*f->waiters))))
        goto fail;
    f->ctx = ctx;
    f->waiters->cb = cb;
    f->waiters->arg = arg;
    f->nwait = 1;
    f->max = (size_t)ctx->cfg.oauth_cimd_max_bytes;
    snprintf(f->url, sizeof(f->url), "%s", client_id);
    curl_easy_setopt(f->easy, CURLOPT_URL, f->url);
    curl_easy_setopt(f->easy, CURLOPT_PROTOCOLS_STR, "https");
    curl_easy_setopt(f->easy, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(f->easy, CURLOPT_PROXY, ""); /* never through a proxy from the environment */
    curl_easy_setopt(f->easy, CURLOPT_NOSIGNAL, 1L);
    /* each fetch on its own connection and handshake: rare, and nothing carries over */
    curl_easy_setopt(f->easy, CURLOPT_FRESH_CONNECT, 1L);
    curl_easy_setopt(f->easy, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(f->easy, CURLOPT_SSL_SESSIONID_CACHE, 0L);
    curl_easy_setopt(f->easy, CURLOPT_TIMEOUT_MS, (long)ctx->cfg.oauth_cimd_timeout_ms);
    curl_easy_setopt(f->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)ctx->cfg.oauth_cimd_timeout_ms);
    curl_easy_setopt(f->easy, CURLOPT_MAXFILESIZE, (long)f->max);
    curl_easy_setopt(f->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(f->easy, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(f->easy, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(f->easy, CURLOPT_OPENSOCKETDATA, f);
    curl_easy_setopt(f->easy, CURLOPT_HTTPHEADER, f->headers);
    curl_easy_setopt(f->easy, CURLOPT_USERAGENT, "sandfleet-gateway (client metadata)");
    curl_easy_setopt(f->easy, CURLOPT_ERRORBUFFER, f->errbuf);
    if (ctx->cfg.oauth_cimd_ca_file[0])
        curl_easy_setopt(f->easy, CURLOPT_CAINFO, ctx->cfg.oauth_cimd_ca_file);
    if (sf_curl_add(c->http, f->easy, on_done, f) < 0)
        goto fail;
    f->next = c->live;
    c->live = f;
    c->n++;
    return;
fail:
    if (f) {
        if (f->easy)
            curl_easy_cleanup(f->easy);
        curl_slist_free_all(f->headers);
        free(f->waiters);
        free(f->body);
        free(f);
    }
    cb(arg, NULL, SF_MSG_CIMD_FETCH_FAILED);
}

static void free_cached(const char *key, void *val, void *arg)
{
    (void)key;
    (void)arg;
    cached_free(val);
}

void gw_cimd_stop(gw_ctx *ctx)
{
    gw_cimd *c = ctx->cimd;

    if (!c)
        return;
    while (c->live) { /* their requests are gone; their callbacks free what they hold */
        fetch *f = c->live;
        waiter *w = f->waiters;
        f->waiters = NULL;
        fetch_free(f);
        answer_all(w, NULL, "The gateway is stopping.");
    }
    sf_curl_free(c->http);
    sf_map_foreach(c->cache, free_cached, NULL);
    sf_map_free(c->cache);
    free(c);
    ctx->cimd = NULL;
}

/* ------------------------------------------------------------------ the operator's */

#define LOCAL_MAX 256              /* documents in oauth_cimd_dir */
#define LOCAL_BYTES (64u * 1024)   /* ...each at most this large */

#define ID_MARK "{id}"      /* in an operator's client_id: one path segment (ID_MAX) */
#define ID_MAX 64

/* s with every ID_MARK replaced by id (a new string), or NULL. */
static char *with_id(const char *s, const char *id)
{
    sf_buf b;
    const char *m;
    char *out;

    sf_buf_init(&b, CIMD_URL_MAX + 1);
    while ((m = strstr(s, ID_MARK))) {
        if (sf_buf_append(&b, s, (size_t)(m - s)) < 0 || sf_buf_append(&b, id, strlen(id)) < 0)
            goto fail;
        s = m + strlen(ID_MARK);
    }
    if (sf_buf_append(&b, s, strlen(s) + 1) < 0)
        goto fail;
    out = strdup(b.p);
    sf_buf_fini(&b);
    return out;
fail:
    sf_buf_fini(&b);
    return NULL;
}

/* The id url gives a template's ID_MARK (prefix ID_MARK suffix), into id; 0 or -1. */
static int id_of(const char *tpl, const char *url, char id[ID_MAX + 1])
{
    const char *m = strstr(tpl, ID_MARK), *suffix;
    size_t pre, suf, len, n = strlen(url);

    if (!m)
        return -1;
    pre = (size_t)(m - tpl);
    suffix = m + strlen(ID_MARK);
    suf = strlen(suffix);
    if (n < pre + suf + 1 || strncmp(url, tpl, pre) != 0 || strcmp(url + n - suf, suffix) != 0)
        return -1;
    len = n - pre - suf;
    if (len > ID_MAX)
        return -1;
    for (size_t i = 0; i < len; i++) {
        char ch = url[pre + i];
        if (!isalnum((unsigned char)ch) && ch != '-' && ch != '_')
            return -1;
    }
    memcpy(id, url + pre, len);
    id[len] = '\0';
    return 0;
}

json_t *gw_cimd_local_find(json_t *table, const char *client_id)
{
    const char *tpl;
    json_t *rec, *u, *uris;
    char id[ID_MAX + 1];
    size_t i;

    if ((rec = json_object_get(table, client_id)) && !strstr(client_id, ID_MARK))
        return json_incref(rec);
    json_object_foreach(table, tpl, rec) {
        json_t *out;
        if (!strstr(tpl, ID_MARK) || id_of(tpl, client_id, id) < 0)
            continue;
        /* a template: its record with the id put in (client_id, redirect URIs) */
        if (!(out = json_deep_copy(rec)) || !(uris = json_array())) {
            json_decref(out);
            return NULL;
        }
        json_object_set_new(out, "client_id", json_string(client_id));
        json_array_foreach(json_object_get(rec, "redirect_uris"), i, u) {
            char *s = with_id(json_string_value(u), id);
            if (!s || json_array_append_new(uris, json_string(s)) < 0) {
                free(s);
                json_decref(uris);
                json_decref(out);
                return NULL;
            }
            free(s);
        }
        json_object_set_new(out, "redirect_uris", uris);
        return out;
    }
    return NULL;
}

/* 1 when u is a loopback redirect URI (http or https on localhost, 127.0.0.1 or [::1]). */
static int loopback_uri(const char *u)
{
    const char *a = !strncasecmp(u, "http://", 7) ? u + 7 : !strncasecmp(u, "https://", 8) ? u + 8 : NULL;
    size_t h;

    if (!a)
        return 0;
    h = strcspn(a, ":/?");
    if (a[0] == '[')
        h = strcspn(a, "]") + 1;
    return (h == 9 && !strncasecmp(a, "localhost", 9)) || (h == 9 && !strncmp(a, "127.0.0.1", 9)) ||
           (h == 5 && !strncmp(a, "[::1]", 5));
}

/* One document file: its client record into table (keyed by its client_id), or -1 and why. */
static int local_one(int dfd, const char *name, int any_redirect, json_t *table, char *why,
                     size_t n)
{
    char buf[LOCAL_BYTES + 1], reason[WHY_MAX];
    const char *id;
    size_t len = 0, i;
    ssize_t r;
    json_t *doc, *client, *u;
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;

    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, n, "%s is not a readable regular file", name);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    while (len < sizeof(buf) && (r = read(fd, buf + len, sizeof(buf) - len)) > 0)
        len += (size_t)r;
    close(fd);
    if (len > LOCAL_BYTES) {
        snprintf(why, n, "%s is larger than 64 KiB", name);
        return -1;
    }
    if (!(doc = json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL)) || !json_is_object(doc) ||
        !(id = jstr(doc, "client_id"))) {
        snprintf(why, n, "%s is not a JSON object with a client_id", name);
        json_decref(doc);
        return -1;
    }
    {
        /* a template's {id} stands for one path segment: checked as if it were one */
        char *probe = with_id(id, "x");
        const char *problem = probe ? url_problem(probe) : "out of memory";
        if (problem || (strstr(id, ID_MARK) && (strstr(strstr(id, ID_MARK) + 1, ID_MARK) ||
                                                !strstr(id + 8, "/" ID_MARK "/")))) {
            snprintf(why, n, "%s: its client_id is not a usable metadata document address: %s",
                     name, problem ? problem : "{id} must stand for one whole path segment, "
                                               "once");
            free(probe);
            json_decref(doc);
            return -1;
        }
        free(probe);
    }
    client = client_from(id, doc, reason, sizeof(reason));
    json_decref(doc); /* id is the client's own copy from here on */
    if (!client) {
        snprintf(why, n, "%s: %s", name, reason);
        return -1;
    }
    id = jstr(client, "client_id");
    json_array_foreach(json_object_get(client, "redirect_uris"), i, u)
        if (!any_redirect && !loopback_uri(json_string_value(u))) {
            snprintf(why, n, "%s lists the redirect URI %s, which is not on loopback "
                     "(localhost, 127.0.0.1, [::1]); an operator's document may hold only "
                     "those unless oauth_cimd_dir_any_redirect is set", name, json_string_value(u));
            json_decref(client);
            return -1;
        }
    if (json_object_get(table, id)) {
        snprintf(why, n, "%s: another document in the folder has the client_id %s", name, id);
        json_decref(client);
        return -1;
    }
    json_object_set_new(client, "operator_document", json_true());
    json_object_set_new(table, id, client);
    return 0;
}

int gw_cimd_local_load(const char *dir, int any_redirect, json_t **out, char *why, size_t n)
{
    json_t *table = json_object();
    int dfd, rc = 0;
    size_t count = 0;
    DIR *d;
    struct dirent *e;

    *out = NULL;
    if (!dir || !dir[0]) {
        json_decref(table);
        return 0;
    }
    if (!table || (dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        !(d = fdopendir(dfd))) {
        snprintf(why, n, "oauth_cimd_dir %s cannot be read (%s); point it at a folder of "
                 "client ID metadata documents, or set it empty", dir, strerror(errno));
        json_decref(table);
        return -1;
    }
    while (rc == 0 && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        char one[WHY_MAX + 300];
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0 || e->d_name[0] == '.')
            continue;
        if (++count > LOCAL_MAX) {
            snprintf(why, n, "oauth_cimd_dir %s holds more than %d documents", dir, LOCAL_MAX);
            rc = -1;
        } else if (local_one(dirfd(d), e->d_name, any_redirect, table, one, sizeof(one)) < 0) {
            snprintf(why, n, "oauth_cimd_dir %s: %s; fix or remove that file", dir, one);
            rc = -1;
        }
    }
    closedir(d);
    if (rc < 0) {
        json_decref(table);
        return -1;
    }
    *out = table;
    return 0;
}
