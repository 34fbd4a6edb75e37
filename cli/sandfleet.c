/* sandfleet: the admin CLI.
 *   sandfleet keys create --team T [--name N]   prints the key once
 *   sandfleet keys list [--team T]
 *   sandfleet keys revoke KEY_ID
 *   sandfleet hosts                             worker hosts, heartbeat age, load
 *   sandfleet sandboxes [--team T]              sandboxes of every team (admin view)
 *   sandfleet secrets ...                       team secrets (cli/secrets.c)
 * Redis and the key-hash secret come from SF_REDIS_URL and SF_AUTH_SECRET_FILE. */
#include "secrets.h"
#include "sf_auth.h"
#include "sf_redis.h"
#include "sf_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: sandfleet keys create --team TEAM [--name NAME]\n"
    "       sandfleet keys list [--team TEAM]\n"
    "       sandfleet keys revoke KEY_ID\n"
    "       sandfleet hosts\n"
    "       sandfleet sandboxes [--team TEAM]\n"
    "       sandfleet secrets create|rotate|list|delete ... (sandfleet secrets --help)\n"
    "environment: SF_REDIS_URL (default redis://127.0.0.1:6379),\n"
    "             SF_AUTH_SECRET_FILE (default /var/lib/sandfleet/auth.key)\n";

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && *v ? v : def;
}

static const char *opt(int argc, char **argv, const char *name)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return argv[i + 1];
    return NULL;
}

static int reply_ok(redisContext *rc, redisReply *r)
{
    if (!r) {
        fprintf(stderr, "sandfleet: Redis: %s\n", rc->errstr);
        return 0;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "sandfleet: Redis: %s\n", r->str);
        freeReplyObject(r);
        return 0;
    }
    return 1;
}

