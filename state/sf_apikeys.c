#include "sf_apikeys.h"

#include <errno.h>
#include <stdio.h>
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
    redisReply *r = redisCommand(c, "HGET " SF_RK_APIKEY_IDS " %s", id);

    if (reply_failed(c, r, why, whylen))
        return -EIO;
    if (r->type != REDIS_REPLY_STRING || r->len >= hash_size) {
        freeReplyObject(r);
        return -ENOENT;
    }
    memcpy(hash, r->str, r->len + 1);
    freeReplyObject(r);
    r = redisCommand(c, "HGET " SF_RK_APIKEY " pid", hash);
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
