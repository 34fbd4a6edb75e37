/* sf_snapshots.c: snapshot records (sf_snapshots.h). */
#include "sf_snapshots.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SNAP_TRIES 3 /* reads of the set when it changes under a call */
#define SNAP_ARGS 34 /* a call's own keys and arguments (reserve's are the most) */

static int keys2(char rec[300], char set[160], const char *team, const char *name)
{
    if (snprintf(set, 160, SF_RK_TEAM_SNAPSHOTS, team) >= 160 ||
        (rec && snprintf(rec, 300, SF_RK_SNAPSHOT, team, name) >= 300))
        return -EINVAL;
    return 0;
}

/* A call whose script looks at every snapshot of the team: the team's set is read
 * (SMEMBERS), then the script runs with the set, the call's own record (if any) and every
 * member's record declared; {'again'} (the set changed in between) reads it again. */
typedef struct snap_op {
    sf_redis *r;
    sf_redis_script *s;
    redisCallbackFn *cb;
    void *priv;
    int tries, nown, nargs; /* nown: own keys (the set, the record) */
    char team[128];
    char *argv[SNAP_ARGS];  /* own keys, then the arguments */
    size_t lens[SNAP_ARGS];
} snap_op;

static void op_free(snap_op *op)
{
    if (!op)
        return;
    for (int i = 0; i < op->nown + op->nargs; i++)
        free(op->argv[i]);
    free(op);
}

/* The caller's callback, once, then the call is over. */
static void op_done(snap_op *op, redisAsyncContext *ac, redisReply *rep)
{
    op->cb(ac, rep, op->priv);
    op_free(op);
}

static int is_again(const redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
           rep->element[0]->type == REDIS_REPLY_STRING && !strcmp(rep->element[0]->str, "again");
}

static int op_start(snap_op *op);

static void on_script(redisAsyncContext *ac, void *r, void *priv)
{
    snap_op *op = priv;

    if (is_again(r)) {
        if (++op->tries < SNAP_TRIES && op_start(op) == 0)
            return;
        r = NULL; /* the set keeps changing, or Redis went away: as a lost connection */
    }
    op_done(op, ac, r);
}

static void on_members(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    snap_op *op = priv;
    const char **argv = NULL;
    size_t *lens = NULL, n, nkeys, at = 0;
    char *keys = NULL;
    int rc = -ENOMEM;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        op_done(op, ac, rep);
        return;
    }
    n = rep->elements;
    nkeys = (size_t)op->nown + n;
    if (nkeys + (size_t)op->nargs > SF_REDIS_SCRIPT_ARGS_MAX) {
        op_done(op, ac, NULL); /* more snapshots than any limit allows */
        return;
    }
    for (size_t i = 0; i < n; i++)
        at += sizeof(SF_RK_SNAPSHOT) + strlen(op->team) + rep->element[i]->len;
    argv = calloc(nkeys + (size_t)op->nargs, sizeof(*argv));
    lens = calloc(nkeys + (size_t)op->nargs, sizeof(*lens));
    keys = malloc(at ? at : 1);
    if (argv && lens && keys) {
        char *p = keys;
        size_t k = 0;

        for (int i = 0; i < op->nown; i++, k++)
            argv[k] = op->argv[i], lens[k] = op->lens[i];
        for (size_t i = 0; i < n; i++, k++) {
            const redisReply *m = rep->element[i]; /* SMEMBERS: bulk strings */
            int len = sprintf(p, "sf:team:{%s}:snap:%.*s", op->team, (int)m->len,
                              m->str ? m->str : "");
            argv[k] = p, lens[k] = (size_t)len;
            p += len + 1;
        }
        for (int i = 0; i < op->nargs; i++, k++)
            argv[k] = op->argv[op->nown + i], lens[k] = op->lens[op->nown + i];
        rc = sf_redis_script_call(op->r, op->s, on_script, op, (int)nkeys, op->nargs, argv, lens);
    }
    free(argv);
    free(lens);
    free(keys);
    if (rc < 0)
        op_done(op, ac, NULL);
}

static int op_start(snap_op *op)
{
    return sf_redis_cmd(op->r, on_members, op, "SMEMBERS %s", op->argv[0]);
}

/* Runs script s: own keys (the set first), then every member's record, then the
 * arguments. 0, or -errno (cb not called). */
static int op_run(sf_redis *r, sf_redis_script *s, const char *team, redisCallbackFn *cb,
                  void *priv, int nown, int n, const char **argv)
{
    snap_op *op;
    int rc;

    if (n > SNAP_ARGS || strlen(team) >= sizeof(op->team))
        return -EINVAL;
    if (!(op = calloc(1, sizeof(*op))))
        return -ENOMEM;
    op->r = r, op->s = s, op->cb = cb, op->priv = priv;
    op->nown = nown, op->nargs = n - nown;
    memcpy(op->team, team, strlen(team) + 1);
    for (int i = 0; i < n; i++) {
        op->lens[i] = strlen(argv[i]);
        if (!(op->argv[i] = strdup(argv[i]))) {
            op_free(op);
            return -ENOMEM;
        }
    }
    if ((rc = op_start(op)) < 0)
        op_free(op);
    return rc;
}

