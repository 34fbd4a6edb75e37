/* templates.c: `sandfleet templates build|list|delete|logs`. build, list and delete act as
 * the team of $SANDFLEET_API_KEY through the gateway (MCP over HTTP: initialize, then
 * tools/call sandbox_template_create / _list / _delete), so they get the same checks as any
 * client; build then polls the list and draws a progress bar on stderr until the template
 * is ready or failed. logs is an operator view: the build log kept in Redis. */
#include "cli.h"
#include "gwcall.h"
#include "sf_redis.h"
#include "sf_templates.h"
#include "sf_util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int parse_int(const char *s, const char *what, json_t *args)
{
    int64_t v;
    if (!s)
        return 0;
    if (sf_parse_i64(s, 1, 1 << 20, &v) < 0) {
        fprintf(stderr, "%s must be a positive number.\n", what);
        return -1;
    }
    json_object_set_new(args, what + 2, json_integer(v));
    return 0;
}

static int build(int argc, char **argv)
{
    const char *name = argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
    const char *from = cli_opt(argc, argv, "--from");
    json_t *args, *steps = json_array(), *res = NULL;
    int ret = 1;
    cli_gw m;

    if (!name || !from) {
        fputs("usage: sandfleet templates build NAME --from TEMPLATE [--step CMD]... [--vcpu N]\n"
              "         [--memory_mib N] [--disk_mib N] [--start-cmd CMD] [--ready-cmd CMD] [--no-wait]\n",
              stderr);
        json_decref(steps);
        return 2;
    }
    for (int i = 3; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--step"))
            json_array_append_new(steps, json_string(argv[++i]));
    args = json_pack("{s:s, s:s, s:o}", "name", name, "from", from, "run_steps", steps);
    if (cli_opt(argc, argv, "--start-cmd"))
        json_object_set_new(args, "start_cmd", json_string(cli_opt(argc, argv, "--start-cmd")));
    if (cli_opt(argc, argv, "--ready-cmd"))
        json_object_set_new(args, "ready_cmd", json_string(cli_opt(argc, argv, "--ready-cmd")));
    if (parse_int(cli_opt(argc, argv, "--vcpu"), "--vcpu", args) < 0 ||
        parse_int(cli_opt(argc, argv, "--memory_mib"), "--memory_mib", args) < 0 ||
        parse_int(cli_opt(argc, argv, "--disk_mib"), "--disk_mib", args) < 0) {
        json_decref(args);
        return 2;
    }
    if (cli_gw_open(&m, 1) || cli_gw_call(&m, "sandbox_template_create", args, &res, 0))
        goto out;
    json_decref(res);
    res = NULL;
    fprintf(stderr, "building template '%s' from '%s'\n", name, from);
    if (cli_flag(argc, argv, "--no-wait")) {
        ret = 0;
        goto out;
    }
    if (cli_gw_template_wait(&m, name, 1) == 0) {
        printf("%s ready\n", name);
        ret = 0;
    }
out:
    json_decref(res);
    cli_gw_close(&m);
    return ret;
}

static int list(int argc, char **argv)
{
    const char *prefix = cli_opt(argc, argv, "--prefix");
    json_t *res = NULL, *t;
    size_t i;
    cli_gw m;
    int ret = 1;

    if (cli_gw_open(&m, 1) ||
        cli_gw_call(&m, "sandbox_template_list",
                  prefix ? json_pack("{s:s}", "name_prefix", prefix) : json_object(), &res, 0))
        goto out;
    printf("%-24s %-9s %-12s %-5s %-7s %-7s %s\n", "NAME", "STATUS", "FROM", "VCPU", "MEM_MIB",
           "DISK", "ERROR");
    json_array_foreach(json_object_get(res, "templates"), i, t)
        printf("%-24s %-9s %-12s %-5lld %-7lld %-7lld %.100s\n",
               json_string_value(json_object_get(t, "name")) ?: "",
               json_string_value(json_object_get(t, "status")) ?: "",
               json_string_value(json_object_get(t, "from")) ?: "-",
               (long long)json_integer_value(json_object_get(t, "vcpu")),
               (long long)json_integer_value(json_object_get(t, "memory_mib")),
               (long long)json_integer_value(json_object_get(t, "disk_mib")),
               json_string_value(json_object_get(t, "error")) ?: "");
    ret = 0;
out:
    json_decref(res);
    cli_gw_close(&m);
    return ret;
}

static int delete(int argc, char **argv)
{
    const char *name = argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
    json_t *res = NULL;
    cli_gw m;
    int ret = 1;

    if (!name) {
        fputs("usage: sandfleet templates delete NAME   delete one of your team's templates\n",
              stderr);
        return 2;
    }
    if (cli_gw_open(&m, 1) ||
        cli_gw_call(&m, "sandbox_template_delete", json_pack("{s:s}", "name", name), &res, 0))
        goto out;
    printf("%s deleted\n", name);
    ret = 0;
out:
    json_decref(res);
    cli_gw_close(&m);
    return ret;
}

static int logs(int argc, char **argv)
{
    const char *team = cli_opt(argc, argv, "--team");
    const char *name = argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
    redisContext *rc;
    redisReply *r;
    char key[256];

    if (!team || !name) {
        fputs("usage: sandfleet templates logs NAME --team TEAM   the build log (operator)\n",
              stderr);
        return 2;
    }
    if (!(rc = cli_redis()))
        return 1;
    snprintf(key, sizeof(key), SF_RK_TEMPLATE_LOG, team, name);
    r = sf_redis_sync_cmd(rc, "GET %s", key);
    if (!cli_reply_ok(rc, r)) {
        sf_redis_sync_free(rc);
        return 1;
    }
    if (r->type != REDIS_REPLY_STRING) {
        fprintf(stderr, "Team '%s' has no build log for template '%s' (check the names with "
                "sandfleet templates list).\n", team, name);
        freeReplyObject(r);
        sf_redis_sync_free(rc);
        return 1;
    }
    fwrite(r->str, 1, r->len, stdout);
    freeReplyObject(r);
    sf_redis_sync_free(rc);
    return 0;
}

int cli_templates(int argc, char **argv)
{
    if (argc < 2 || cli_wants_help(argc, argv)) {
        fputs("usage: sandfleet templates build NAME --from TEMPLATE [--step CMD]... [--vcpu N]\n"
              "           [--memory_mib N] [--disk_mib N] [--start-cmd CMD] [--ready-cmd CMD]\n"
              "           [--no-wait]     build a team template (progress until ready or failed)\n"
              "       sandfleet templates list [--prefix P]   the team's templates and the built-ins\n"
              "       sandfleet templates delete NAME   delete one of the team's templates\n"
              "       sandfleet templates logs NAME --team TEAM   a build's log (operator)\n"
              "build, list and delete act as the team of $SANDFLEET_API_KEY through the gateway\n"
              "($SANDFLEET_URL, else SF_URL); logs reads Redis (SF_REDIS_URL).\n",
              argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "build"))
        return build(argc, argv);
    if (!strcmp(argv[1], "list"))
        return list(argc, argv);
    if (!strcmp(argv[1], "logs"))
        return logs(argc, argv);
    if (!strcmp(argv[1], "delete"))
        return delete(argc, argv);
    fprintf(stderr, "Unknown templates command '%s'; use build, list, delete or logs.\n", argv[1]);
    return 2;
}
