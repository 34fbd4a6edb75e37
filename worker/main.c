/* sandfleet-worker: parse config, build objects, run the loop, tear down. */
#include "worker.h"
#include "restart.h"
#include "egress.h"
#include "tstore.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_timers.h"
#include "sf_msg.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const sf_cfg_entry cfg_table[] = {
    SF_COMMON_CFG_ENTRIES(wk_cfg),
    SF_CFG_S(wk_cfg, host_id, "", "this host's id ([a-z0-9_-]); empty = from the hostname"),
    SF_CFG_S(wk_cfg, host_key_file, "",
             "this host's key for the scheduler's jobs ('sandfleet hosts key HOST' writes it)"),
    SF_CFG_S(wk_cfg, auth_secret_file, "/var/lib/sandfleet/auth.key",
             "without host_key_file: the host key is derived from this auth secret (one box)"),
    SF_CFG_S(wk_cfg, state_dir, "/var/lib/sandfleet/worker", "sandboxes and templates live here"),
    SF_CFG_S(wk_cfg, agent_path, "", "the static sandfleet-agent binary; empty = beside this one"),
    SF_CFG_S(wk_cfg, driver, "jail", "isolation driver: jail (namespaces) or qemu (microVMs)"),
    SF_CFG_S(wk_cfg, schemas_dir, "schemas/tools", SF_MSG_CFG_SCHEMAS_DIR),
    SF_CFG_S(wk_cfg, proxy_control_socket, "/var/lib/sandfleet/proxy.sock",
             "this host's secret-proxy (every sandbox's egress); empty = no network at all"),
    SF_CFG_S(wk_cfg, templates_dir, "/var/cache/sandfleet/templates",
             "built-in templates (debian), built once and shared by this host's workers"),
    SF_CFG_S(wk_cfg, vm_dir, "/var/cache/sandfleet/vm",
             "qemu: guests and template snapshots, shared by this host's workers"),
    SF_CFG_I(wk_cfg, vm_save_after_ms, "300000", 0, 86400000LL,
             "qemu: a VM paused this long is saved to disk and its memory freed (0 = never)"),
    SF_CFG_I(wk_cfg, vm_pool, "1", 0, 64,
             "qemu: VMs kept restored ahead of time, so a create only hands one out"),
    SF_CFG_I(wk_cfg, claim_team_mib, "64", 16, 1048576,
             "MiB of large answers (file reads, ZIPs) one team may have in Redis at once"),
    SF_CFG_I(wk_cfg, guard_team_mib, "64", 1, 1048576,
             "MiB of answers kept for repeats (job guards) one team may have in Redis at once"),
    SF_CFG_I(wk_cfg, job_deadline_max_ms, "3600000", 1000, 86400000LL,
             "a job's deadline (set by its producer) is capped at this long from its arrival"),
    SF_CFG_I(wk_cfg, zips, "2", 1, 64,
             "directory downloads (ZIPs, up to 64 MiB read each) built at once"),
    SF_CFG_I(wk_cfg, capacity, "64", 1, 100000,
             "sandboxes this host runs at most (fewer when its resources say so)"),
    SF_CFG_I(wk_cfg, memory_mib, "512", 64, 1048576,
             "default memory limit per sandbox (MiB), when the scheduler sends none"),
    SF_CFG_I(wk_cfg, vcpu_milli, "1000", 10, 1000000,
             "default CPU per sandbox (1000 = one core)"),
    SF_CFG_I(wk_cfg, disk_mib, "2048", 16, 16777216, "default disk per sandbox (MiB)"),
    SF_CFG_I(wk_cfg, inodes, "262144", 1024, 4294967296LL, "default files per sandbox"),
    SF_CFG_I(wk_cfg, pids_max, "256", 8, 1000000, "default process limit per sandbox"),
    SF_CFG_I(wk_cfg, nofile, "4096", 64, 1048576, "open files per sandbox process"),
    SF_CFG_I(wk_cfg, host_share_pct, "100", 1, 100,
             "share of this host's memory, CPU and disk for this worker (several on one box)"),
    SF_CFG_I(wk_cfg, reserve_mem_mib, "1024", 0, 1048576,
             "host memory kept for the platform's own daemons (MiB)"),
    SF_CFG_I(wk_cfg, reserve_vcpu_milli, "500", 0, 1000000,
             "host CPU kept for the platform's own daemons (1000 = one core)"),
    SF_CFG_I(wk_cfg, cpu_overcommit_pct, "1000", 100, 10000,
             "sum of the sandboxes' vcpu_milli allowed, in % of the CPU they may really use"),
    SF_CFG_I(wk_cfg, disk_overcommit_pct, "100", 100, 10000,
             "sum of the sandboxes' disk_mib allowed, in % of the free disk (disks are "
             "sparse: past 100, sandboxes that all fill theirs get ENOSPC)"),
    SF_CFG_I(wk_cfg, pool_images, "4", 0, 256, "formatted sandbox disk images kept ready"),
    SF_CFG_I(wk_cfg, pool_threads, "2", 1, 16, "threads for the driver's blocking work"),
    SF_CFG_B(wk_cfg, teardown_stop, "no",
             "tests only: each teardown stops itself (SIGSTOP) half-way until SIGCONT"),
    SF_CFG_I(wk_cfg, heartbeat_ms, "1000", 100, 60000, "heartbeat period"),
    SF_CFG_I(wk_cfg, idle_pause_ms, "900000", 0, 604800000LL,
             "a running sandbox without calls this long is paused (0 = never)"),
    SF_CFG_I(wk_cfg, lifetime_s, "86400", 60, 604800,
             "default lifetime of a sandbox created without timeout_seconds (s)"),
    SF_CFG_I(wk_cfg, timer_tick_ms, "1000", 50, 60000,
             "how often this host's due lifecycle timers are read from Redis"),
    SF_CFG_I(wk_cfg, snapshots_per_team, "16", 0, 1000,
             "sandbox snapshots one team may hold (sandbox_snapshot)"),
    SF_CFG_I(wk_cfg, snapshot_team_mib, "8192", 1, 1073741824LL,
             "MiB one team's sandbox snapshots may hold together"),
    SF_CFG_I(wk_cfg, snapshot_sweep_ms, "30000", 100, 3600000,
             "how often the files of deleted snapshots are looked for and removed"),
    SF_CFG_S(wk_cfg, ingress_listen, "127.0.0.1:0",
             "the preview ingress (gateways hop here): ip:port; port 0 = any free one"),
    SF_CFG_S(wk_cfg, preview_domain, "preview.localhost:8080",
             "preview URLs: {port}-{sandbox}.<this> (the gateways' preview_domain)"),
    SF_CFG_S(wk_cfg, preview_scheme, "http", "preview URLs' scheme: http or https"),
    SF_CFG_I(wk_cfg, ingress_conns, "4096", 1, 1000000,
             "preview connections open at once on this host"),
    SF_CFG_I(wk_cfg, ingress_conns_per_sandbox, "256", 1, 1000000,
             "preview connections open at once to one sandbox"),
    SF_CFG_I(wk_cfg, ingress_local, "1", 0, 1,
             "1: a gateway on this machine takes the connected socket into the sandbox over "
             "state_dir/ingress/ingress.sock and relays it itself (0: TCP hops only)"),
    SF_CFG_I(wk_cfg, exec_detach_ms, "50000", 0, 600000,
             "sandbox_exec: a command still running this long answers with its output so "
             "far and goes on in the background, before clients' 60 s request timeouts "
             "(0 = never; a call's detach_after_ms overrides)"),
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

