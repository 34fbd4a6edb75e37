/* sandfleet teams show|limits: a team's own limits (the operator's overrides of the
 * scheduler's team_sandbox_limit, team_host_share_pct and team_fleet_share_pct, in
 * sf:team:{T}:limits) and what placement holds reserved for it now (sf:team:{T}:res). */
#include "cli.h"
#include "sf_redis.h"
#include "sf_store.h"
#include "sf_util.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: sandfleet teams show TEAM\n"
    "       sandfleet teams limits TEAM [--sandboxes N] [--host-share PCT] [--fleet-share PCT]\n"
    "                                   [--hosted-test-mode on|off]\n"
    "limits sets the team's own values; 'default' as a value goes back to the scheduler's\n"
    "setting (team_sandbox_limit, team_host_share_pct, team_fleet_share_pct).\n"
    "--hosted-test-mode on lets the team run unregistered MCP servers from a repository\n"
    "(POST /mcp?name=NAME&test_mode=true&repo_url=URL&entrypoint=FILE); off by default.\n"
    "settings: SF_REDIS_URL (see sandfleet --help)\n";

static const struct {
    const char *opt, *field;
    int64_t min, max;
} limits[] = {
    {"--sandboxes", "sandboxes", 1, 1000000},
    {"--host-share", "host_share_pct", 1, 100},
    {"--fleet-share", "fleet_share_pct", 1, 100},
};

static const char *str_or(const redisReply *r, const char *def)
{
    return r && r->type == REDIS_REPLY_STRING ? r->str : def;
}

static int show(redisContext *rc, const char *team)
{
    redisReply *l, *res;
    int64_t n = 0, mem = 0, vcpu = 0;

    l = sf_redis_sync_cmd(rc, "HMGET " SF_RK_TEAM_LIMITS " sandboxes host_share_pct fleet_share_pct",
                     team);
    if (!cli_reply_ok(rc, l))
        return 1;
    printf("team %s\nlimits: sandboxes=%s host_share_pct=%s fleet_share_pct=%s\n", team,
           str_or(l->element[0], "default"), str_or(l->element[1], "default"),
           str_or(l->element[2], "default"));
    freeReplyObject(l);
    res = sf_redis_sync_cmd(rc, "HGETALL " SF_RK_TEAM_RES, team);
    if (!cli_reply_ok(rc, res))
        return 1;
    /* sandbox id -> "<host> <mem MiB> <vCPU milli> <disk>" */
    for (size_t i = 0; i + 1 < res->elements; i += 2) {
        char host[SF_ID_MAX];
        long long m, c;
        if (sscanf(res->element[i + 1]->str, "%63s %lld %lld", host, &m, &c) != 3)
            continue;
        n++, mem += m, vcpu += c;
    }
    printf("holds: %lld sandboxes, %lld MiB, %.1f vCPUs\n", (long long)n, (long long)mem,
           (double)vcpu / 1000.0);
    for (size_t i = 0; i + 1 < res->elements; i += 2) { /* per host, in first-seen order */
        char host[SF_ID_MAX], other[SF_ID_MAX];
        long long m, c, on = 0;
        int seen = 0;
        if (sscanf(res->element[i + 1]->str, "%63s %lld %lld", host, &m, &c) != 3)
            continue;
        for (size_t j = 0; j + 1 < res->elements; j += 2)
            if (sscanf(res->element[j + 1]->str, "%63s", other) == 1 && !strcmp(other, host)) {
                seen |= j < i;
                on++;
            }
        if (!seen)
            printf("  on %s: %lld sandboxes\n", host, on);
    }
    freeReplyObject(res);
    l = sf_redis_sync_cmd(rc, "HGET " SF_RK_TEAM_LIMITS " hosted_test_mode", team);
    if (!cli_reply_ok(rc, l))
        return 1;
    printf("hosted_test_mode: %s\n", l->type == REDIS_REPLY_STRING && !strcmp(l->str, "on")
                                          ? "on" : "off");
    freeReplyObject(l);
    return 0;
}

/* With rc NULL only checks the options: 0, or 2 (usage, printed). */
static int set_limits(redisContext *rc, const char *team, int argc, char **argv)
{
    for (int i = 0; i < argc; i += 2) {
        size_t k = 0;
        int64_t v;
        redisReply *r;

        if (!strcmp(argv[i], "--hosted-test-mode")) {
            if (i + 1 >= argc || (strcmp(argv[i + 1], "on") && strcmp(argv[i + 1], "off") &&
                                  strcmp(argv[i + 1], "default"))) {
                fprintf(stderr, "sandfleet: --hosted-test-mode takes on or off.\n");
                return 2;
            }
            if (!rc)
                continue;
            r = !strcmp(argv[i + 1], "on")
                    ? sf_redis_sync_cmd(rc, "HSET " SF_RK_TEAM_LIMITS " hosted_test_mode on", team)
                    : sf_redis_sync_cmd(rc, "HDEL " SF_RK_TEAM_LIMITS " hosted_test_mode", team);
            if (!cli_reply_ok(rc, r))
                return 1;
            freeReplyObject(r);
            continue;
        }
        while (k < SF_ARRAY_LEN(limits) && strcmp(argv[i], limits[k].opt) != 0)
            k++;
        if (k == SF_ARRAY_LEN(limits) || i + 1 >= argc) {
            fprintf(stderr, "sandfleet: unknown or incomplete option '%s'.\n%s", argv[i], usage);
            return 2;
        }
        if (strcmp(argv[i + 1], "default") != 0 &&
            sf_parse_i64(argv[i + 1], limits[k].min, limits[k].max, &v) < 0) {
            fprintf(stderr, "sandfleet: %s must be a whole number from %lld to %lld, or "
                            "'default'.\n", limits[k].opt, (long long)limits[k].min,
                    (long long)limits[k].max);
            return 2;
        }
        if (!rc)
            continue;
        if (!strcmp(argv[i + 1], "default")) {
            r = sf_redis_sync_cmd(rc, "HDEL " SF_RK_TEAM_LIMITS " %s", team, limits[k].field);
        } else {
            r = sf_redis_sync_cmd(rc, "HSET " SF_RK_TEAM_LIMITS " %s %lld", team, limits[k].field,
                             (long long)v);
        }
        if (!cli_reply_ok(rc, r))
            return 1;
        freeReplyObject(r);
    }
    return rc ? show(rc, team) : 0;
}

int cli_teams(int argc, char **argv)
{
    redisContext *rc;
    int ret;

    if (cli_wants_help(argc, argv) || argc < 3 ||
        (strcmp(argv[1], "show") != 0 && strcmp(argv[1], "limits") != 0)) {
        int help = cli_wants_help(argc, argv);
        fputs(usage, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    if (!sf_id_valid(argv[2])) {
        fprintf(stderr, "sandfleet: team names are [a-z0-9_-]{1,63}.\n");
        return 2;
    }
    if (!strcmp(argv[1], "limits") && (ret = set_limits(NULL, argv[2], argc - 3, argv + 3)))
        return ret;
    if (!(rc = cli_redis()))
        return 1;
    ret = !strcmp(argv[1], "show") ? show(rc, argv[2]) : set_limits(rc, argv[2], argc - 3, argv + 3);
    sf_redis_sync_free(rc);
    return ret;
}
