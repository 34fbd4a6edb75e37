#include "sf_apikeys.h"
#include "sf_auth.h"
#include "sf_jobauth.h"
#include "sf_log.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MAX 160

static int reply_failed(redisContext *c, redisReply *r, char *why, size_t whylen)
{
    if (!r) {
        snprintf(why, whylen, "Redis: %s", c->errstr[0] ? c->errstr : "connection lost");
        return 1;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(why, whylen, "Redis: %s", r->str);
        freeReplyObject(r);
        return 1;
    }
    return 0;
}

int sf_apikeys_create(redisContext *c, const sf_apikey_rec *k, char *why, size_t whylen)
{
    char rec[KEY_MAX], pkey[KEY_MAX], created[24];
    const char *argv[10];
    redisReply *r;
    int ret;

    snprintf(rec, sizeof(rec), SF_RK_APIKEY, k->hash);
    snprintf(pkey, sizeof(pkey), SF_RK_PRODUCER, k->pid);
    snprintf(created, sizeof(created), "%lld", k->created_ms);
    argv[0] = rec, argv[1] = SF_RK_APIKEY_IDS, argv[2] = pkey;
    argv[3] = k->id, argv[4] = k->team, argv[5] = k->name ? k->name : "", argv[6] = created;
    argv[7] = k->pid, argv[8] = k->sealed, argv[9] = k->hash;
    r = sf_redis_script_sync(c, &sf_store_apikey_create, 3, 7, argv, NULL);
    if (reply_failed(c, r, why, whylen))
        return -EIO;
    ret = r->type == REDIS_REPLY_INTEGER && r->integer == 1 ? 0 : -EEXIST;
    if (ret == -EEXIST)
        snprintf(why, whylen, "a key with id %s exists already", k->id);
    freeReplyObject(r);
    return ret;
}

/* The index's hash for id and the record's pid, as the revoke script checks them again. */
static int revoke_read(redisContext *c, const char *id, char *hash, size_t hash_size,
                       char *pid, size_t pid_size, char *why, size_t whylen)
{
    redisReply *r = sf_redis_sync_cmd(c, "HGET " SF_RK_APIKEY_IDS " %s", id);

    if (reply_failed(c, r, why, whylen))
        return -EIO;
    if (r->type != REDIS_REPLY_STRING || r->len >= hash_size) {
        freeReplyObject(r);
        return -ENOENT;
    }
    memcpy(hash, r->str, r->len + 1);
    freeReplyObject(r);
    r = sf_redis_sync_cmd(c, "HGET " SF_RK_APIKEY " pid", hash);
    if (reply_failed(c, r, why, whylen))
        return -EIO;
    pid[0] = '\0';
    if (r->type == REDIS_REPLY_STRING && r->len < pid_size)
        memcpy(pid, r->str, r->len + 1);
    freeReplyObject(r);
    return 0;
}

int sf_apikeys_revoke(redisContext *c, const char *id, char *hash_out, size_t hash_size,
                      char *why, size_t whylen)
{
    char hash[80], pid[64], rec[KEY_MAX], pkey[KEY_MAX], msg[KEY_MAX];
    const char *argv[8];

    for (int tries = 0; tries < 3; tries++) {
        redisReply *r;
        int ret = revoke_read(c, id, hash, sizeof(hash), pid, sizeof(pid), why, whylen);

        if (ret < 0)
            return ret;
        snprintf(rec, sizeof(rec), SF_RK_APIKEY, hash);
        snprintf(pkey, sizeof(pkey), SF_RK_PRODUCER, pid[0] ? pid : "-");
        snprintf(msg, sizeof(msg), "key:%s", hash);
        argv[0] = SF_RK_APIKEY_IDS, argv[1] = rec, argv[2] = pkey;
        argv[3] = id, argv[4] = hash, argv[5] = pid, argv[6] = SF_CH_GATEWAY, argv[7] = msg;
        r = sf_redis_script_sync(c, &sf_store_apikey_revoke, 3, 5, argv, NULL);
        if (reply_failed(c, r, why, whylen))
            return -EIO;
        ret = r->type != REDIS_REPLY_STATUS && r->type != REDIS_REPLY_STRING ? -EIO
              : !strcmp(r->str, "ok")                                         ? 0
              : !strcmp(r->str, "gone")                                       ? -ENOENT
                                                                              : -EAGAIN;
        freeReplyObject(r);
        if (ret == 0) {
            if (strlen(hash) >= hash_size)
                return -EIO;
            memcpy(hash_out, hash, strlen(hash) + 1);
        }
        if (ret != -EAGAIN)
            return ret == -EIO ? (snprintf(why, whylen, "Redis: unexpected answer"), -EIO) : ret;
    }
    snprintf(why, whylen, "key %s kept changing while it was revoked; try again", id);
    return -EIO;
}

int sf_apikeys_team(sf_redis *r, const char *hash, redisCallbackFn *cb, void *priv)
{
    return sf_redis_cmd(r, cb, priv, "HGET " SF_RK_APIKEY " team", hash);
}

int sf_apikeys_exists(sf_redis *r, const char *hash, redisCallbackFn *cb, void *priv)
{
    return sf_redis_cmd(r, cb, priv, "EXISTS " SF_RK_APIKEY, hash);
}