/* Why a sandbox of the previous run is lost: what taking it back said (restart.c). */
static const char *lost_why(const json_t *lost, const char *id)
{
    size_t i;
    json_t *v;

    json_array_foreach(lost, i, v)
        if (!strcmp(json_string_value(json_object_get(v, "id")) ?: "", id))
            return json_string_value(json_object_get(v, "why"));
    return "The worker restarted and had no record of it (it was not kept).";
}

/* The live sandboxes of a previous run that were not taken back: a `lost` event for each
 * (before the retiring), with why, and a log line. */
static void lost_events(wk_ctx *ctx, redisContext *c, const json_t *lost)
{
    redisReply *ids = sf_redis_sync_cmd(c, "SMEMBERS " SF_RK_HOST_SANDBOXES, ctx->host_id);

    for (size_t i = 0; ids && ids->type == REDIS_REPLY_ARRAY && i < ids->elements; i++) {
        const char *id = ids->element[i]->str;
        redisReply *v = id && !wk_restart_adopted(id, ctx)
                            ? sf_redis_sync_cmd(c, "HMGET " SF_RK_SANDBOX " team state", id)
                            : NULL;
        if (v && v->type == REDIS_REPLY_ARRAY && v->elements == 2 &&
            v->element[0]->type == REDIS_REPLY_STRING && v->element[1]->type == REDIS_REPLY_STRING &&
            strcmp(v->element[1]->str, "killed") && strcmp(v->element[1]->str, "failed") &&
            strcmp(v->element[1]->str, "lost") && strcmp(v->element[1]->str, "creating")) {
            const char *why = lost_why(lost, id);
            json_t *extra = json_pack("{s:s}", "reason", why);
            sf_warn("msg=\"sandbox of the previous run lost\" sandbox=%s team=%s why=\"%s\"", id,
                    v->element[0]->str, why);
            wk_event(ctx, "lost", v->element[0]->str, id, extra);
            json_decref(extra);
        }
        if (v)
            freeReplyObject(v);
    }
    if (ids)
        freeReplyObject(ids);
}

