/* hosts.c: the admin views `sandfleet hosts` (worker hosts: heartbeat age, driver, load)
 * and `sandfleet sandboxes` (every team's sandboxes, with host and state), and `sandfleet
 * hosts key HOST` (the key a worker checks its jobs with, worker/hostauth.c). */
#include "cli.h"
#include "sf_jobauth.h"
#include "sf_redis.h"
#include "sf_store.h"
#include "sf_util.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MSG_BAD_HOST                                                                         \
    "sandfleet: HOST must be a worker's host id ([a-z0-9_-], at most 63 characters; "         \
    "'sandfleet hosts' lists them).\n"

static const char hosts_usage[] =
    "usage: sandfleet hosts            worker hosts: heartbeat age, driver, sandboxes/capacity\n"
    "       sandfleet hosts key HOST   the key worker HOST checks its jobs with: write it to\n"
    "                                  the file its host_key_file (SF_HOST_KEY_FILE) names\n"
    "       sandfleet hosts drain HOST [--wait]\n"
    "                                  empty HOST: it takes no new sandboxes and kills the ones\n"
    "                                  it runs (a stop or restart of its worker keeps them);\n"
    "                                  --wait: until it runs none (at most 120 s). Its worker's\n"
    "                                  next start ends the drain\n";

#define DRAIN_WAIT_MS 120000

/* Asks HOST's worker to empty itself; with wait, until its heartbeat says it runs none. */
static int host_drain(const char *host, int wait)
{
    redisContext *rc;
    redisReply *r;
    char now[24];
    int64_t deadline = sf_now_ms() + DRAIN_WAIT_MS;
    int ret = 1;

    if (!sf_id_valid(host)) {
        fprintf(stderr, MSG_BAD_HOST);
        return 2;
    }
    if (!(rc = cli_redis()))
        return 1;
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    r = sf_redis_sync_cmd(rc, "SET " SF_RK_HOST_DRAIN " %s", host, now);
    if (!cli_reply_ok(rc, r))
        goto out;
    freeReplyObject(r);
    printf("host %s is draining: it takes no new sandboxes and kills the ones it runs\n", host);
    ret = 0;
    while (wait) {
        int64_t running = -1, cap = -1, ts = -1, asked = 0;
        sf_parse_i64(now, 0, INT64_MAX, &asked);
        r = sf_redis_sync_cmd(rc, "HMGET " SF_RK_HOST " running capacity ts", host);
        if (!cli_reply_ok(rc, r)) {
            ret = 1;
            break;
        }
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3) {
            if (r->element[0]->type == REDIS_REPLY_STRING)
                sf_parse_i64(r->element[0]->str, 0, INT64_MAX, &running);
            if (r->element[1]->type == REDIS_REPLY_STRING)
                sf_parse_i64(r->element[1]->str, 0, INT64_MAX, &cap);
            if (r->element[2]->type == REDIS_REPLY_STRING)
                sf_parse_i64(r->element[2]->str, 0, INT64_MAX, &ts);
        }
        freeReplyObject(r);
        /* done once a heartbeat after the request says: no capacity (the worker saw the
         * drain) and nothing running; no heartbeat at all: no worker, nothing to wait for */
        if (ts < 0 || (ts > asked && cap == 0 && running == 0)) {
            printf("host %s runs no sandbox\n", host);
            break;
        }
        if (sf_now_ms() > deadline) {
            fprintf(stderr, "sandfleet: host %s still runs %lld sandboxes after %d s; is its "
                    "worker up? ('sandfleet hosts')\n", host, (long long)running,
                    DRAIN_WAIT_MS / 1000);
            ret = 1;
            break;
        }
        usleep(200 * 1000);
    }
out:
    sf_redis_sync_free(rc);
    return ret;
}

