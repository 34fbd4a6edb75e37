#include "sf_secrets.h"
#include "sf_store.h"
#include "sf_auth.h"
#include "sf_util.h"
#include "sf_msg.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AD_PREFIX "sf-secret-v1"
#define NONCE_LEN crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
#define TAG_LEN crypto_aead_xchacha20poly1305_ietf_ABYTES

static const char b62[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

void sf_secret_init(sf_secret *s)
{
    memset(s, 0, sizeof(*s));
}

void sf_secret_fini(sf_secret *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->hosts_n; i++)
        free(s->hosts[i]);
    if (s->value)
        sodium_free(s->value);
    memset(s, 0, sizeof(*s));
}

int sf_secrets_key_load(const char *path, uint8_t key[SF_SECRET_KEY_BYTES], char *why,
                        size_t whylen)
{
    char inner[400];
    int rc = sf_auth_secret_load(path, key, inner, sizeof(inner));

    if (rc < 0)
        snprintf(why, whylen, "Cannot load the secrets master key %s (%s); check "
                 "SF_SECRETS_KEY_FILE and its permissions.", path, inner);
    return rc;
}

int sf_secret_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;

    if (n == 0 || n >= SF_SECRET_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '_' && name[i] != '-')
            return 0;
    return 1;
}

static int label_ok(const char *s, size_t n)
{
    if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_')
            return 0;
    return 1;
}

/* True for a DNS name of labels [a-z0-9_-] (already lower-case), at most 253 bytes. */
static int dns_name_ok(const char *s)
{
    size_t n = strlen(s);
    const char *p = s;

    if (n == 0 || n > 253)
        return 0;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        if (!label_ok(p, l))
            return 0;
        p += l;
        if (*p == '.')
            p++;
        if (dot && !*p)
            return 0; /* trailing dot */
    }
    return 1;
}

int sf_secret_host_norm(const char *in, char out[SF_SECRET_HOST_MAX + 1], char *why,
                        size_t whylen)
{
    size_t n = in ? strlen(in) : 0;
    struct in_addr a;

    if (n == 0 || n > SF_SECRET_HOST_MAX) {
        snprintf(why, whylen, "An allowed host must be 1 to %d characters.", SF_SECRET_HOST_MAX);
        return -EINVAL;
    }
    for (size_t i = 0; i <= n; i++)
        out[i] = (char)tolower((unsigned char)in[i]);
    if (inet_pton(AF_INET, out, &a) == 1)
        return 0;
    if (!dns_name_ok(out[0] == '*' && out[1] == '.' ? out + 2 : out) ||
        (out[0] == '*' && out[1] != '.')) {
        snprintf(why, whylen, "Allowed host '%.80s' is not a host name, a '*.' wildcard "
                 "(e.g. *.example.com) or an IPv4 address.", in);
        return -EINVAL;
    }
    return 0;
}

int sf_secret_host_match(const char *pattern, const char *host)
{
    size_t pl, hl;

    if (!pattern || !host)
        return 0;
    if (pattern[0] == '*' && pattern[1] == '.') {
        pl = strlen(pattern + 1); /* ".example.com" */
        hl = strlen(host);
        return hl > pl && !strcasecmp(host + hl - pl, pattern + 1);
    }
    return !strcasecmp(pattern, host);
}

