/* tpl_join.c: team templates on hosts that join later. A template is built on the
 * hosts live when it is created; a host that comes up later (a new worker, one back from
 * a long absence) gets every ready team template built on it too, so placement can use it
 * for them. Each reaper tick (host_ttl_ms) the scheduler reads the live hosts and each
 * one's list of templates handed to it (sf:host:{h}:tpls); a template on some live host's
 * list but not on a live building host's own is offered to that host: tpl_join (one team slot)
 * hands it over only when it is ready, not at that host yet and its `from` is there (a
 * chain of templates follows over the next passes), marking it `building` at the host;
 * the scheduler then lists it for the host and sends the host the build (the record's job
 * id, so the build's writes are its own). Two schedulers offering the same one: the first
 * marks it, the second is told no.
 *
 * An offer that is refused (a failed or deleted template, one that failed or is building on
 * that host, one whose `from` is not there yet) is not made again on every pass: each
 * scheduler waits 2, 4, 8 ... passes (at most JOIN_GAP_MAX, ~5 minutes at the default
 * host_ttl_ms) before it offers that template to that host again, and forgets the pair once
 * it is no longer a candidate (the host lists the template, or left, or the template is on no
 * live host's list). Offers skipped so do not use up the JOIN_MAX of a pass, so templates
 * that can be built are not held back by ones that cannot. */
#include "sched.h"
#include "sf_kafka.h"
#include "sf_log.h"
#include "sf_map.h"
#include "sf_store.h"
#include "sf_tools.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOIN_MAX 64 /* offers per pass (the rest wait for the next) */
#define JOIN_GAP_MAX 64   /* passes between two offers of one refused pair, at most */
#define JOIN_PAIRS_MAX 65536 /* refused pairs remembered (past it: offered every pass) */

/* A refused pair ("<host> <team> <name>"): when it is offered again. */
typedef struct jskip {
    unsigned next;   /* the pass from which it is offered again */
    unsigned gap;    /* passes to wait after its next refusal */
    unsigned seen;   /* the last pass it was a candidate in */
} jskip;

static sf_map *skips;
static unsigned npass;

typedef struct jpass {
    sch_ctx *ctx;
    json_t *hosts;   /* the live hosts (placement's view) */
    json_t *lists;   /* host -> [members of its :tpls] */
    size_t pending;  /* reads or offers still out */
    int failed;      /* a list could not be read: no offers this pass */
} jpass;

typedef struct jhost {
    jpass *p;
    char h[SF_ID_MAX];
} jhost;

typedef struct jop {
    jpass *p;
    char host[SF_ID_MAX];
    char team[SF_ID_MAX];
    char name[128];
    char from[128];
    int deb;
} jop;

static int busy; /* one pass at a time */

static void pair_key(char *buf, size_t n, const char *host, const char *team, const char *name)
{
    snprintf(buf, n, "%s %s %s", host, team, name);
}

/* The pair was refused: offered again after its gap, which doubles up to JOIN_GAP_MAX. */
static void pair_refused(const char *host, const char *team, const char *name)
{
    char k[SF_ID_MAX * 2 + 130];
    jskip *j;

    pair_key(k, sizeof(k), host, team, name);
    if (!skips && !(skips = sf_map_new(JOIN_PAIRS_MAX)))
        return;
    if (!(j = sf_map_get(skips, k))) {
        if (!(j = calloc(1, sizeof(*j))))
            return;
        j->gap = 2;
        if (sf_map_put(skips, k, j) < 0) {
            free(j);
            return;
        }
    }
    j->seen = npass;
    j->next = npass + j->gap;
    j->gap = j->gap * 2 > JOIN_GAP_MAX ? JOIN_GAP_MAX : j->gap * 2;
}

static void pair_built(const char *host, const char *team, const char *name)
{
    char k[SF_ID_MAX * 2 + 130];

    pair_key(k, sizeof(k), host, team, name);
    if (skips)
        free(sf_map_del(skips, k));
}

typedef struct stale {
    char **keys;
    size_t n;
} stale;

static void collect_stale(const char *key, void *val, void *arg)
{
    stale *st = arg;
    char *k;

    if (((jskip *)val)->seen != npass && (k = strdup(key)))
        st->keys[st->n++] = k;
}

/* Forgets the pairs that were no candidate in this pass. */
static void prune(void)
{
    stale st = {0};
    size_t n = skips ? sf_map_len(skips) : 0;

    if (!n || !(st.keys = calloc(n, sizeof(*st.keys))))
        return;
    sf_map_foreach(skips, collect_stale, &st);
    for (size_t i = 0; i < st.n; i++) {
        free(sf_map_del(skips, st.keys[i]));
        free(st.keys[i]);
    }
    free(st.keys);
}