/* Prints HOST's key (64 hex characters) from the auth secret; it is never stored. */
static int host_key(const char *host)
{
    uint8_t secret[32], key[32];
    char why[512], hex[65];

    if (!sf_id_valid(host)) {
        fprintf(stderr, MSG_BAD_HOST);
        return 2;
    }
    if (sf_key_file_read(cli_setting("SF_AUTH_SECRET_FILE", CLI_DEFAULT_HOME "/auth.key"), secret,
                         why, sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet: %s Run this where the scheduler's auth secret is "
                "(SF_AUTH_SECRET_FILE).\n", why);
        return 1;
    }
    sf_host_job_key(secret, host, key);
    sodium_bin2hex(hex, sizeof(hex), key, sizeof(key));
    printf("%s\n", hex);
    sodium_memzero(secret, sizeof(secret));
    sodium_memzero(key, sizeof(key));
    sodium_memzero(hex, sizeof(hex));
    return 0;
}

int cli_hosts(int argc, char **argv)
{
    redisContext *rc;
    redisReply *r;
    int64_t now = sf_now_ms();

    if (argc == 3 && !strcmp(argv[1], "key"))
        return host_key(argv[2]);
    if ((argc == 3 || (argc == 4 && !strcmp(argv[3], "--wait"))) && !strcmp(argv[1], "drain"))
        return host_drain(argv[2], argc == 4);
    if (cli_wants_help(argc, argv) || argc != 1) {
        fputs(hosts_usage, argc == 1 ? stdout : stderr);
        return argc == 1 ? 0 : 2;
    }
    if (!(rc = cli_redis()))
        return 1;
    r = sf_redis_sync_cmd(rc, "ZRANGE " SF_RK_HOSTS " 0 -1 WITHSCORES");
    if (!cli_reply_ok(rc, r)) {
        sf_redis_sync_free(rc);
        return 1;
    }
    printf("%-24s %-12s %-8s %-10s %s\n", "HOST", "HEARTBEAT", "DRIVER", "SANDBOXES", "TOPIC");
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        int64_t ts = 0;
        redisReply *h = sf_redis_sync_cmd(rc, "HMGET " SF_RK_HOST " driver running capacity topic",
                                     r->element[i]->str);
        char age[32], load[32];

        sf_parse_i64(r->element[i + 1]->str, 0, INT64_MAX, &ts);
        snprintf(age, sizeof(age), "%.1fs ago", (double)(now - ts) / 1000.0);
        if (!cli_reply_ok(rc, h))
            continue;
        snprintf(load, sizeof(load), "%s/%s", h->element[1]->str ? h->element[1]->str : "?",
                 h->element[2]->str ? h->element[2]->str : "?");
        printf("%-24s %-12s %-8s %-10s %s\n", r->element[i]->str, age,
               h->element[0]->str ? h->element[0]->str : "?", load,
               h->element[3]->str ? h->element[3]->str : "?");
        freeReplyObject(h);
    }
    freeReplyObject(r);
    sf_redis_sync_free(rc);
    return 0;
}

static void sandbox_row(redisReply *h, void *arg)
{
    const char *team = arg;

    if (h->elements == 5 && h->element[0]->str &&
        (!team || (h->element[1]->str && !strcmp(team, h->element[1]->str))))
        printf("%-28s %-16s %-16s %-9s %s\n", h->element[0]->str,
               h->element[1]->str ? h->element[1]->str : "?",
               h->element[2]->str ? h->element[2]->str : "?",
               h->element[3]->str ? h->element[3]->str : "?",
               h->element[4]->str ? h->element[4]->str : "");
}

static int list_sandboxes(redisContext *rc, const char *team)
{
    printf("%-28s %-16s %-16s %-9s %s\n", "ID", "TEAM", "HOST", "STATE", "NAME");
    return cli_scan_hashes(rc, "sf:sb:{*}", "HMGET %s id team host state name", sandbox_row, (void *)team);
}

int cli_sandboxes(int argc, char **argv)
{
    redisContext *rc;
    int ret;

    if (cli_wants_help(argc, argv)) {
        fputs("usage: sandfleet sandboxes [--team TEAM]   every team's sandboxes (admin view)\n",
              stdout);
        return 0;
    }
    if (!(rc = cli_redis()))
        return 1;
    ret = list_sandboxes(rc, cli_opt(argc, argv, "--team"));
    sf_redis_sync_free(rc);
    return ret;
}
