/* tokens.c: `sandfleet tokens list|revoke` — the OAuth grants (one per sign-in of an
 * application), each holding one access and one refresh token (gateway/oauth.c). */
#include "cli.h"
#include "sf_oauth.h"
#include "sf_redis.h"
#include "sf_store.h"
#include "sf_util.h"
#include "sf_msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: sandfleet tokens list [--team TEAM]   OAuth grants: applications signed in\n"
    "       sandfleet tokens revoke GRANT_ID      ends one: its tokens stop working at once\n"
    "Revoking the API key a grant was signed in with (sandfleet keys revoke) ends it too.\n";

typedef struct {
    const char *team;
    int64_t now;
} list_ctx;

static void grant_row(redisReply *g, void *arg)
{
    const list_ctx *lc = arg;
    int64_t used = 0;
    char age[32];

    if (g->elements != 4 || !g->element[0]->str || !g->element[1]->str ||
        (lc->team && strcmp(lc->team, g->element[1]->str)))
        return;
    sf_parse_i64(g->element[3]->str ? g->element[3]->str : "0", 0, INT64_MAX, &used);
    snprintf(age, sizeof(age), "%llds ago", (long long)((lc->now - used) / 1000));
    printf("%-28s %-16s %-13s %s\n", g->element[0]->str, g->element[1]->str, used ? age : "?",
           g->element[2]->str ? g->element[2]->str : "");
}

static int list(redisContext *rc, const char *team)
{
    list_ctx lc = {.team = team, .now = sf_now_ms()};

    printf("%-28s %-16s %-13s %s\n", "GRANT", "TEAM", "LAST_USED", "APPLICATION");
    return cli_scan_hashes(rc, "sf:oauth:grant:{*}", "HMGET %s id team client_name used",
                           grant_row, &lc);
}

static int revoke(redisContext *rc, const char *grant)
{
    redisReply *r;

    if (!sf_id_valid(grant)) {
        fprintf(stderr, SF_MSG_CLI_NO_GRANT_FMT, grant);
        return 1;
    }
    r = sf_redis_sync_cmd(rc, "HMGET " SF_RK_OAUTH_GRANT " at rt", grant);
    if (!cli_reply_ok(rc, r))
        return 1;
    if (r->elements != 2 || !r->element[0]->str) {
        fprintf(stderr, SF_MSG_CLI_NO_GRANT_FMT, grant);
        freeReplyObject(r);
        return 1;
    }
    freeReplyObject(sf_redis_sync_cmd(rc, "DEL " SF_RK_OAUTH_AT, r->element[0]->str));
    if (r->element[1]->str)
        freeReplyObject(sf_redis_sync_cmd(rc, "DEL " SF_RK_OAUTH_RT, r->element[1]->str));
    freeReplyObject(sf_redis_sync_cmd(rc, "PUBLISH " SF_CH_GATEWAY " key:%s", r->element[0]->str));
    freeReplyObject(r);
    r = sf_redis_sync_cmd(rc, "DEL " SF_RK_OAUTH_GRANT, grant);
    if (!cli_reply_ok(rc, r))
        return 1;
    freeReplyObject(r);
    printf("revoked %s\n", grant);
    return 0;
}

int cli_tokens(int argc, char **argv)
{
    const char *sub = argc >= 2 ? argv[1] : "";
    redisContext *rc;
    int ret;

    if (cli_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(sub, "list") && (strcmp(sub, "revoke") || argc != 3)) {
        fputs(usage, stderr);
        return 2;
    }
    if (!(rc = cli_redis()))
        return 1;
    ret = !strcmp(sub, "list") ? list(rc, cli_opt(argc, argv, "--team")) : revoke(rc, argv[2]);
    sf_redis_sync_free(rc);
    return ret;
}