static void free_skip(const char *key, void *val, void *arg)
{
    (void)key;
    (void)arg;
    free(val);
}

void sch_tpl_join_fini(void)
{
    if (skips)
        sf_map_foreach(skips, free_skip, NULL);
    sf_map_free(skips);
    skips = NULL;
}

static void pass_end(jpass *p)
{
    if (--p->pending > 0)
        return;
    json_decref(p->hosts);
    json_decref(p->lists);
    free(p);
    busy = 0;
}

static const char *el(const redisReply *rep, size_t i)
{
    return i < rep->elements && rep->element[i]->type == REDIS_REPLY_STRING
               ? rep->element[i]->str
               : "";
}

/* The build, as sandbox_template_create's own to a host that is not the lead. */
static void send_build(jop *o, const redisReply *rep)
{
    sch_ctx *ctx = o->p->ctx;
    json_t *steps = json_loads(el(rep, 2), 0, NULL);
    sf_job job;
    sf_buf b;
    int rc = -ENOMEM;

    sf_job_init(&job);
    snprintf(job.id, sizeof(job.id), "%s", el(rep, 1));
    snprintf(job.team, sizeof(job.team), "%s", o->team);
    snprintf(job.tool, sizeof(job.tool), "%s", SF_TOOL_TEMPLATE_BUILD);
    snprintf(job.host, sizeof(job.host), "%s", o->host);
    /* never answered (an internal message): a reply topic of no one */
    snprintf(job.reply, sizeof(job.reply), "%s", SCH_TOPIC_TPLJOIN);
    job.deadline_ms = sf_now_ms() + 3600 * 1000LL;
    job.args = json_pack("{s:s, s:s, s:o, s:I, s:I, s:I, s:b}", "name", o->name, "from", o->from,
                         "run_steps", json_is_array(steps) ? steps : json_array(),
                         "vcpu_milli", (json_int_t)strtoll(el(rep, 5), NULL, 10),
                         "memory_mib", (json_int_t)strtoll(el(rep, 6), NULL, 10),
                         "disk_mib", (json_int_t)strtoll(el(rep, 7), NULL, 10), "lead", 0);
    if (!json_is_array(steps))
        json_decref(steps);
    if (job.args && *el(rep, 3))
        json_object_set_new(job.args, "start_cmd", json_string(el(rep, 3)));
    if (job.args && *el(rep, 4))
        json_object_set_new(job.args, "ready_cmd", json_string(el(rep, 4)));
    sf_buf_init(&b, SF_MSG_MAX);
    if (job.args && sf_id_valid(job.id) && (rc = sf_job_encode(&job, &b)) == 0)
        rc = sch_hostmsg_produce(ctx, o->host, "", b.p, b.len);
    sf_buf_fini(&b);
    sf_job_fini(&job);
    if (rc < 0)
        sf_error("msg=\"cannot hand a template build to a host that joined\" team=%s "
                 "template=%s host=%s", o->team, o->name, o->host);
    else
        sf_info("msg=\"template build handed to a host that joined\" team=%s template=%s "
                "host=%s", o->team, o->name, o->host);
}

static void on_join(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    jop *o = priv;
    char member[SF_ID_MAX + 130];

    (void)ac;
    if (rep && rep->type == REDIS_REPLY_ARRAY && !strcmp(el(rep, 0), "build")) {
        snprintf(member, sizeof(member), "%s %s", o->team, o->name);
        sf_redis_cmd(o->p->ctx->redis, NULL, NULL, "SADD " SF_RK_HOST_TEMPLATES " %s", o->host,
                     member);
        send_build(o, rep);
        pair_built(o->host, o->team, o->name);
    } else if (rep && rep->type == REDIS_REPLY_ERROR) {
        sf_error("msg=\"template join script failed\" err=\"%s\"", rep->str);
    } else if (rep && rep->type == REDIS_REPLY_ARRAY) {
        pair_refused(o->host, o->team, o->name);
    }
    pass_end(o->p);
    free(o);
}

static void on_from(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    jop *o = priv;
    char key[400], fkey[400];
    const char *argv[5];
    size_t lens[5];

    (void)ac;
    if (rep && rep->type == REDIS_REPLY_NIL)
        pair_refused(o->host, o->team, o->name); /* the template is gone */
    if (!rep || rep->type != REDIS_REPLY_STRING || rep->len >= sizeof(o->from))
        goto out; /* gone, or Redis went away */
    memcpy(o->from, rep->str, rep->len + 1);
    if (snprintf(key, sizeof(key), SF_RK_TEMPLATE, o->team, o->name) >= (int)sizeof(key) ||
        snprintf(fkey, sizeof(fkey), SF_RK_TEMPLATE, o->team, o->from) >= (int)sizeof(fkey))
        goto out;
    argv[0] = key, argv[1] = fkey, argv[2] = o->host, argv[3] = o->deb ? "1" : "0";
    argv[4] = o->from;
    for (int i = 0; i < 5; i++)
        lens[i] = strlen(argv[i]);
    if (sf_redis_script_call(o->p->ctx->redis, &sf_store_tpl_join, on_join, o, 2, 3, argv,
                             lens) == 0)
        return;
out:
    pass_end(o->p);
    free(o);
}

