/* sandfleet-scheduler: parse config, build objects, run the loop, tear down. */
#include "sched.h"
#include "sf_apikeys.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <stdio.h>

static const sf_cfg_entry cfg_table[] = {
    SF_COMMON_CFG_ENTRIES(sch_cfg),
    SF_CFG_S(sch_cfg, preview_domain, "preview.localhost:8080",
             "preview URLs in sandbox_info: {port}-{sandbox}.<this> (the gateways' too)"),
    SF_CFG_S(sch_cfg, preview_scheme, "http", "the scheme of the preview URLs in sandbox_info: http or https"),
    SF_CFG_I(sch_cfg, host_ttl_ms, "5000", 500, 600000,
             "a host is live while its last heartbeat is younger than this"),
    SF_CFG_I(sch_cfg, host_dead_ms, "60000", 1000, 86400000,
             "a host silent this long is removed and its sandboxes marked lost"),
    SF_CFG_I(sch_cfg, team_sandbox_limit, "100", 1, 1000000, "sandboxes one team may have"),
    SF_CFG_I(sch_cfg, team_host_share_pct, "50", 1, 100,
             "share (%) of one host's sandboxes, memory and CPU a team may hold"),
    SF_CFG_I(sch_cfg, team_fleet_share_pct, "50", 1, 100,
             "share (%) of all live hosts' sandboxes, memory and CPU a team may hold"),
    SF_CFG_I(sch_cfg, sandbox_memory_mib, "512", 16, 1048576, "memory of a new sandbox (MiB)"),
    SF_CFG_I(sch_cfg, sandbox_vcpu_milli, "1000", 10, 256000,
             "CPU of a new sandbox (thousandths of a vCPU)"),
    SF_CFG_I(sch_cfg, sandbox_disk_mib, "2048", 0, 16777216,
             "disk of a new sandbox (MiB; 0 = the worker's default)"),
    SF_CFG_I(sch_cfg, sandbox_inodes, "0", 0, 1000000000,
             "inodes of a new sandbox (0 = the worker's default)"),
    SF_CFG_I(sch_cfg, sandbox_pids_max, "256", 8, 1000000, "processes of a new sandbox"),
    SF_CFG_I(sch_cfg, desktop_memory_mib, "2048", 256, 1048576,
             "memory of a 'desktop' sandbox (MiB; at most what the largest host offers)"),
    SF_CFG_I(sch_cfg, desktop_vcpu_milli, "1000", 100, 256000,
             "CPU of a 'desktop' sandbox (thousandths of a vCPU)"),
    SF_CFG_I(sch_cfg, desktop_pids_max, "1024", 64, 1000000,
             "processes and threads of a 'desktop' sandbox (a browser runs hundreds)"),
    SF_CFG_S(sch_cfg, schemas_dir, "schemas/tools", SF_MSG_CFG_SCHEMAS_DIR),
    SF_CFG_S(sch_cfg, auth_secret_file, "/var/lib/sandfleet/auth.key",
             "the deployment's auth secret (64 hex chars): checks the signature of every job"),
    SF_CFG_I(sch_cfg, accept_unsigned, "0", 0, 1,
             "1: take jobs without a signature as a gateway's (only behind Kafka ACLs)"),
    SF_CFG_I(sch_cfg, template_wait_s, "600", 0, 3600,
             "a sandbox_create waits this long (s) for a template a host is still building"),
    SF_CFG_I(sch_cfg, template_wait_detach_ms, "45000", 1000, 3600000,
             "a sandbox_create that asked for no progress waits at most this long for a "
             "template being built, then answers 'still being built' (before common client "
             "timeouts, 60 s)"),
    SF_CFG_S(sch_cfg, default_template, "debian",
             "template of a sandbox_create without from_template: debian (base on a fleet of "
             "qemu hosts only) or base"),
};

int main(int argc, char **argv)
{
    static sch_ctx ctx;
    char why[512];
    int rc = 1;

    switch (sf_config_main(argc, argv, "sandfleet-scheduler", cfg_table, SF_ARRAY_LEN(cfg_table),
                           &ctx.cfg)) {
    case 1:
        return 0;
    case -1:
        return 2;
    }
    if (sf_daemon_init(&ctx.d, "scheduler", &ctx.cfg.common) < 0)
        goto out;
    if (sf_toolset_load(&ctx.tools, ctx.cfg.schemas_dir, why, sizeof(why)) < 0 ||
        sch_pipeline_check(&ctx.tools, why, sizeof(why)) < 0 ||
        sch_auth_init(&ctx, why, sizeof(why)) < 0) {
        sf_error("msg=\"cannot load the tool schemas or the auth secret\" err=\"%s\"", why);
        goto out;
    }
    /* batch producers' keys handed out before the {apikeys} slot keep signing
     * (state/sf_apikeys.h) */
    sf_apikeys_migrate_start(ctx.cfg.common.redis_url);
    if (!(ctx.redis = sf_redis_new(ctx.d.base, ctx.cfg.common.redis_url, why, sizeof(why))) ||
        !(ctx.producer = sf_kafka_producer_new(&ctx.d.kafka, why, sizeof(why))) ||
        !(ctx.consumer = sf_kafka_consumer_new(&ctx.d.kafka, "sf-scheduler", why, sizeof(why)))) {
        sf_error("msg=\"cannot start\" err=\"%s\"", why);
        goto out;
    }
    /* the reply topic of the builds tpl_join.c hands out, which no one reads: made here where
     * topics are not made on first use (refused without CREATE: the operator makes it,
     * ops/RUNBOOK.md) */
    (void)sf_kafka_topic_create(ctx.producer, SCH_TOPIC_TPLJOIN, 5000);
    if (sf_kafka_subscribe(ctx.consumer, SF_TOPIC_JOBS) < 0 ||
        !(ctx.jobq = sf_jobq_new(ctx.d.base, ctx.consumer, ctx.producer, SF_TOPIC_JOBS,
                                 sch_on_job, sch_on_bad, &ctx)) ||
        sch_reaper_start(&ctx) < 0) {
        sf_error("msg=\"cannot subscribe\" topic=%s", SF_TOPIC_JOBS);
        goto out;
    }
    sf_info("msg=\"scheduler up\" kafka=%s redis=%s", ctx.cfg.common.kafka_brokers,
            ctx.cfg.common.redis_url);
    sf_daemon_ready();
    event_base_dispatch(ctx.d.base);
    rc = 0;
out:
    /* Redis first: the callbacks it fires for commands in flight answer their calls, which
     * needs the producer and the job queue. */
    sf_redis_free(ctx.redis);
    sch_tpl_join_fini();
    sf_jobq_free(ctx.jobq);
    if (ctx.ev_reap)
        event_free(ctx.ev_reap);
    sf_kafka_consumer_free(ctx.consumer);
    sf_kafka_producer_free(ctx.producer);
    sf_toolset_fini(&ctx.tools);
    sf_daemon_fini(&ctx.d);
    sf_config_free(cfg_table, SF_ARRAY_LEN(cfg_table), &ctx.cfg);
    return rc;
}