static int keys_create(redisContext *rc, int argc, char **argv)
{
    const char *team = opt(argc, argv, "--team"), *name = opt(argc, argv, "--name");
    char key[SF_APIKEY_LEN + 1], hash[SF_APIKEY_HASH_HEX], id[32], why[512];
    uint8_t secret[32];
    redisReply *r;

    if (!team || !sf_id_valid(team)) {
        fprintf(stderr, "sandfleet: --team NAME is required ([a-z0-9_-], at most 63 chars).\n");
        return 2;
    }
    if (sf_auth_secret_load(env_or("SF_AUTH_SECRET_FILE", "/var/lib/sandfleet/auth.key"), secret,
                            why, sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet: %s\n", why);
        return 1;
    }
    if (sf_apikey_new(key) < 0 || sf_apikey_hash(secret, key, hash) < 0)
        return 1;
    snprintf(id, sizeof(id), "key_%.16s", hash); /* 64 bits of the hash: no collisions */
    r = redisCommand(rc, "HSET " SF_RK_APIKEY " id %s team %s name %s created %lld", hash, id,
                     team, name ? name : "", (long long)sf_now_ms());
    if (!reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    r = redisCommand(rc, "HSET " SF_RK_APIKEY_IDS " %s %s", id, hash);
    if (!reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    printf("%s\n", key);
    fprintf(stderr, "created %s for team %s; the key is shown only once.\n", id, team);
    return 0;
}

static int keys_list(redisContext *rc, int argc, char **argv)
{
    const char *team = opt(argc, argv, "--team");
    redisReply *r = redisCommand(rc, "HGETALL " SF_RK_APIKEY_IDS);

    if (!reply_ok(rc, r))
        return 1;
    printf("%-20s %-20s %-20s %s\n", "ID", "TEAM", "NAME", "CREATED_MS");
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        redisReply *k = redisCommand(rc, "HMGET " SF_RK_APIKEY " team name created",
                                     r->element[i + 1]->str);
        if (!reply_ok(rc, k))
            continue;
        if (k->elements == 3 && k->element[0]->str &&
            (!team || !strcmp(team, k->element[0]->str)))
            printf("%-20s %-20s %-20s %s\n", r->element[i]->str, k->element[0]->str,
                   k->element[1]->str ? k->element[1]->str : "",
                   k->element[2]->str ? k->element[2]->str : "");
        freeReplyObject(k);
    }
    freeReplyObject(r);
    return 0;
}

static int keys_revoke(redisContext *rc, const char *id)
{
    redisReply *r = redisCommand(rc, "HGET " SF_RK_APIKEY_IDS " %s", id);
    char hash[SF_APIKEY_HASH_HEX];

    if (!reply_ok(rc, r))
        return 1;
    if (r->type != REDIS_REPLY_STRING || r->len >= sizeof(hash)) {
        fprintf(stderr, "sandfleet: no key with id %s; see: sandfleet keys list\n", id);
        freeReplyObject(r);
        return 1;
    }
    memcpy(hash, r->str, r->len + 1);
    freeReplyObject(r);
    r = redisCommand(rc, "DEL " SF_RK_APIKEY, hash);
    if (!reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    r = redisCommand(rc, "PUBLISH " SF_CH_GATEWAY " key:%s", hash); /* gateways forget it now */
    if (!reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    r = redisCommand(rc, "HDEL " SF_RK_APIKEY_IDS " %s", id);
    if (!reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    printf("revoked %s\n", id);
    return 0;
}

static int hosts(redisContext *rc)
{
    redisReply *r = redisCommand(rc, "ZRANGE " SF_RK_HOSTS " 0 -1 WITHSCORES");
    int64_t now = sf_now_ms();

    if (!reply_ok(rc, r))
        return 1;
    printf("%-24s %-12s %-8s %-10s %s\n", "HOST", "HEARTBEAT", "DRIVER", "SANDBOXES", "TOPIC");
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        int64_t ts = 0;
        redisReply *h = redisCommand(rc, "HMGET " SF_RK_HOST " driver running capacity topic",
                                     r->element[i]->str);
        char age[32], load[32];

        sf_parse_i64(r->element[i + 1]->str, 0, INT64_MAX, &ts);
        snprintf(age, sizeof(age), "%.1fs ago", (double)(now - ts) / 1000.0);
        if (!reply_ok(rc, h))
            continue;
        snprintf(load, sizeof(load), "%s/%s", h->element[1]->str ? h->element[1]->str : "?",
                 h->element[2]->str ? h->element[2]->str : "?");
        printf("%-24s %-12s %-8s %-10s %s\n", r->element[i]->str, age,
               h->element[0]->str ? h->element[0]->str : "?", load,
               h->element[3]->str ? h->element[3]->str : "?");
        freeReplyObject(h);
    }
    freeReplyObject(r);
    return 0;
}

static int sandboxes(redisContext *rc, const char *team)
{
    unsigned long long cursor = 0;

    printf("%-28s %-16s %-16s %-9s %s\n", "ID", "TEAM", "HOST", "STATE", "NAME");
    do {
        redisReply *r = redisCommand(rc, "SCAN %llu MATCH sf:sb:{*} COUNT 500", cursor);
        if (!reply_ok(rc, r))
            return 1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            return 1;
        }
        cursor = strtoull(r->element[0]->str, NULL, 10);
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            redisReply *h = redisCommand(rc, "HMGET %s id team host state name",
                                         r->element[1]->element[i]->str);
            if (!reply_ok(rc, h))
                continue;
            if (h->elements == 5 && h->element[0]->str &&
                (!team || (h->element[1]->str && !strcmp(team, h->element[1]->str))))
                printf("%-28s %-16s %-16s %-9s %s\n", h->element[0]->str,
                       h->element[1]->str ? h->element[1]->str : "?",
                       h->element[2]->str ? h->element[2]->str : "?",
                       h->element[3]->str ? h->element[3]->str : "?",
                       h->element[4]->str ? h->element[4]->str : "");
            freeReplyObject(h);
        }
        freeReplyObject(r);
    } while (cursor != 0);
    return 0;
}

int main(int argc, char **argv)
{
    char why[512];
    redisContext *rc;
    int ret, is_hosts = argc == 2 && !strcmp(argv[1], "hosts");
    int is_sandboxes = argc >= 2 && !strcmp(argv[1], "sandboxes");

    if (argc >= 2 && !strcmp(argv[1], "secrets"))
        return cli_secrets(argc - 1, argv + 1);
    if (!is_hosts && !is_sandboxes && (argc < 3 || strcmp(argv[1], "keys") != 0)) {
        int help = argc == 2 && !strcmp(argv[1], "--help");
        fputs(usage, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    if (!(rc = sf_redis_connect_sync(env_or("SF_REDIS_URL", "redis://127.0.0.1:6379"), why,
                                     sizeof(why)))) {
        fprintf(stderr, "sandfleet: %s\n", why);
        return 1;
    }
    if (is_hosts)
        ret = hosts(rc);
    else if (is_sandboxes)
        ret = sandboxes(rc, opt(argc, argv, "--team"));
    else if (!strcmp(argv[2], "create"))
        ret = keys_create(rc, argc - 3, argv + 3);
    else if (!strcmp(argv[2], "list"))
        ret = keys_list(rc, argc - 3, argv + 3);
    else if (!strcmp(argv[2], "revoke") && argc == 4)
        ret = keys_revoke(rc, argv[3]);
    else {
        fputs(usage, stderr);
        ret = 2;
    }
    redisFree(rc);
    return ret;
}