/* ---- the layout before the {apikeys} slot (main 1cc2ccd and older), read only here ---- */
#define OLD_APIKEY "sf:apikey:{%s}"  /* hash-hex -> hash {id, team, name, created, pid} */
#define OLD_APIKEY_IDS "sf:apikeys"  /* hash: key id -> hash-hex */
#define OLD_PRODUCER "sf:pkey:{%s}"  /* producer id -> hash {team, key, psk (sealed)} */
#define MIGRATE_BATCH "100"          /* index entries per HSCAN step */

static const char *field(const redisReply *r, size_t i)
{
    return i < r->elements && r->element[i]->type == REDIS_REPLY_STRING ? r->element[i]->str
                                                                          : NULL;
}

static int hexlen_ok(const char *s, size_t n)
{
    size_t i;

    for (i = 0; s[i]; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return i == n;
}

/* One old key into the new layout through the create script, then its old keys go (each
 * step idempotent: a run stopped half-way is finished by the next). 1 moved, 0 nothing to
 * move (an index entry whose record is gone is dropped), -EIO. */
static int migrate_one(redisContext *c, const char *id, const char *hash, char *why,
                       size_t whylen)
{
    redisReply *r, *p = NULL;
    const char *pid, *sealed = NULL;
    sf_apikey_rec k = {.hash = hash, .id = id};
    int rc = 0;

    if (!sf_id_valid(id) || !hexlen_ok(hash, SF_APIKEY_HASH_HEX - 1)) {
        r = sf_redis_sync_cmd(c, "HDEL " OLD_APIKEY_IDS " %s", id); /* not a key we ever made */
        if (reply_failed(c, r, why, whylen))
            return -EIO;
        freeReplyObject(r);
        return 0;
    }
    r = sf_redis_sync_cmd(c, "HMGET " OLD_APIKEY " team name created pid", hash);
    if (reply_failed(c, r, why, whylen))
        return -EIO;
    pid = field(r, 3);
    if (pid && (strlen(pid) != SF_PRODUCER_ID_LEN || !sf_id_valid(pid)))
        pid = NULL;
    if (field(r, 0) && sf_id_valid(field(r, 0)) && pid) {
        p = sf_redis_sync_cmd(c, "HGET " OLD_PRODUCER " psk", pid);
        if (reply_failed(c, p, why, whylen)) {
            freeReplyObject(r);
            return -EIO;
        }
        sealed = p->type == REDIS_REPLY_STRING ? p->str : NULL;
    }
    if (field(r, 0) && sf_id_valid(field(r, 0))) {
        k.team = field(r, 0);
        k.name = field(r, 1) ? field(r, 1) : "";
        k.created_ms = field(r, 2) ? strtoll(field(r, 2), NULL, 10) : 0;
        k.pid = sealed ? pid : ""; /* no credential: the key works at gateways only */
        k.sealed = sealed ? sealed : "";
        rc = sf_apikeys_create(c, &k, why, whylen);
        rc = rc == -EEXIST ? 1 : rc == 0 ? 1 : rc; /* exists: an earlier run moved it */
    }
    if (rc >= 0 && pid) {
        redisReply *d = sf_redis_sync_cmd(c, "DEL " OLD_PRODUCER, pid);
        if (reply_failed(c, d, why, whylen))
            rc = -EIO;
        else
            freeReplyObject(d);
    }
    freeReplyObject(p);
    freeReplyObject(r);
    if (rc < 0)
        return rc;
    r = sf_redis_sync_cmd(c, "DEL " OLD_APIKEY, hash);
    if (reply_failed(c, r, why, whylen))
        return -EIO;
    freeReplyObject(r);
    r = sf_redis_sync_cmd(c, "HDEL " OLD_APIKEY_IDS " %s", id); /* last: a rerun finds the rest */
    if (reply_failed(c, r, why, whylen))
        return -EIO;
    freeReplyObject(r);
    return rc;
}

int sf_apikeys_migrate(redisContext *c, int *moved, char *why, size_t whylen)
{
    char cursor[32] = "0";
    int n = 0;

    do {
        redisReply *r = sf_redis_sync_cmd(c, "HSCAN " OLD_APIKEY_IDS " %s COUNT " MIGRATE_BATCH,
                                     cursor);
        redisReply *e;

        if (reply_failed(c, r, why, whylen))
            return -EIO;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof(cursor) ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            snprintf(why, whylen, "Redis: %s is not a hash; the old API keys were left "
                     "where they are", OLD_APIKEY_IDS);
            freeReplyObject(r);
            return -EIO;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
        e = r->element[1];
        for (size_t i = 0; i + 1 < e->elements; i += 2) {
            int rc;
            if (e->element[i]->type != REDIS_REPLY_STRING ||
                e->element[i + 1]->type != REDIS_REPLY_STRING)
                continue;
            if ((rc = migrate_one(c, e->element[i]->str, e->element[i + 1]->str, why,
                                  whylen)) < 0) {
                freeReplyObject(r);
                return rc;
            }
            n += rc;
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    if (moved)
        *moved = n;
    return 0;
}

void sf_apikeys_migrate_start(const char *redis_url)
{
    char why[256] = "";
    int n = 0;
    redisContext *c = sf_redis_connect_sync(redis_url, why, sizeof(why));

    if (!c || sf_apikeys_migrate(c, &n, why, sizeof(why)) < 0)
        sf_warn("msg=\"API keys of the layout before the {apikeys} slot were not moved; they "
                "are refused until a gateway or scheduler starts with Redis reachable or "
                "'sandfleet keys list' runs\" err=\"%s\"", why);
    else if (n)
        sf_info("msg=\"API keys moved to the {apikeys} slot\" keys=%d", n);
    if (c)
        sf_redis_sync_free(c);
}