int sf_secret_value_check(const uint8_t *v, size_t n, char *why, size_t whylen)
{
    if (n == 0 || n > SF_SECRET_VALUE_MAX) {
        snprintf(why, whylen, "A secret value must be 1 to %d bytes (read from standard input).",
                 SF_SECRET_VALUE_MAX);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if (v[i] == '\r' || v[i] == '\n' || v[i] == '\0') {
            snprintf(why, whylen, "A secret value goes into an HTTP header, so it cannot contain "
                     "line breaks or NUL bytes.");
            return -EINVAL;
        }
    return 0;
}

int sf_secret_format_check(const char *header, const char *format, char *why, size_t whylen)
{
    const char *p;

    if (header && *header) {
        if (strlen(header) >= SF_SECRET_HEADER_MAX)
            goto bad_header;
        for (p = header; *p; p++)
            if (!isalnum((unsigned char)*p) && !strchr("!#$%&'*+-.^_`|~", *p))
                goto bad_header;
    }
    if (format && *format) {
        if (!header || !*header) {
            snprintf(why, whylen, "--format needs --header: it says how that header's value is "
                     "written.");
            return -EINVAL;
        }
        if (strlen(format) >= SF_SECRET_FORMAT_MAX || strpbrk(format, "\r\n") ||
            !(p = strstr(format, "{}")) || strstr(p + 2, "{}")) {
            snprintf(why, whylen, "--format must contain '{}' (where the value goes) exactly "
                     "once, no line breaks, at most %d characters.", SF_SECRET_FORMAT_MAX - 1);
            return -EINVAL;
        }
    }
    return 0;
bad_header:
    snprintf(why, whylen, "--header must be an HTTP header name (letters, digits, '-'), e.g. "
             "Authorization.");
    return -EINVAL;
}

/* "sf-secret-v1\0team\0name" */
static size_t ad_build(char *ad, size_t cap, const char *team, const char *name)
{
    size_t a = sizeof(AD_PREFIX), t = strlen(team) + 1, n = strlen(name);

    if (a + t + n > cap)
        return 0;
    memcpy(ad, AD_PREFIX, a);
    memcpy(ad + a, team, t);
    memcpy(ad + a + t, name, n);
    return a + t + n;
}

int sf_secret_seal(const uint8_t key[SF_SECRET_KEY_BYTES], const char *team, const char *name,
                   const uint8_t *value, size_t n, char **out)
{
    char ad[256];
    size_t adl = ad_build(ad, sizeof(ad), team, name), blen, b64len;
    uint8_t *box;
    unsigned long long clen = 0;
    char *b64;

    if (!adl || n > SF_SECRET_VALUE_MAX)
        return -EINVAL;
    blen = NONCE_LEN + n + TAG_LEN;
    if (!(box = malloc(blen)))
        return -ENOMEM;
    randombytes_buf(box, NONCE_LEN);
    crypto_aead_xchacha20poly1305_ietf_encrypt(box + NONCE_LEN, &clen, value, n,
                                               (const uint8_t *)ad, adl, NULL, box, key);
    b64len = sodium_base64_encoded_len(blen, sodium_base64_VARIANT_ORIGINAL);
    if (!(b64 = malloc(b64len))) {
        free(box);
        return -ENOMEM;
    }
    sodium_bin2base64(b64, b64len, box, NONCE_LEN + (size_t)clen,
                      sodium_base64_VARIANT_ORIGINAL);
    free(box);
    *out = b64;
    return 0;
}

int sf_secret_open(const uint8_t key[SF_SECRET_KEY_BYTES], const char *team, const char *name,
                   const char *sealed, uint8_t **value, size_t *n)
{
    char ad[256];
    size_t adl = ad_build(ad, sizeof(ad), team, name), slen = strlen(sealed), blen = 0;
    size_t cap = slen / 4 * 3 + 3;
    uint8_t *box, *plain;
    unsigned long long plen = 0;
    int rc = -EBADMSG;

    if (!adl || cap > NONCE_LEN + TAG_LEN + SF_SECRET_VALUE_MAX + 3)
        return -EBADMSG;
    if (!(box = malloc(cap)))
        return -ENOMEM;
    if (sodium_base642bin(box, cap, sealed, slen, NULL, &blen, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0 ||
        blen < NONCE_LEN + TAG_LEN)
        goto out;
    if (!(plain = sodium_malloc(blen - NONCE_LEN - TAG_LEN + 1))) {
        rc = -ENOMEM;
        goto out;
    }
    if (crypto_aead_xchacha20poly1305_ietf_decrypt(plain, &plen, NULL, box + NONCE_LEN,
                                                   blen - NONCE_LEN, (const uint8_t *)ad, adl,
                                                   box, key) != 0) {
        sodium_free(plain);
        goto out;
    }
    plain[plen] = '\0';
    *value = plain;
    *n = (size_t)plen;
    rc = 0;
out:
    sodium_memzero(box, cap);
    free(box);
    return rc;
}

static int redis_failed(redisContext *c, redisReply *r, char *why, size_t whylen)
{
    if (!r) {
        snprintf(why, whylen, "Redis is unreachable (%s); check SF_REDIS_URL.", c->errstr);
        return 1;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(why, whylen, "Redis refused the command: %.200s.", r->str);
        freeReplyObject(r);
        return 1;
    }
    return 0;
}

static char *hosts_json(const sf_secret *s)
{
    json_t *a = json_array();
    char *txt;

    for (size_t i = 0; i < s->hosts_n; i++)
        json_array_append_new(a, json_string(s->hosts[i]));
    txt = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return txt;
}

static int meta_check(const sf_secret *m, const uint8_t *value, size_t n, char *why,
                      size_t whylen)
{
    if (!sf_id_valid(m->team) || !sf_secret_name_valid(m->name)) {
        snprintf(why, whylen, "Team must be [a-z0-9_-] and the secret name [A-Za-z0-9_-], at "
                 "most 63 characters each.");
        return -EINVAL;
    }
    return sf_secret_value_check(value, n, why, whylen);
}

int sf_secrets_create(redisContext *c, const uint8_t key[SF_SECRET_KEY_BYTES],
                      const sf_secret *m, const uint8_t *value, size_t n, char *why,
                      size_t whylen)
{
    char k1[200], k2[200], now[24], cap[16], *sealed = NULL, *hosts = NULL;
    redisReply *r;
    int rc;

    if ((rc = meta_check(m, value, n, why, whylen)) < 0 ||
        (rc = sf_secret_format_check(m->header, m->format, why, whylen)) < 0)
        return rc;
    if (m->any_header && m->header[0]) {
        snprintf(why, whylen, "--any-header and --header exclude each other: name the one "
                 "header, or let the value go into any header.");
        return -EINVAL;
    }
    if (m->hosts_n == 0) {
        snprintf(why, whylen, "Give at least one --allowed-host: the value is only ever sent "
                 "to those hosts.");
        return -EINVAL;
    }
    if ((rc = sf_secret_seal(key, m->team, m->name, value, n, &sealed)) < 0)
        return rc;
    if (!(hosts = hosts_json(m))) {
        free(sealed);
        return -ENOMEM;
    }
    snprintf(k1, sizeof(k1), SF_RK_SECRET, m->team, m->name);
    snprintf(k2, sizeof(k2), SF_RK_TEAM_SECRETS, m->team);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(cap, sizeof(cap), "%d", SF_SECRETS_TEAM_MAX);
    {
        const char *argv[] = {k1, k2, m->name, m->team, sealed, hosts, m->header, m->format,
                              now, "1", cap, m->any_header ? "1" : "0",
                              m->allow_http ? "1" : "0"};
        r = sf_redis_script_sync(c, &sf_store_secret_create, 2, 11, argv, NULL);
    }
    free(sealed);
    free(hosts);
    if (redis_failed(c, r, why, whylen))
        return -EIO;
    rc = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 1;
    freeReplyObject(r);
    if (rc == 0) {
        snprintf(why, whylen, "Team %s already has a secret named %s; change it with "
                 "`sandfleet secrets rotate`.", m->team, m->name);
        return -EEXIST;
    }
    if (rc < 0) {
        snprintf(why, whylen, "Team %s holds %d secrets, the most allowed; delete one first.",
                 m->team, SF_SECRETS_TEAM_MAX);
        return -ENOSPC;
    }
    r = sf_redis_sync_cmd(c, "SADD " SF_RK_SECRETS_TEAMS " %s", m->team);
    if (redis_failed(c, r, why, whylen))
        return -EIO;
    freeReplyObject(r);
    return 0;
}

int sf_secrets_rotate(redisContext *c, const uint8_t key[SF_SECRET_KEY_BYTES],
                      const sf_secret *m, const uint8_t *value, size_t n, char *why,
                      size_t whylen)
{
    char k1[200], now[24], *sealed = NULL, *hosts = NULL;
    redisReply *r;
    int rc;

    if ((rc = meta_check(m, value, n, why, whylen)) < 0)
        return rc;
    if ((rc = sf_secret_seal(key, m->team, m->name, value, n, &sealed)) < 0)
        return rc;
    if (m->hosts_n && !(hosts = hosts_json(m))) {
        free(sealed);
        return -ENOMEM;
    }
    snprintf(k1, sizeof(k1), SF_RK_SECRET, m->team, m->name);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    {
        const char *argv[] = {k1, sealed, now, hosts ? hosts : ""};
        r = sf_redis_script_sync(c, &sf_store_secret_rotate, 1, 3, argv, NULL);
    }
    free(sealed);
    free(hosts);
    if (redis_failed(c, r, why, whylen))
        return -EIO;
    rc = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    freeReplyObject(r);
    if (!rc) {
        snprintf(why, whylen, SF_MSG_SECRET_UNKNOWN_FMT,
                 m->team, m->name);
        return -ENOENT;
    }
    return 0;
}

int sf_secrets_delete(redisContext *c, const char *team, const char *name, char *why,
                      size_t whylen)
{
    char k1[200], k2[200];
    redisReply *r;
    int found;

    if (!sf_id_valid(team) || !sf_secret_name_valid(name)) {
        snprintf(why, whylen, "Give --team and --name of an existing secret.");
        return -EINVAL;
    }
    snprintf(k1, sizeof(k1), SF_RK_SECRET, team, name);
    snprintf(k2, sizeof(k2), SF_RK_TEAM_SECRETS, team);
    {
        const char *argv[] = {k1, k2, name};
        r = sf_redis_script_sync(c, &sf_store_secret_delete, 2, 1, argv, NULL);
    }
    if (redis_failed(c, r, why, whylen))
        return -EIO;
    found = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    freeReplyObject(r);
    if (!found) {
        snprintf(why, whylen, SF_MSG_SECRET_UNKNOWN_FMT,
                 team, name);
        return -ENOENT;
    }
    return 0;
}

int sf_secret_from_reply(const redisReply *r, sf_secret *s, char **sealed)
{
    const char *hosts = NULL, *val = NULL;
    json_t *a;

    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0)
        return -ENOENT;
    sf_secret_init(s);
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *k = r->element[i]->str, *v = r->element[i + 1]->str;
        if (!k || !v)
            continue;
        if (!strcmp(k, "name"))
            snprintf(s->name, sizeof(s->name), "%s", v);
        else if (!strcmp(k, "team"))
            snprintf(s->team, sizeof(s->team), "%s", v);
        else if (!strcmp(k, "header"))
            snprintf(s->header, sizeof(s->header), "%s", v);
        else if (!strcmp(k, "format"))
            snprintf(s->format, sizeof(s->format), "%s", v);
        else if (!strcmp(k, "any_header"))
            s->any_header = !strcmp(v, "1");
        else if (!strcmp(k, "allow_http"))
            s->allow_http = !strcmp(v, "1");
        else if (!strcmp(k, "hosts"))
            hosts = v;
        else if (!strcmp(k, "value"))
            val = v;
        else if (!strcmp(k, "created"))
            sf_parse_i64(v, 0, INT64_MAX, &s->created_ms);
        else if (!strcmp(k, "updated"))
            sf_parse_i64(v, 0, INT64_MAX, &s->updated_ms);
        else if (!strcmp(k, "version"))
            sf_parse_i64(v, 0, INT64_MAX, &s->version);
    }
    if (!*s->name || !val)
        return -ENOENT;
    if (hosts && (a = json_loads(hosts, 0, NULL))) {
        size_t i;
        json_t *h;
        json_array_foreach(a, i, h) {
            if (s->hosts_n < SF_SECRET_HOSTS_MAX && json_is_string(h))
                s->hosts[s->hosts_n++] = strdup(json_string_value(h));
        }
        json_decref(a);
    }
    if (sealed && !(*sealed = strdup(val))) {
        sf_secret_fini(s);
        return -ENOMEM;
    }
    return 0;
}

