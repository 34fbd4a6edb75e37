/* sandfleet-worker: parse config, build objects, run the loop, tear down. */
#include "worker.h"
#include "sf_log.h"
#include "sf_records.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const sf_cfg_entry cfg_table[] = {
    SF_COMMON_CFG_ENTRIES(wk_cfg),
    SF_CFG_S(wk_cfg, host_id, "", "this host's id ([a-z0-9_-]); empty = from the hostname"),
    SF_CFG_S(wk_cfg, state_dir, "/var/lib/sandfleet/worker", "sandboxes and templates live here"),
    SF_CFG_S(wk_cfg, agent_path, "", "the static sandfleet-agent binary; empty = beside this one"),
    SF_CFG_S(wk_cfg, driver, "jail", "isolation driver: jail"),
    SF_CFG_I(wk_cfg, capacity, "64", 1, 100000, "sandboxes this host runs at most"),
    SF_CFG_I(wk_cfg, memory_mib, "512", 16, 1048576, "memory limit per sandbox (MiB)"),
    SF_CFG_I(wk_cfg, pids_max, "256", 8, 1000000, "process limit per sandbox"),
    SF_CFG_I(wk_cfg, heartbeat_ms, "1000", 100, 60000, "heartbeat period"),
    SF_CFG_I(wk_cfg, uid_base, "200000", 1000, 4000000000LL,
             "first host uid mapped into sandboxes (65536 per sandbox)"),
};

static int pick_host_id(wk_ctx *ctx)
{
    char name[256] = "";
    size_t j = 0;

    if (ctx->cfg.host_id[0])
        snprintf(name, sizeof(name), "%s", ctx->cfg.host_id);
    else
        gethostname(name, sizeof(name) - 1);
    for (size_t i = 0; name[i] && j < SF_ID_MAX - 1; i++) {
        char ch = (char)tolower((unsigned char)name[i]);
        ctx->host_id[j++] = (isalnum((unsigned char)ch) || ch == '-' || ch == '_') ? ch : '-';
    }
    ctx->host_id[j] = '\0';
    if (!sf_id_valid(ctx->host_id)) {
        sf_error("msg=\"host_id must match [a-z0-9_-]{1,63}\" host_id=\"%s\"", ctx->host_id);
        return -1;
    }
    snprintf(ctx->topic, sizeof(ctx->topic), SF_TOPIC_HOST_PREFIX "%s", ctx->host_id);
    return 0;
}

/* Sandboxes a previous run of this host left in Redis are gone (the agent link does not
 * survive a restart): mark them lost before taking any job. */
static void reconcile(wk_ctx *ctx)
{
    char why[256];
    long long n = 0;

    for (int tries = 0; tries < 20; tries++) {
        redisContext *c = sf_redis_connect_sync(ctx->cfg.common.redis_url, why, sizeof(why));
        int rc = c ? sf_records_retire_host_sync(c, ctx->host_id, &n) : -1;
        if (c)
            redisFree(c);
        if (rc == 0) {
            if (n > 0)
                sf_info("msg=\"sandboxes of a previous run marked lost\" count=%lld", n);
            return;
        }
        usleep(250 * 1000);
    }
    sf_warn("msg=\"could not reconcile this host's sandboxes; Redis unreachable\" err=\"%s\"",
            why);
}

static void collect_box(const char *key, void *val, void *arg)
{
    wk_box ***pp = arg;
    *(*pp)++ = val;
}

static void kill_all(wk_ctx *ctx)
{
    size_t n = sf_map_len(ctx->sandboxes);
    wk_box **all = calloc(n + 1, sizeof(*all)), **p = all;

    if (!all)
        return;
    sf_map_foreach(ctx->sandboxes, collect_box, &p);
    for (size_t i = 0; i < n; i++)
        wk_box_destroy(all[i], "lost");
    free(all);
}