/* A script of the record and the set only (drop, check). */
static int call(sf_redis *r, sf_redis_script *s, redisCallbackFn *cb, void *priv, int n,
                const char **argv)
{
    size_t lens[8];

    for (int i = 0; i < n; i++)
        lens[i] = strlen(argv[i]);
    return sf_redis_script_call(r, s, cb, priv, 2, n - 2, argv, lens);
}

int sf_snap_reserve(sf_redis *r, const char *team, const sf_snap_rec *s, int64_t now_ms,
                    int64_t max_n, int64_t max_bytes, redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160], num[8][24];
    const char *argv[SNAP_ARGS];
    int n = 0;

    if (keys2(rec, set, team, s->name) < 0)
        return -EINVAL;
    snprintf(num[0], 24, "%lld", (long long)max_n);
    snprintf(num[1], 24, "%lld", (long long)max_bytes);
    snprintf(num[2], 24, "%lld", (long long)now_ms);
    snprintf(num[3], 24, "%u", s->memory_mib);
    snprintf(num[4], 24, "%u", s->vcpu_milli);
    snprintf(num[5], 24, "%u", s->disk_mib);
    snprintf(num[6], 24, "%u", s->pids_max);
    snprintf(num[7], 24, "%llu", (unsigned long long)s->inodes);
    argv[n++] = set;
    argv[n++] = rec;
    argv[n++] = num[0];
    argv[n++] = num[1];
#define KV(k, v) (argv[n++] = (k), argv[n++] = (v))
    KV("id", s->id);
    KV("name", s->name);
    KV("team", team);
    KV("host", s->host);
    KV("driver", s->driver);
    KV("template", s->template_name ? s->template_name : "base");
    KV("sandbox", s->sandbox);
    KV("status", "taking");
    KV("size", "0");
    KV("created", num[2]);
    KV("memory_mib", num[3]);
    KV("vcpu_milli", num[4]);
    KV("disk_mib", num[5]);
    KV("pids_max", num[6]);
    KV("inodes", num[7]);
#undef KV
    return op_run(r, &sf_store_snap_reserve, team, cb, priv, 2, n, argv);
}

int sf_snap_finish(sf_redis *r, const char *team, const char *name, const char *id,
                   uint64_t size, int64_t max_bytes, redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160], num[3][24];
    const char *argv[6];

    if (keys2(rec, set, team, name) < 0)
        return -EINVAL;
    snprintf(num[0], 24, "%llu", (unsigned long long)size);
    snprintf(num[1], 24, "%lld", (long long)max_bytes);
    snprintf(num[2], 24, "%lld", (long long)sf_now_ms());
    argv[0] = set, argv[1] = rec, argv[2] = id, argv[3] = num[0], argv[4] = num[1];
    argv[5] = num[2];
    return op_run(r, &sf_store_snap_finish, team, cb, priv, 2, 6, argv);
}

int sf_snap_drop(sf_redis *r, const char *team, const char *name, const char *id,
                 redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160];
    const char *argv[4];

    if (keys2(rec, set, team, name) < 0)
        return -EINVAL;
    argv[0] = rec, argv[1] = set, argv[2] = id, argv[3] = name;
    return call(r, &sf_store_snap_drop, cb, priv, 4, argv);
}

int sf_snap_check(sf_redis *r, const char *team, const char *name, const char *id,
                  int stale_taking, redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160];
    const char *argv[5];

    if (keys2(rec, set, team, name) < 0)
        return -EINVAL;
    argv[0] = rec, argv[1] = set, argv[2] = id, argv[3] = name;
    argv[4] = stale_taking ? "1" : "0";
    return call(r, &sf_store_snap_check, cb, priv, 5, argv);
}

int sf_snap_find(sf_redis *r, const char *team, const char *ref, redisCallbackFn *cb,
                 void *priv)
{
    char set[160];
    const char *argv[2];

    if (keys2(NULL, set, team, NULL) < 0)
        return -EINVAL;
    argv[0] = set, argv[1] = ref;
    return op_run(r, &sf_store_snap_find, team, cb, priv, 1, 2, argv);
}

int sf_snap_list(sf_redis *r, const char *team, redisCallbackFn *cb, void *priv)
{
    char set[160];
    const char *argv[1];

    if (keys2(NULL, set, team, NULL) < 0)
        return -EINVAL;
    argv[0] = set;
    return op_run(r, &sf_store_snap_list, team, cb, priv, 1, 1, argv);
}

int sf_snap_delete(sf_redis *r, const char *team, const char *ref, redisCallbackFn *cb,
                   void *priv)
{
    char set[160];
    const char *argv[2];

    if (keys2(NULL, set, team, NULL) < 0)
        return -EINVAL;
    argv[0] = set, argv[1] = ref;
    return op_run(r, &sf_store_snap_delete, team, cb, priv, 1, 2, argv);
}
