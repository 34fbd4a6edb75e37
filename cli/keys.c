/* keys.c: `sandfleet keys create|list|revoke` — team API keys in Redis, written through
 * the state module (sf_apikeys.h: one script each for a create and a revoke).
 * Only a keyed BLAKE2b hash of a key is stored; the key itself is printed once. */
#include "cli.h"
#include "sf_apikeys.h"
#include "sf_auth.h"
#include "sf_jobauth.h"
#include "sf_redis.h"
#include "sf_store.h"
#include "sf_util.h"

#include <errno.h>
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
    sf_apikey_rec rec;
    int ret;

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
    rec = (sf_apikey_rec){.hash = hash, .id = id, .team = team, .name = name ? name : "",
                          .created_ms = sf_now_ms(), .pid = pid, .sealed = sealed};
    if ((ret = sf_apikeys_create(rc, &rec, why, sizeof(why))) < 0) {
        fprintf(stderr, "sandfleet: the key was not created (%s); nothing was written, run the "
                        "command again.\n", why);
        return 1;
    }
    printf("%s\n", key);
    fprintf(stderr, "created %s for team %s (producer id %s on the job queue); the key is shown "
                    "only once.\n", id, team, pid);
    return 0;
}

static int keys_list(redisContext *rc, int argc, char **argv)
{
    const char *team = cli_opt(argc, argv, "--team");
    redisReply *r = sf_redis_sync_cmd(rc, "HGETALL " SF_RK_APIKEY_IDS);

    if (!cli_reply_ok(rc, r))
        return 1;
    printf("%-20s %-20s %-20s %s\n", "ID", "TEAM", "NAME", "CREATED_MS");
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        redisReply *k = sf_redis_sync_cmd(rc, "HMGET " SF_RK_APIKEY " team name created",
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
    char hash[SF_APIKEY_HASH_HEX], why[512];
    int ret = sf_apikeys_revoke(rc, id, hash, sizeof(hash), why, sizeof(why));

    if (ret == -ENOENT) {
        fprintf(stderr, "sandfleet: no key with id %s; see: sandfleet keys list\n", id);
        return 1;
    }
    if (ret < 0) {
        fprintf(stderr, "sandfleet: %s; the key was not revoked, run the command again.\n", why);
        return 1;
    }
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
    {
        /* keys of the layout before the {apikeys} slot are listed and revoked like the
         * others (state/sf_apikeys.h); the gateways and schedulers move them at start too */
        char why[256];
        int moved = 0;
        if (sf_apikeys_migrate(rc, &moved, why, sizeof(why)) < 0) {
            fprintf(stderr, "sandfleet: the API keys of the old layout could not be moved: %s\n",
                    why);
            sf_redis_sync_free(rc);
            return 1;
        }
        if (moved)
            fprintf(stderr, "moved %d API keys of the old layout to the {apikeys} slot\n", moved);
    }
    if (!strcmp(sub, "create"))
        ret = keys_create(rc, argc - 2, argv + 2);
    else if (!strcmp(sub, "list"))
        ret = keys_list(rc, argc - 2, argv + 2);
    else
        ret = keys_revoke(rc, argv[2]);
    sf_redis_sync_free(rc);
    return ret;
}
