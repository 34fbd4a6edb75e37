#include "sf_netlog.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int sf_netlog_argv(const sf_netlog_entry *e, const char *key, long cap, char nums[6][24],
                   const char *argv[SF_NETLOG_ARGC], size_t argvlen[SF_NETLOG_ARGC])
{
    int n = 0;

#define ARG(s) (argv[n] = (s), argvlen[n] = strlen(argv[n]), n++)
    snprintf(nums[0], 24, "%ld", cap > 0 ? cap : SF_NETLOG_CAP_DEFAULT);
    snprintf(nums[1], 24, "%lld", (long long)e->ts_ms);
    snprintf(nums[2], 24, "%d", e->port);
    snprintf(nums[3], 24, "%llu", (unsigned long long)e->up);
    snprintf(nums[4], 24, "%llu", (unsigned long long)e->down);
    snprintf(nums[5], 24, "%d", e->secret ? 1 : 0);
    ARG("XADD");
    ARG(key);
    ARG("MAXLEN");
    ARG("~");
    ARG(nums[0]);
    ARG("*");
    ARG("ts");
    ARG(nums[1]);
    ARG("host");
    ARG(e->host ? e->host : "");
    ARG("ip");
    ARG(e->ip ? e->ip : "");
    ARG("port");
    ARG(nums[2]);
    ARG("verdict");
    ARG(e->verdict);
    ARG("proto");
    ARG(e->proto ? e->proto : "tcp");
    ARG("up");
    ARG(nums[3]);
    ARG("down");
    ARG(nums[4]);
    ARG("secret");
    ARG(nums[5]);
    ARG("reason");
    ARG(e->reason ? e->reason : "");
#undef ARG
    return n;
}

int sf_netlog_args_check(int64_t limit, const char *verdict, int *limit_out, char *why,
                         size_t whylen)
{
    if (limit > SF_NETLOG_LIMIT_MAX) {
        snprintf(why, whylen, "Argument 'limit' must be at most %d.", SF_NETLOG_LIMIT_MAX);
        return -EINVAL;
    }
    if (verdict && *verdict && strcmp(verdict, "allowed") && strcmp(verdict, "blocked") &&
        strcmp(verdict, "failed")) {
        snprintf(why, whylen, "Argument 'verdict' must be allowed, blocked or failed.");
        return -EINVAL;
    }
    *limit_out = limit <= 0 ? SF_NETLOG_LIMIT_DEFAULT : (int)limit;
    return 0;
}

static json_t *entry_json(const redisReply *fields)
{
    json_t *o = json_object();
    int64_t v;

    for (size_t i = 0; i + 1 < fields->elements; i += 2) {
        const char *k = fields->element[i]->str, *s = fields->element[i + 1]->str;
        if (!k || !s)
            continue;
        if (!strcmp(k, "ts") && sf_parse_i64(s, 0, INT64_MAX, &v) == 0)
            json_object_set_new(o, "ts_ms", json_integer(v));
        else if (!strcmp(k, "port") && sf_parse_i64(s, 0, 65535, &v) == 0)
            json_object_set_new(o, "port", json_integer(v));
        else if (!strcmp(k, "up") && sf_parse_i64(s, 0, INT64_MAX, &v) == 0)
            json_object_set_new(o, "bytes_up", json_integer(v));
        else if (!strcmp(k, "down") && sf_parse_i64(s, 0, INT64_MAX, &v) == 0)
            json_object_set_new(o, "bytes_down", json_integer(v));
        else if (!strcmp(k, "secret"))
            json_object_set_new(o, "secret_injected", json_boolean(!strcmp(s, "1")));
        else if (!strcmp(k, "host") || !strcmp(k, "ip") || !strcmp(k, "verdict") ||
                 !strcmp(k, "proto") || !strcmp(k, "reason"))
            json_object_set_new(o, k, json_string(s));
    }
    return o;
}

int sf_netlog_from_reply(const redisReply *r, int limit, const char *verdict, json_t **out)
{
    json_t *arr;

    if (!r || r->type == REDIS_REPLY_ERROR)
        return -EIO;
    arr = json_array();
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        json_t *o;
        const char *v;
        if ((int)json_array_size(arr) >= limit)
            break;
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            e->element[1]->type != REDIS_REPLY_ARRAY)
            continue;
        o = entry_json(e->element[1]);
        v = json_string_value(json_object_get(o, "verdict"));
        if (verdict && *verdict && (!v || strcmp(v, verdict))) {
            json_decref(o);
            continue;
        }
        json_array_append_new(arr, o);
    }
    *out = arr;
    return 0;
}

int sf_netlog_read_sync(redisContext *c, const char *sandbox, int limit, const char *verdict,
                        json_t **out)
{
    char key[128];
    redisReply *r;
    int rc;

    if (!sf_id_valid(sandbox))
        return -EINVAL;
    snprintf(key, sizeof(key), SF_RK_NETLOG, sandbox);
    r = sf_redis_sync_cmd(c, "XREVRANGE %s + - COUNT %d", key, SF_NETLOG_CAP_DEFAULT * 2);
    rc = sf_netlog_from_reply(r, limit, verdict, out);
    if (r)
        freeReplyObject(r);
    return rc;
}
