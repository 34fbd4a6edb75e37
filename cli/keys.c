/* keys.c: `sandfleet keys create|list|revoke` — team API keys in Redis.
 * Only a keyed BLAKE2b hash of a key is stored; the key itself is printed once. */
#include "cli.h"
#include "sf_auth.h"
#include "sf_jobauth.h"
#include "sf_redis.h"
#include "sf_store.h"
#include "sf_util.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: sandfleet keys create --team TEAM [--name NAME]   prints the key once\n"
    "       sandfleet keys list [--team TEAM]\n"
    "       sandfleet keys revoke KEY_ID\n";

static int keys_create(redisContext *rc, int argc, char **argv)
{
    const char *team = cli_opt(argc, argv, "--team"), *name = cli_opt(argc, argv, "--name");
    char key[SF_APIKEY_LEN + 1], hash[SF_APIKEY_HASH_HEX], id[32], why[512];
    char pid[SF_PRODUCER_ID_LEN + 1], sealed[SF_PSK_SEALED_HEX];
    uint8_t secret[32], psk[32];
    redisReply *r;

    if (!team || !sf_id_valid(team)) {
        fprintf(stderr, "sandfleet: --team NAME is required ([a-z0-9_-], at most 63 chars).\n");
        return 2;
    }
    if (sf_auth_secret_load(cli_setting("SF_AUTH_SECRET_FILE", CLI_DEFAULT_HOME "/auth.key"),
                            secret, why, sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet: %s\n", why);
        return 1;
    }
    if (sf_apikey_new(key) < 0 || sf_apikey_hash(secret, key, hash) < 0 ||
        sf_producer_derive(key, pid, psk) < 0 || sf_psk_seal(secret, pid, psk, sealed) < 0)
        return 1;
    snprintf(id, sizeof(id), "key_%.16s", hash); /* 64 bits of the hash: no collisions */
    /* the queue's producer credential first: a key that exists can always sign */
    r = redisCommand(rc, "HSET " SF_RK_PRODUCER " team %s key %s psk %s", pid, team, hash, sealed);
    if (!cli_reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    r = redisCommand(rc, "HSET " SF_RK_APIKEY " id %s team %s name %s created %lld pid %s", hash,
                     id, team, name ? name : "", (long long)sf_now_ms(), pid);
    if (!cli_reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    r = redisCommand(rc, "HSET " SF_RK_APIKEY_IDS " %s %s", id, hash);
    if (!cli_reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    printf("%s\n", key);
    fprintf(stderr, "created %s for team %s (producer id %s on the job queue); the key is shown "
                    "only once.\n", id, team, pid);
    return 0;
}

static int keys_list(redisContext *rc, int argc, char **argv)
{
    const char *team = cli_opt(argc, argv, "--team");
    redisReply *r = redisCommand(rc, "HGETALL " SF_RK_APIKEY_IDS);

    if (!cli_reply_ok(rc, r))
        return 1;
    printf("%-20s %-20s %-20s %s\n", "ID", "TEAM", "NAME", "CREATED_MS");
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        redisReply *k = redisCommand(rc, "HMGET " SF_RK_APIKEY " team name created",
                                     r->element[i + 1]->str);
        if (!cli_reply_ok(rc, k))
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

    if (!cli_reply_ok(rc, r))
        return 1;
    if (r->type != REDIS_REPLY_STRING || r->len >= sizeof(hash)) {
        fprintf(stderr, "sandfleet: no key with id %s; see: sandfleet keys list\n", id);
        freeReplyObject(r);
        return 1;
    }
    memcpy(hash, r->str, r->len + 1);
    freeReplyObject(r);
    r = redisCommand(rc, "HGET " SF_RK_APIKEY " pid", hash); /* its credential on the queue */
    if (!cli_reply_ok(rc, r))
        return 1;
    if (r->type == REDIS_REPLY_STRING && r->len == SF_PRODUCER_ID_LEN) {
        redisReply *d = redisCommand(rc, "DEL " SF_RK_PRODUCER, r->str);
        if (!cli_reply_ok(rc, d)) {
            freeReplyObject(r);
            return 1;
        }
        freeReplyObject(d);
    }
    freeReplyObject(r);
    r = redisCommand(rc, "DEL " SF_RK_APIKEY, hash);
    if (!cli_reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    r = redisCommand(rc, "PUBLISH " SF_CH_GATEWAY " key:%s", hash); /* gateways forget it now */
    if (!cli_reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    r = redisCommand(rc, "HDEL " SF_RK_APIKEY_IDS " %s", id);
    if (!cli_reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    printf("revoked %s\n", id);
    return 0;
}

int cli_keys(int argc, char **argv)
{
    const char *sub = argc >= 2 ? argv[1] : "";
    redisContext *rc;
    int ret;

    if (cli_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(sub, "create") && strcmp(sub, "list") && (strcmp(sub, "revoke") || argc != 3)) {
        fputs(usage, stderr);
        return 2;
    }
    if (!(rc = cli_redis()))
        return 1;
    if (!strcmp(sub, "create"))
        ret = keys_create(rc, argc - 2, argv + 2);
    else if (!strcmp(sub, "list"))
        ret = keys_list(rc, argc - 2, argv + 2);
    else
        ret = keys_revoke(rc, argv[2]);
    redisFree(rc);
    return ret;
}