/* Sandboxes a previous run of this host left in Redis and this run did not take back
 * (restart.c) are gone: mark them lost before taking any job. Without a driver that keeps
 * sandboxes the host's timers go too (a kept sandbox's stay: a lost one's fire on nothing). */
static void reconcile(wk_ctx *ctx, const json_t *lost)
{
    char why[256];
    long long n = 0;

    for (int tries = 0; tries < 20; tries++) {
        redisContext *c = sf_redis_connect_sync(ctx->cfg.common.redis_url, why, sizeof(why));
        int rc;
        if (c)
            lost_events(ctx, c, lost);
        rc = c ? sf_records_retire_host_except_sync(c, ctx->host_id, wk_restart_adopted, ctx, &n)
               : -1;
        if (rc == 0 && !ctx->ops->adopt) /* their timers go with them */
            rc = sf_timers_clear_host_sync(c, ctx->host_id);
        if (rc == 0) /* and the template builds it had under way */
            rc = wk_tpl_build_reconcile_sync(ctx, c);
        if (rc == 0) { /* a drain asked of the previous run ended with it */
            redisReply *d = sf_redis_sync_cmd(c, "DEL " SF_RK_HOST_DRAIN, ctx->host_id);
            rc = d && d->type != REDIS_REPLY_ERROR ? 0 : -1;
            if (d)
                freeReplyObject(d);
        }
        if (c)
            sf_redis_sync_free(c);
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

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
}

static void count_kept(const char *key, void *val, void *arg)
{
    *(int *)arg += ((wk_box *)val)->kept;
}

static int kept_n(wk_ctx *ctx)
{
    int n = 0;
    sf_map_foreach(ctx->sandboxes, count_kept, &n);
    return n;
}

/* Kills every sandbox not kept for the next worker (restart.c; its record becomes `lost`)
 * and runs the loop until their teardowns ended, for at most 15 s. */
static void kill_all(wk_ctx *ctx)
{
    size_t n = sf_map_len(ctx->sandboxes);
    wk_box **all = calloc(n + 1, sizeof(*all)), **p = all;
    struct timeval tick = {0, 100 * 1000};
    int64_t deadline = sf_mono_ms() + 15000;
    struct event *ev;

    if (!all)
        return;
    sf_map_foreach(ctx->sandboxes, collect_box, &p);
    for (size_t i = 0; i < n; i++)
        if (all[i]->state != WK_BOX_KILLING && !all[i]->kept)
            wk_box_kill(all[i], "lost");
    free(all);
    if (!(ev = event_new(ctx->d.base, -1, EV_PERSIST, on_tick, NULL)))
        return;
    event_add(ev, &tick);
    while (sf_map_len(ctx->sandboxes) > (size_t)kept_n(ctx) && sf_mono_ms() < deadline)
        event_base_loop(ctx->d.base, EVLOOP_ONCE);
    event_free(ev);
}

/* The static sandfleet-agent: agent_path, else beside this binary (build tree or
 * install). */
static void find_agent(const wk_ctx *ctx, char *agent, size_t n)
{
    ssize_t len;
    char *slash;

    if (ctx->cfg.agent_path[0]) {
        snprintf(agent, n, "%s", ctx->cfg.agent_path);
        return;
    }
    len = readlink("/proc/self/exe", agent, n - 32);
    agent[len > 0 ? len : 0] = '\0';
    slash = strrchr(agent, '/');
    snprintf(slash ? slash + 1 : agent, 32, "agent/sandfleet-agent");
    if (access(agent, X_OK) != 0 && slash)
        snprintf(slash + 1, 32, "sandfleet-agent");
}

/* The effective capacity: the setting, the driver's own bound, and how many sandboxes
 * of the default shape the host's memory holds. */
static void size_host(wk_ctx *ctx)
{
    int64_t by_mem = (int64_t)(ctx->res.mem_mib / (uint64_t)ctx->cfg.memory_mib);

    ctx->capacity = ctx->cfg.capacity;
    if (ctx->res.slots && (int64_t)ctx->res.slots < ctx->capacity)
        ctx->capacity = ctx->res.slots;
    if (by_mem < ctx->capacity)
        ctx->capacity = by_mem;
}

int main(int argc, char **argv)
{
    static wk_ctx ctx;
    char why[512], group[128], agent[4096];
    const char *dwhy = NULL;
    wk_host_cfg hc;
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
    if (wk_hostauth_init(&ctx, why, sizeof(why)) < 0) {
        sf_error("msg=\"no host key\" err=\"%s\"", why);
        goto out;
    }
    if (sf_toolset_load(&ctx.tools, ctx.cfg.schemas_dir, why, sizeof(why)) < 0 ||
        wk_jobs_check(&ctx.tools, why, sizeof(why)) < 0) {
        sf_error("msg=\"cannot load the tool schemas\" err=\"%s\"", why);
        goto out;
    }
    if (!(ctx.ops = wk_driver_find(ctx.cfg.driver))) {
        sf_error("msg=\"unknown driver; set driver to one this build has\" driver=%s has=\"%s\"",
                 ctx.cfg.driver, wk_driver_names());
        goto out;
    }
    find_agent(&ctx, agent, sizeof(agent));
    if (!(ctx.pool = wk_pool_new(ctx.d.base, (int)ctx.cfg.pool_threads))) {
        sf_error("msg=\"cannot start the worker's threads\"");
        goto out;
    }
    hc = (wk_host_cfg){
        .base = ctx.d.base,
        .pool = ctx.pool,
        .host_id = ctx.host_id,
        .state_dir = ctx.cfg.state_dir,
        .agent_path = agent,
        .defaults = {.memory_mib = (uint32_t)ctx.cfg.memory_mib,
                     .vcpu_milli = (uint32_t)ctx.cfg.vcpu_milli,
                     .disk_mib = (uint32_t)ctx.cfg.disk_mib,
                     .pids_max = (uint32_t)ctx.cfg.pids_max,
                     .inodes = (uint64_t)ctx.cfg.inodes},
        .host_share_pct = (uint32_t)ctx.cfg.host_share_pct,
        .reserve_mem_mib = (uint64_t)ctx.cfg.reserve_mem_mib,
        .reserve_vcpu_milli = (uint32_t)ctx.cfg.reserve_vcpu_milli,
        .cpu_overcommit_pct = (uint32_t)ctx.cfg.cpu_overcommit_pct,
        .disk_overcommit_pct = (uint32_t)ctx.cfg.disk_overcommit_pct,
        .nofile = (uint32_t)ctx.cfg.nofile,
        .uid_base = (uint32_t)ctx.cfg.uid_base,
        .pool_images = (uint32_t)ctx.cfg.pool_images,
        .teardown_stop = ctx.cfg.teardown_stop,
        .vm_dir = ctx.cfg.vm_dir,
        .vm_save_after_ms = (uint32_t)ctx.cfg.vm_save_after_ms,
        .vm_pool = (uint32_t)ctx.cfg.vm_pool,
    };
    wk_host_measure(&hc); /* the host policy, once: drivers get the numbers */
    if (ctx.ops->host_init(&hc, &ctx.drv, &dwhy) < 0) {
        sf_error("msg=\"%s driver cannot start\" why=\"%s\"", ctx.ops->name, dwhy ? dwhy : "");
        goto out;
    }
    ctx.ops->host_res(ctx.drv, &ctx.res);
    if (wk_tstore_new(ctx.cfg.templates_dir, ctx.cfg.state_dir, ctx.ops, ctx.drv,
                      &ctx.tstore) < 0) {
        sf_error("msg=\"templates_dir must be an absolute path\" templates_dir=%s",
                 ctx.cfg.templates_dir);
        goto out;
    }
    size_host(&ctx);
    if (ctx.capacity < 1) {
        sf_error("msg=\"this host has no room for one sandbox of the default shape; lower "
                 "memory_mib or reserve_mem_mib, or raise host_share_pct\" mem_mib=%llu",
                 (unsigned long long)ctx.res.mem_mib);
        goto out;
    }
    snprintf(group, sizeof(group), "sf-worker-%s", ctx.host_id);
    if (!(ctx.sandboxes = sf_map_new((size_t)ctx.capacity + 16)) ||
        !(ctx.running = sf_map_new(4096)) ||
        !(ctx.redis = sf_redis_new(ctx.d.base, ctx.cfg.common.redis_url, why, sizeof(why))) ||
        !(ctx.producer = sf_kafka_producer_new(&ctx.d.kafka, why, sizeof(why))) ||
        !(ctx.consumer = sf_kafka_consumer_new(&ctx.d.kafka, group, why, sizeof(why)))) {
        sf_error("msg=\"cannot start\" err=\"%s\"", why);
        goto out;
    }
    if (wk_restart_init(&ctx) < 0)
        sf_warn("msg=\"cannot use state_dir/boxes (it must be root's, mode 0700); a worker "
                "restart will lose this host's sandboxes\" state_dir=%s", ctx.cfg.state_dir);
    /* (egress first: the sandboxes taken back keep their registrations) */
    if (wk_egress_new(&ctx, ctx.cfg.proxy_control_socket, &ctx.egress) < 0) {
        sf_error("msg=\"cannot start the link to the egress proxy\" socket=%s",
                 ctx.cfg.proxy_control_socket);
        goto out;
    }
    {
        json_t *lost = json_array();
        if (!lost)
            goto out;
        wk_restart_adopt(&ctx, lost); /* the sandboxes of the previous run that still live */
        reconcile(&ctx, lost); /* (with the producer: its lost events) */
        json_decref(lost);
    }
    wk_egress_drop_others(ctx.egress);
    /* (15 s: on Apache Kafka a group's first use waits for its coordinator) */
    int arc = sf_kafka_assign_all(ctx.consumer, ctx.producer, ctx.topic, RD_KAFKA_OFFSET_STORED,
                                  15000);
    if (arc == -EACCES)
        sf_error("msg=\"%s\" topic=%s",
                 sf_kafka_err_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED), ctx.topic);
    if (arc < 0 ||
        !(ctx.jobq = sf_jobq_new(ctx.d.base, ctx.consumer, ctx.producer, ctx.topic, wk_on_job,
                                 wk_on_bad, &ctx)) ||
        wk_preview_start(&ctx) < 0 || /* (before the heartbeat, which names it) */
        wk_host_start(&ctx) < 0 || wk_life_start(&ctx) < 0 || wk_snap_start(&ctx) < 0) {
        sf_error("msg=\"cannot consume the host topic\" topic=%s", ctx.topic);
        goto out;
    }
    sf_info("msg=\"worker up\" host=%s topic=%s driver=%s capacity=%lld mem_mib=%llu "
            "vcpu_milli=%llu", ctx.host_id, ctx.topic, ctx.ops->name, (long long)ctx.capacity,
            (unsigned long long)ctx.res.mem_mib, (unsigned long long)ctx.res.vcpu_milli);
    sf_daemon_ready();
    event_base_dispatch(ctx.d.base);
    rc = 0;
out:
    /* Jobs still arriving are answered "shutting down"; running ones end with their
     * sandboxes; then Redis writes and replies get 200 ms to go out. Redis goes before
     * Kafka, so callbacks it fires on the way out can still answer their calls. */
    ctx.stopping = 1;
    wk_tpl_build_stop_all(&ctx); /* a clean stop is not reaped: its builds end here */
    if (ctx.sandboxes) {
        /* Running sandboxes stay up for the next worker (an upgrade, a restart): `sandfleet
         * hosts drain` empties a host. The rest (creates under way) end here. */
        if (ctx.drv && wk_restart_keep_all(&ctx))
            sf_info("msg=\"sandboxes left running for the next worker\" count=%d", kept_n(&ctx));
        kill_all(&ctx);
    }
    wk_preview_stop(&ctx); /* (after the kills: they answered the hops waiting on resumes) */
    wk_life_stop(&ctx);
    wk_snap_stop(&ctx);
    wk_egress_free(ctx.egress); /* the kills' unregisters go out */
    ctx.egress = NULL;
    wk_host_stop(&ctx);
    if (ctx.redis && ctx.d.base) {
        struct timeval grace = {0, 200 * 1000};
        event_base_loopexit(ctx.d.base, &grace);
        event_base_dispatch(ctx.d.base);
    }
    wk_tstore_free(ctx.tstore); /* (before the driver: its build may call tpl_image) */
    ctx.tstore = NULL;
    if (ctx.ops && ctx.drv)
        ctx.ops->host_fini(ctx.drv);
    if (ctx.sandboxes)
        wk_restart_free_kept(&ctx);
    wk_pool_free(ctx.pool);
    wk_tpl_build_free_all();
    sf_redis_free(ctx.redis);
    sf_jobq_free(ctx.jobq);
    sf_kafka_consumer_free(ctx.consumer);
    sf_kafka_producer_free(ctx.producer);
    sf_map_free(ctx.sandboxes);
    sf_map_free(ctx.running);
    sf_toolset_fini(&ctx.tools);
    sf_daemon_fini(&ctx.d);
    sf_config_free(cfg_table, SF_ARRAY_LEN(cfg_table), &ctx.cfg);
    return rc;
}