/* Offers member ("<team> <name>") to host e. */
static void offer(jpass *p, json_t *e, const char *member)
{
    const char *sp = strchr(member, ' ');
    jop *o;

    if (!sp || (size_t)(sp - member) >= SF_ID_MAX || strlen(sp + 1) >= sizeof(o->name) ||
        !(o = calloc(1, sizeof(*o))))
        return;
    o->p = p;
    snprintf(o->host, sizeof(o->host), "%s", json_string_value(json_object_get(e, "h")));
    memcpy(o->team, member, (size_t)(sp - member));
    snprintf(o->name, sizeof(o->name), "%s", sp + 1);
    o->deb = json_is_true(json_object_get(e, "deb"));
    p->pending++;
    if (sf_redis_cmd(p->ctx->redis, on_from, o, "HGET " SF_RK_TEMPLATE " from", o->team,
                     o->name) < 0) {
        p->pending--;
        free(o);
    }
}

/* Every host's list is read: each live host whose caps say builds is offered what another holds. */
static void offer_all(jpass *p)
{
    json_t *all = json_object(), *e, *l, *m;
    const char *h, *k;
    size_t i, j, n = 0;

    json_object_foreach(p->lists, h, l)
        json_array_foreach(l, j, m)
            json_object_set_new(all, json_string_value(m), json_true());
    json_array_foreach(p->hosts, i, e) {
        if (!sch_host_can(e, SF_HOSTCAP_BUILDS) || !json_string_value(json_object_get(e, "h")))
            continue;
        l = json_object_get(p->lists, json_string_value(json_object_get(e, "h")));
        json_object_foreach(all, k, m) {
            int has = 0;
            json_t *x;
            jskip *sk;
            char pk[SF_ID_MAX * 2 + 130];
            json_array_foreach(l, j, x) {
                if (!strcmp(json_string_value(x), k))
                    has = 1;
            }
            if (has)
                continue;
            snprintf(pk, sizeof(pk), "%s %s", json_string_value(json_object_get(e, "h")), k);
            if (skips && (sk = sf_map_get(skips, pk))) {
                sk->seen = npass;
                if ((int)(npass - sk->next) < 0)
                    continue; /* refused lately: not yet */
            }
            if (n++ < JOIN_MAX)
                offer(p, e, k);
        }
    }
    json_decref(all);
    prune();
}

static void on_list(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    jhost *jh = priv;
    jpass *p = jh->p;
    json_t *l = json_array();

    (void)ac;
    for (size_t i = 0; l && rep && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING)
            json_array_append_new(l, json_string(rep->element[i]->str));
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        p->failed = 1;
    json_object_set_new(p->lists, jh->h, l);
    free(jh);
    if (p->pending == 1 && !p->failed) { /* the last list */
        p->pending++;                    /* held while the offers go out */
        offer_all(p);
        pass_end(p);
    }
    pass_end(p);
}

static void on_hosts(void *priv, json_t *hosts)
{
    jpass *p = priv;
    json_t *e;
    size_t i;

    if (hosts && json_array_size(hosts))
        p->hosts = json_incref(hosts);
    json_array_foreach(p->hosts, i, e) {
        const char *h = json_string_value(json_object_get(e, "h"));
        jhost *jh;

        if (!h || strlen(h) >= SF_ID_MAX || !(jh = calloc(1, sizeof(*jh))))
            continue;
        jh->p = p;
        memcpy(jh->h, h, strlen(h) + 1);
        p->pending++;
        if (sf_redis_cmd(p->ctx->redis, on_list, jh, "SMEMBERS " SF_RK_HOST_TEMPLATES, h) < 0) {
            p->pending--;
            p->failed = 1;
            free(jh);
        }
    }
    pass_end(p);
}

void sch_tpl_join(sch_ctx *ctx)
{
    jpass *p;

    if (busy || !sf_redis_connected(ctx->redis) || !(p = calloc(1, sizeof(*p))))
        return;
    if (!(p->lists = json_object())) {
        free(p);
        return;
    }
    p->ctx = ctx;
    p->pending = 1;
    busy = 1;
    npass++;
    if (sch_hosts_read(ctx, on_hosts, p) < 0)
        pass_end(p);
}