json_t *sf_secret_json(const sf_secret *s)
{
    json_t *o = json_object(), *h = json_array();

    for (size_t i = 0; i < s->hosts_n; i++)
        json_array_append_new(h, json_string(s->hosts[i] ? s->hosts[i] : ""));
    json_object_set_new(o, "name", json_string(s->name));
    json_object_set_new(o, "allowed_hosts", h);
    json_object_set_new(o, "header", json_string(s->header));
    json_object_set_new(o, "format", json_string(s->format));
    json_object_set_new(o, "any_header", json_boolean(!s->header[0] && s->any_header));
    json_object_set_new(o, "allow_http", json_boolean(s->allow_http));
    json_object_set_new(o, "created_ms", json_integer(s->created_ms));
    json_object_set_new(o, "updated_ms", json_integer(s->updated_ms));
    json_object_set_new(o, "version", json_integer(s->version));
    return o;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int sf_secrets_list(redisContext *c, const char *team, json_t **out, char *why, size_t whylen)
{
    redisReply *r;
    json_t *arr;
    char **names;
    size_t n;

    if (!sf_id_valid(team)) {
        snprintf(why, whylen, "Team must be [a-z0-9_-], at most 63 characters.");
        return -EINVAL;
    }
    r = sf_redis_sync_cmd(c, "SMEMBERS " SF_RK_TEAM_SECRETS, team);
    if (redis_failed(c, r, why, whylen))
        return -EIO;
    n = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
    if (!(names = calloc(n + 1, sizeof(*names)))) {
        freeReplyObject(r);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        names[i] = r->element[i]->str;
    qsort(names, n, sizeof(*names), cmp_str);
    arr = json_array();
    for (size_t i = 0; i < n; i++) {
        redisReply *h;
        sf_secret s;
        if (!sf_secret_name_valid(names[i]))
            continue;
        h = sf_redis_sync_cmd(c, "HGETALL " SF_RK_SECRET, team, names[i]);
        if (redis_failed(c, h, why, whylen)) {
            json_decref(arr);
            free(names);
            freeReplyObject(r);
            return -EIO;
        }
        if (sf_secret_from_reply(h, &s, NULL) == 0 && !strcmp(s.team, team)) {
            json_array_append_new(arr, sf_secret_json(&s));
        }
        sf_secret_fini(&s);
        freeReplyObject(h);
    }
    free(names);
    freeReplyObject(r);
    *out = arr;
    return 0;
}

int sf_secrets_teams(redisContext *c, json_t **out, char *why, size_t whylen)
{
    redisReply *r = sf_redis_sync_cmd(c, "SMEMBERS " SF_RK_SECRETS_TEAMS);
    json_t *arr;

    if (redis_failed(c, r, why, whylen))
        return -EIO;
    arr = json_array();
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        if (sf_id_valid(r->element[i]->str))
            json_array_append_new(arr, json_string(r->element[i]->str));
    freeReplyObject(r);
    *out = arr;
    return 0;
}

int sf_placeholder_new(char out[SF_PLACEHOLDER_LEN + 1])
{
    uint8_t r[32];
    size_t plen = strlen(SF_PLACEHOLDER_PREFIX);

    if (sf_random(r, sizeof(r)) < 0)
        return -EIO;
    memcpy(out, SF_PLACEHOLDER_PREFIX, plen);
    for (size_t i = 0; i < 32; i++)
        out[plen + i] = b62[r[i] % 62];
    out[SF_PLACEHOLDER_LEN] = '\0';
    sodium_memzero(r, sizeof(r));
    return 0;
}

int sf_placeholder_at(const char *s, size_t n)
{
    size_t plen = strlen(SF_PLACEHOLDER_PREFIX);

    if (n < SF_PLACEHOLDER_LEN || memcmp(s, SF_PLACEHOLDER_PREFIX, plen) != 0)
        return 0;
    for (size_t i = plen; i < SF_PLACEHOLDER_LEN; i++)
        if (!isalnum((unsigned char)s[i]))
            return 0;
    return 1;
}
