/* sf_apikeys: team API keys in Redis, the one module that writes them (the CLI creates,
 * lists and revokes them; gateways check them). A key's record, its entry in the id index
 * and its producer credential (sf_jobauth.h) share the slot {apikeys}: a create and a
 * revoke are each one script (state/lua/apikey_create.lua, apikey_revoke.lua), so no
 * reader ever sees a part of a key. The revoke also tells every gateway
 * (SF_CH_GATEWAY "key:<hash>"), from inside the script. */
#ifndef SF_APIKEYS_H
#define SF_APIKEYS_H

#include "sf_store.h"

#include <stddef.h>

typedef struct sf_apikey_rec {
    const char *hash; /* keyed hash of the key (sf_apikey_hash), hex */
    const char *id;   /* "key_" + the hash's first 16 digits */
    const char *team;
    const char *name; /* "" for none */
    long long created_ms;
    const char *pid;    /* producer id (sf_producer_derive) */
    const char *sealed; /* its credential, sealed (sf_psk_seal) */
} sf_apikey_rec;

/* On a blocking connection (the CLI). 0 (all of it written), -EEXIST (a key with that
 * hash or id exists: nothing written), -EIO (Redis refused or the connection broke: why
 * says which). */
int sf_apikeys_create(redisContext *c, const sf_apikey_rec *k, char *why, size_t whylen);
/* Revokes the key with that id (key_...): its hash into hash_out (SF_APIKEY_HASH_HEX
 * bytes) on success. 0, -ENOENT (no such key), -EIO (why says what). */
int sf_apikeys_revoke(redisContext *c, const char *id, char *hash_out, size_t hash_size,
                      char *why, size_t whylen);

/* Moves the keys of the layout before the {apikeys} slot (record sf:apikey:{<hash>}, index
 * sf:apikeys, credential sf:pkey:{<pid>}) into today's, each through the create script,
 * and removes the old keys: an upgraded platform keeps accepting the keys it handed out.
 * Idempotent (a run stopped half-way is finished by the next), bounded per step (HSCAN).
 * Run by the gateway and the scheduler at start and by `sandfleet keys`. 0 (*moved: how
 * many), -EIO (why says what). */
int sf_apikeys_migrate(redisContext *c, int *moved, char *why, size_t whylen);
/* The same on a connection of its own to redis_url, logged (a daemon's start). */
void sf_apikeys_migrate_start(const char *redis_url);

/* Async (gateways). The team of the key with that hash: cb's reply is a string or nil
 * (no such key). As sf_redis_cmd: 0, or -ENOTCONN and cb is not called. */
int sf_apikeys_team(sf_redis *r, const char *hash, redisCallbackFn *cb, void *priv);
/* Whether it still exists: cb's reply is the integer 1 or 0. */
int sf_apikeys_exists(sf_redis *r, const char *hash, redisCallbackFn *cb, void *priv);

#endif
