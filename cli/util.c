/* util.c: settings, argument helpers and the admin commands' Redis connection. */
#include "cli.h"
#include "sf_redis.h"
#include "sf_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENV_FILE_MAX 65536

static char env_file[ENV_FILE_MAX + 1];
static char env_path[4096];         /* the env file's path ("" until loaded) */
static int env_found;               /* ...and whether it could be read */
static const char *env_lines[256]; /* "NAME=value", cut at their newlines */
static size_t env_count;
static int env_loaded;

/* Loads $SF_HOME/env once: NAME=value lines (what ops/run writes). */
static void env_load(void)
{
    const char *home = getenv("SF_HOME");
    size_t n;
    FILE *f;

    env_loaded = 1;
    snprintf(env_path, sizeof(env_path), "%s/env", home && *home ? home : CLI_DEFAULT_HOME);
    if (!(f = fopen(env_path, "re")))
        return;
    env_found = 1;
    n = fread(env_file, 1, ENV_FILE_MAX, f);
    fclose(f);
    env_file[n] = '\0';
    for (char *line = env_file; line && *line && env_count < SF_ARRAY_LEN(env_lines);) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        env_lines[env_count++] = line;
        line = nl ? nl + 1 : NULL;
    }
}

const char *cli_setting(const char *name, const char *def)
{
    const char *v = getenv(name);
    size_t nlen = strlen(name);

    if (v && *v)
        return v;
    if (!env_loaded)
        env_load();
    for (size_t i = 0; i < env_count; i++)
        if (!strncmp(env_lines[i], name, nlen) && env_lines[i][nlen] == '=' &&
            env_lines[i][nlen + 1])
            return env_lines[i] + nlen + 1;
    return def;
}

const char *cli_setting_where(const char *name, char *buf, size_t n)
{
    const char *v = getenv(name);
    size_t nlen = strlen(name);

    if (!env_loaded)
        env_load();
    /* main() copies the file's settings into the environment: the same value is the file's */
    for (size_t i = 0; i < env_count; i++)
        if (!strncmp(env_lines[i], name, nlen) && env_lines[i][nlen] == '=' &&
            env_lines[i][nlen + 1] && (!v || !*v || !strcmp(v, env_lines[i] + nlen + 1))) {
            snprintf(buf, n, "%s (%s in the file ops/run writes)", env_path, name);
            return buf;
        }
    if (v && *v) {
        snprintf(buf, n, "the environment variable %s", name);
        return buf;
    }
    return NULL;
}

const char *cli_env_file(int *found)
{
    if (!env_loaded)
        env_load();
    *found = env_found;
    return env_path;
}

const char *cli_opt(int argc, char **argv, const char *name)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return argv[i + 1];
    return NULL;
}

int cli_flag(int argc, char **argv, const char *name)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name))
            return 1;
    return 0;
}

int cli_wants_help(int argc, char **argv)
{
    return cli_flag(argc, argv, "--help") || cli_flag(argc, argv, "-h");
}

redisContext *cli_redis(void)
{
    char why[512];
    redisContext *rc = sf_redis_connect_sync(cli_setting("SF_REDIS_URL", CLI_DEFAULT_REDIS), why,
                                              sizeof(why));
    if (!rc)
        fprintf(stderr, "sandfleet: %s Is the stack running (ops/run)? Otherwise set SF_REDIS_URL, "
                        "or SF_HOME to the state folder whose env file names it.\n", why);
    return rc;
}

int cli_reply_ok(redisContext *rc, redisReply *r)
{
    if (!r) {
        fprintf(stderr, "sandfleet: Redis: %s\n", rc->errstr);
        return 0;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "sandfleet: Redis: %s\n", r->str);
        freeReplyObject(r);
        return 0;
    }
    return 1;
}

/* SCAN answers for one node's keys: on a cluster, each master is scanned in turn. */
int cli_scan_hashes(redisContext *rc, const char *match, const char *hmget, cli_scan_row row,
                    void *arg)
{
    redisContext *nodes[64];
    int n = sf_redis_sync_masters(rc, nodes, 64);

    if (n < 0) {
        fprintf(stderr, "sandfleet: cannot reach every Redis Cluster master; retry once the "
                        "cluster is whole again.\n");
        return 1;
    }
    for (int k = 0; k < n; k++) {
        unsigned long long cursor = 0;
        do {
            redisReply *r = redisCommand(nodes[k], "SCAN %llu MATCH %s COUNT 500", cursor, match);
            if (!cli_reply_ok(nodes[k], r))
                return 1;
            if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
                freeReplyObject(r);
                return 1;
            }
            cursor = strtoull(r->element[0]->str, NULL, 10);
            for (size_t i = 0; i < r->element[1]->elements; i++) {
                redisReply *h = sf_redis_sync_cmd(rc, hmget, r->element[1]->element[i]->str);
                if (!cli_reply_ok(rc, h))
                    continue;
                if (h->type == REDIS_REPLY_ARRAY)
                    row(h, arg);
                freeReplyObject(h);
            }
            freeReplyObject(r);
        } while (cursor != 0);
    }
    return 0;
}
