/* preview_team.c: each team's preview traffic, one table for the whole process (every
 * thread's connections count together): open connections against the team's cap, a
 * token bucket for its bandwidth, and the counters /metrics shows. */
#include "preview.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TEAMS_MAX 4096
#define TEAM_NAME_MAX 64

struct gw_pv_team {
    char name[TEAM_NAME_MAX];
    unsigned conns;
    uint64_t requests, up, down;
    double tokens;   /* bandwidth bucket (bytes) */
    uint64_t refill_ms;
    pthread_mutex_t *mu;
};

struct gw_pv_teams {
    pthread_mutex_t mu;
    gw_pv_team *e; /* TEAMS_MAX, allocated once: entries never move */
    size_t n;
};

gw_pv_teams *gw_pv_teams_new(void)
{
    gw_pv_teams *t = calloc(1, sizeof(*t));

    if (!t || !(t->e = calloc(TEAMS_MAX, sizeof(*t->e)))) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

void gw_pv_teams_free(gw_pv_teams *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t->e);
    free(t);
}

gw_pv_team *gw_pv_team_get(gw_pv_teams *t, const char *team)
{
    gw_pv_team *e = NULL;

    if (strlen(team) >= TEAM_NAME_MAX)
        return NULL;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n && !e; i++)
        if (!strcmp(t->e[i].name, team))
            e = &t->e[i];
    if (!e && t->n < TEAMS_MAX) {
        e = &t->e[t->n++];
        strcpy(e->name, team); /* length checked above */
        e->mu = &t->mu;
    }
    pthread_mutex_unlock(&t->mu);
    return e;
}

int gw_pv_team_conn_take(gw_pv_team *e, unsigned max)
{
    int rc = 0;

    pthread_mutex_lock(e->mu);
    if (e->conns >= max)
        rc = -EBUSY;
    else
        e->conns++;
    pthread_mutex_unlock(e->mu);
    return rc;
}

void gw_pv_team_conn_put(gw_pv_team *e)
{
    pthread_mutex_lock(e->mu);
    if (e->conns)
        e->conns--;
    pthread_mutex_unlock(e->mu);
}

void gw_pv_team_count(gw_pv_team *e, uint64_t requests, uint64_t up, uint64_t down)
{
    pthread_mutex_lock(e->mu);
    e->requests += requests;
    e->up += up;
    e->down += down;
    pthread_mutex_unlock(e->mu);
}

size_t gw_pv_team_bytes(gw_pv_team *e, size_t want, uint64_t rate, uint64_t now_ms,
                        unsigned *wait_ms)
{
    size_t got;

    if (rate == 0)
        return want;
    pthread_mutex_lock(e->mu);
    if (e->refill_ms == 0 || now_ms < e->refill_ms) {
        e->tokens = (double)rate / 10; /* start with a tenth of a second's worth */
    } else {
        e->tokens += (double)(now_ms - e->refill_ms) * (double)rate / 1000.0;
        if (e->tokens > (double)rate / 4) /* bursts of at most a quarter second */
            e->tokens = (double)rate / 4;
    }
    e->refill_ms = now_ms;
    got = e->tokens >= (double)want ? want : (size_t)e->tokens;
    e->tokens -= (double)got;
    pthread_mutex_unlock(e->mu);
    if (got == 0) {
        /* when 16 KiB (or what was asked) will have come in */
        double need = (double)(want < 16384 ? want : 16384);
        unsigned ms = (unsigned)(need * 1000.0 / (double)rate) + 1;

        *wait_ms = ms > 1000 ? 1000 : ms;
    }
    return got;
}

void gw_pv_teams_metrics(gw_pv_teams *t, sf_buf *b)
{
    static const char *const names[] = {
        "sandfleet_gateway_preview_requests_total",
        "sandfleet_gateway_preview_bytes_up_total",
        "sandfleet_gateway_preview_bytes_down_total",
        "sandfleet_gateway_preview_connections",
    };
    static const char *const help[] = {
        "Preview requests relayed to sandboxes, by team.",
        "Preview bytes from browsers to sandboxes, by team.",
        "Preview bytes from sandboxes to browsers, by team.",
        "Open preview connections, by team.",
    };

    pthread_mutex_lock(&t->mu);
    for (size_t k = 0; k < 4; k++) {
        sf_buf_appendf(b, "# HELP %s %s\n# TYPE %s %s\n", names[k], help[k], names[k],
                       k == 3 ? "gauge" : "counter");
        for (size_t i = 0; i < t->n; i++) {
            const gw_pv_team *e = &t->e[i];
            unsigned long long v = k == 0 ? e->requests : k == 1 ? e->up : k == 2 ? e->down
                                                                                    : e->conns;

            sf_buf_appendf(b, "%s{team=\"%s\"} %llu\n", names[k], e->name, v);
        }
    }
    pthread_mutex_unlock(&t->mu);
}
