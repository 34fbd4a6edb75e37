/* sf_netlog: the per-sandbox network log (schemas/redis-keys.md): one capped Redis stream
 * per sandbox, written by the secret-proxy (one entry per connection or refused request),
 * read for `sandbox_network_log` by whoever answers that tool. Entries never hold a secret
 * value: only whether one was injected.
 *
 * Library code: no logging. Functions return 0 or a negative errno. */
#ifndef SF_NETLOG_H
#define SF_NETLOG_H

#include "sf_store.h" /* the key layout */

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define SF_NETLOG_CAP_DEFAULT 1000          /* entries kept per sandbox */
#define SF_NETLOG_LIMIT_DEFAULT 50          /* entries a read returns (docs/contract.md) */
#define SF_NETLOG_LIMIT_MAX 200

typedef struct sf_netlog_entry {
    int64_t ts_ms;          /* when the connection (or request) began */
    const char *host;       /* the name the sandbox asked for, or the IP */
    const char *ip;         /* the address actually used ("" when none) */
    int port;
    const char *verdict;    /* "allowed" | "blocked" | "failed" */
    const char *proto;      /* "http" | "https" | "tls" | "tcp" | "dns" | "udp" */
    uint64_t up, down;      /* bytes sandbox -> world, world -> sandbox */
    int secret;             /* 1: a secret was injected */
    const char *reason;     /* short text for blocked / failed ("" otherwise) */
} sf_netlog_entry;

/* Fills argv (room for SF_NETLOG_ARGC) with an XADD of e to key (owned by the caller,
 * formatted from SF_RK_NETLOG), trimming the stream to about cap entries. nums is scratch
 * for the numbers (room for 6 * 24 bytes). Returns argc. */
#define SF_NETLOG_ARGC 26
int sf_netlog_argv(const sf_netlog_entry *e, const char *key, long cap, char nums[6][24],
                   const char *argv[SF_NETLOG_ARGC], size_t argvlen[SF_NETLOG_ARGC]);

/* limit: <= 0 -> default 50; above 200 -> -EINVAL. verdict: NULL/"" or one of the three,
 * else -EINVAL. why gets one actionable sentence. */
int sf_netlog_args_check(int64_t limit, const char *verdict, int *limit_out, char *why,
                         size_t whylen);
/* The command a reader sends (newest first, the whole capped stream) is
 * "XREVRANGE <key> + - COUNT <cap>"; this turns its reply into a JSON array of at most
 * limit entries {ts_ms, host, ip, port, verdict, proto, bytes_up, bytes_down,
 * secret_injected, reason}, newest first, only those with verdict (when given). */
int sf_netlog_from_reply(const redisReply *r, int limit, const char *verdict, json_t **out);
/* Blocking read (CLI, tests): the two steps above. */
int sf_netlog_read_sync(redisContext *c, const char *sandbox, int limit, const char *verdict,
                        json_t **out);

#endif
