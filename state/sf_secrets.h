/* sf_secrets: the team secrets store (schemas/redis-keys.md, secret-proxy/README.md).
 *
 * A secret is a Redis hash under its team's hash tag; its value is sealed with
 * XChaCha20-Poly1305 (libsodium, IETF construction) under a 32-byte master key that only
 * the secret-proxy and the admin CLI read. The additional data binds a sealed value to
 * its team and name, so a value copied into another record does not open. Everything
 * else (allowed hosts, header, format, times, version) is plain metadata: it is what
 * `secret_list` shows. Values never appear in listings, logs or replies.
 *
 * Placeholders ("sfph_" + 32 base62 characters) are what a sandbox holds instead of a
 * value; they are random per binding and only the secret-proxy maps them back.
 *
 * Library code: no logging. Functions return 0 or a negative errno. */
#ifndef SF_SECRETS_H
#define SF_SECRETS_H

#include "sf_store.h" /* the key layout */

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define SF_SECRET_KEY_BYTES 32
#define SF_SECRET_VALUE_MAX 8192        /* bytes of one secret value */
#define SF_SECRET_NAME_MAX 64           /* name: [A-Za-z0-9_-]{1,63} */
#define SF_SECRET_HOSTS_MAX 32          /* allowed hosts per secret */
#define SF_SECRET_HOST_MAX 254          /* one allowed host pattern */
#define SF_SECRET_HEADER_MAX 64
#define SF_SECRET_FORMAT_MAX 256
#define SF_SECRETS_TEAM_MAX 1000        /* secrets one team may hold */

#define SF_PLACEHOLDER_PREFIX "sfph_"
#define SF_PLACEHOLDER_LEN 37           /* prefix + 32 */

/* Keys (every key of a team's secrets shares the team's hash slot). */

/* A secret's metadata and (when opened) its value. */
typedef struct sf_secret {
    char name[SF_SECRET_NAME_MAX];
    char team[64];
    char *hosts[SF_SECRET_HOSTS_MAX]; /* lower-case patterns: name, *.suffix or IPv4 */
    size_t hosts_n;
    char header[SF_SECRET_HEADER_MAX]; /* "" = any header */
    char format[SF_SECRET_FORMAT_MAX]; /* "" = the placeholder itself is replaced */
    int any_header;                   /* no header named: 1 any header, 0 Authorization only */
    int allow_http;                   /* 1: swapped into plain HTTP too, not only into TLS */
    int64_t created_ms, updated_ms, version;
    uint8_t *value;                   /* opened value (sodium-locked memory), or NULL */
    size_t value_len;
} sf_secret;

void sf_secret_init(sf_secret *s);
void sf_secret_fini(sf_secret *s); /* wipes the value; NULL-safe */

/* Loads (creating it 0600 when absent) the master key from path. 0 or -errno with why. */
int sf_secrets_key_load(const char *path, uint8_t key[SF_SECRET_KEY_BYTES], char *why,
                        size_t whylen);

/* True for [A-Za-z0-9_-]{1,63}. */
int sf_secret_name_valid(const char *name);
/* Checks and normalises one allowed-host pattern (lower-cases it into out):
 * "api.example.com", "*.example.com" (any subdomain, not the apex) or an IPv4 literal.
 * 0, or -EINVAL with a sentence in why. */
int sf_secret_host_norm(const char *in, char out[SF_SECRET_HOST_MAX + 1], char *why,
                        size_t whylen);
/* True when host (lower-case name or IPv4 literal, no port) matches pattern. */
int sf_secret_host_match(const char *pattern, const char *host);
/* A value must be 1..SF_SECRET_VALUE_MAX bytes with no CR, LF or NUL (it goes into an
 * HTTP header). 0 or -EINVAL with why. */
int sf_secret_value_check(const uint8_t *v, size_t n, char *why, size_t whylen);
/* format must contain "{}" exactly once and no CR/LF; header must be a token. */
int sf_secret_format_check(const char *header, const char *format, char *why, size_t whylen);

/* Seals value for (team, name): base64 text (NUL-terminated, caller frees) in *out. */
int sf_secret_seal(const uint8_t key[SF_SECRET_KEY_BYTES], const char *team, const char *name,
                   const uint8_t *value, size_t n, char **out);
/* Opens a sealed value into sodium-locked memory (free with sf_secret_fini / sodium_free).
 * -EBADMSG when it does not open under this key for this team and name. */
int sf_secret_open(const uint8_t key[SF_SECRET_KEY_BYTES], const char *team, const char *name,
                   const char *sealed, uint8_t **value, size_t *n);

/* Blocking store operations (CLI, tests, tools). why gets one actionable sentence. */
/* Creates a secret; -EEXIST when the team already has that name. */
int sf_secrets_create(redisContext *c, const uint8_t key[SF_SECRET_KEY_BYTES],
                      const sf_secret *meta, const uint8_t *value, size_t n, char *why,
                      size_t whylen);
/* Replaces the value (and the hosts when meta->hosts_n > 0); bumps version. -ENOENT. */
int sf_secrets_rotate(redisContext *c, const uint8_t key[SF_SECRET_KEY_BYTES],
                      const sf_secret *meta, const uint8_t *value, size_t n, char *why,
                      size_t whylen);
int sf_secrets_delete(redisContext *c, const char *team, const char *name, char *why,
                      size_t whylen);
/* The team's secrets' metadata, sorted by name, as a JSON array of
 * {name, allowed_hosts, header, format, any_header, allow_http, created_ms, updated_ms,
 * version}: never a value. */
int sf_secrets_list(redisContext *c, const char *team, json_t **out, char *why, size_t whylen);
/* Teams that hold secrets (admin view), as a JSON array of strings. */
int sf_secrets_teams(redisContext *c, json_t **out, char *why, size_t whylen);

/* Parses an HGETALL reply of one secret record into s (metadata; the sealed value is
 * copied to *sealed when sealed is not NULL; caller frees). -ENOENT for an empty reply. */
int sf_secret_from_reply(const redisReply *r, sf_secret *s, char **sealed);

/* A secret's metadata as secret_list shows it (name, allowed_hosts, header, format,
 * created_ms, updated_ms, version): never the value. NULL when out of memory. */
json_t *sf_secret_json(const sf_secret *s);

/* A fresh placeholder, NUL-terminated. 0 or -EIO. */
int sf_placeholder_new(char out[SF_PLACEHOLDER_LEN + 1]);
/* True when s (at least SF_PLACEHOLDER_LEN bytes) starts with a well-formed placeholder. */
int sf_placeholder_at(const char *s, size_t n);

#endif
