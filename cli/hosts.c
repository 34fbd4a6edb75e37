/* hosts.c: the admin views `sandfleet hosts` (worker hosts: heartbeat age, driver, load)
 * and `sandfleet sandboxes` (every team's sandboxes, with host and state). */
#include "cli.h"
#include "sf_redis.h"
#include "sf_util.h"

#include <stdio.h>
#include <string.h>

int cli_hosts(int argc, char **argv)
{
    redisContext *rc;
    redisReply *r;
    int64_t now = sf_now_ms();

    if (cli_wants_help(argc, argv) || argc != 1) {
        fputs("usage: sandfleet hosts   worker hosts: heartbeat age, driver, sandboxes/capacity\n",
              argc == 1 ? stdout : stderr);
        return argc == 1 ? 0 : 2;
    }
    if (!(rc = cli_redis()))
        return 1;
    r = redisCommand(rc, "ZRANGE " SF_RK_HOSTS " 0 -1 WITHSCORES");
    if (!cli_reply_ok(rc, r)) {
        redisFree(rc);
        return 1;
    }
    printf("%-24s %-12s %-8s %-10s %s\n", "HOST", "HEARTBEAT", "DRIVER", "SANDBOXES", "TOPIC");
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        int64_t ts = 0;
        redisReply *h = redisCommand(rc, "HMGET " SF_RK_HOST " driver running capacity topic",
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
    redisFree(rc);
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
    redisFree(rc);
    return ret;
}