int main(int argc, char **argv)
{
    static wk_ctx ctx;
    char why[512], group[128], agent[4096];
    const char *jwhy = NULL;
    int rc = 1;

    switch (sf_config_main(argc, argv, "sandfleet-worker", cfg_table, SF_ARRAY_LEN(cfg_table),
                           &ctx.cfg)) {
    case 1:
        return 0;
    case -1:
        return 2;
    }
    if (sf_daemon_init(&ctx.d, "worker", &ctx.cfg.common) < 0 || pick_host_id(&ctx) < 0)
        goto out;
    if (strcmp(ctx.cfg.driver, "jail") != 0) {
        sf_error("msg=\"unknown driver; this build has: jail\" driver=%s", ctx.cfg.driver);
        goto out;
    }
    if (ctx.cfg.agent_path[0]) {
        snprintf(agent, sizeof(agent), "%s", ctx.cfg.agent_path);
    } else {
        ssize_t n = readlink("/proc/self/exe", agent, sizeof(agent) - 32);
        char *slash;
        agent[n > 0 ? n : 0] = '\0';
        slash = strrchr(agent, '/');
        snprintf(slash ? slash + 1 : agent, 32, "agent/sandfleet-agent");
        if (access(agent, X_OK) != 0 && slash)
            snprintf(slash + 1, 32, "sandfleet-agent");
    }
    ctx.jail.state_dir = ctx.cfg.state_dir;
    ctx.jail.agent_path = agent;
    ctx.jail.memory_bytes = (uint64_t)ctx.cfg.memory_mib << 20;
    ctx.jail.pids_max = (int)ctx.cfg.pids_max;
    ctx.jail.uid_base = (uint32_t)ctx.cfg.uid_base;
    wk_jail_host_cleanup(&ctx.jail);
    if (wk_jail_host_init(&ctx.jail, &jwhy) < 0) {
        sf_error("msg=\"jail driver cannot start\" why=\"%s\"", jwhy ? jwhy : "");
        goto out;
    }
    reconcile(&ctx);
    snprintf(group, sizeof(group), "sf-worker-%s", ctx.host_id);
    if (!(ctx.sandboxes = sf_map_new((size_t)ctx.cfg.capacity + 16)) ||
        !(ctx.redis = sf_redis_new(ctx.d.base, ctx.cfg.common.redis_url, why, sizeof(why))) ||
        !(ctx.producer = sf_kafka_producer_new(&ctx.d.kafka, why, sizeof(why))) ||
        !(ctx.consumer = sf_kafka_consumer_new(&ctx.d.kafka, group, why, sizeof(why)))) {
        sf_error("msg=\"cannot start\" err=\"%s\"", why);
        goto out;
    }
    if (sf_kafka_assign_all(ctx.consumer, ctx.producer, ctx.topic, RD_KAFKA_OFFSET_STORED,
                            5000) < 0 ||
        !(ctx.jobq = sf_jobq_new(ctx.d.base, ctx.consumer, ctx.producer, ctx.topic, wk_on_job,
                                 wk_on_bad, &ctx)) ||
        wk_host_start(&ctx) < 0) {
        sf_error("msg=\"cannot consume the host topic\" topic=%s", ctx.topic);
        goto out;
    }
    sf_info("msg=\"worker up\" host=%s topic=%s driver=%s capacity=%lld", ctx.host_id, ctx.topic,
            ctx.cfg.driver, (long long)ctx.cfg.capacity);
    event_base_dispatch(ctx.d.base);
    rc = 0;
out:
    /* Jobs still arriving are answered "shutting down"; running ones end with their
     * sandboxes; then Redis writes and replies get 200 ms to go out. Redis goes before
     * Kafka, so callbacks it fires on the way out can still answer their calls. */
    ctx.stopping = 1;
    if (ctx.sandboxes)
        kill_all(&ctx);
    wk_host_stop(&ctx);
    if (ctx.redis && ctx.d.base) {
        struct timeval grace = {0, 200 * 1000};
        event_base_loopexit(ctx.d.base, &grace);
        event_base_dispatch(ctx.d.base);
    }
    sf_redis_free(ctx.redis);
    sf_jobq_free(ctx.jobq);
    sf_kafka_consumer_free(ctx.consumer);
    sf_kafka_producer_free(ctx.producer);
    sf_map_free(ctx.sandboxes);
    sf_daemon_fini(&ctx.d);
    sf_config_free(cfg_table, SF_ARRAY_LEN(cfg_table), &ctx.cfg);
    return rc;
}
