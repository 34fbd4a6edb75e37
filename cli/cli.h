/* cli.h: what the sandfleet CLI's command modules share.
 * Each command is a function `int cli_NAME(int argc, char **argv)` (argv[0] is the
 * command's own name) returning the process exit status: 0 ok, 1 failed, 2 bad usage.
 * main.c holds the dispatch table; one module per command group. */
#ifndef SF_CLI_H
#define SF_CLI_H

#include <hiredis/hiredis.h>
#include <stddef.h>

/* Commands (one module each). */
int cli_keys(int argc, char **argv);       /* keys.c */
int cli_hosts(int argc, char **argv);      /* hosts.c */
int cli_sandboxes(int argc, char **argv);  /* hosts.c */
int cli_mcp_stdio(int argc, char **argv);  /* stdio.c */
int cli_connect(int argc, char **argv);    /* connect.c */
int cli_teams(int argc, char **argv);      /* teams.c */
int cli_tokens(int argc, char **argv);     /* tokens.c */
int cli_templates(int argc, char **argv);  /* templates.c */
int cli_batch(int argc, char **argv);      /* batch.c */
int cli_servers(int argc, char **argv);    /* servers.c */

/* argv[0] of the program (main.c sets it). */
extern const char *cli_program;

/* A setting: the environment variable `name` if set and not empty, else the same name
 * in the env file that ops/run writes ($SF_HOME/env, SF_HOME default /var/lib/sandfleet),
 * else def. The returned string lives until exit. */
const char *cli_setting(const char *name, const char *def);
/* Where cli_setting finds name: "the environment variable NAME" or "PATH (NAME in the file
 * ops/run writes)", written into buf; NULL when it is found nowhere (the default). */
const char *cli_setting_where(const char *name, char *buf, size_t n);
/* The env file's path (*found: 1 when it could be read). */
const char *cli_env_file(int *found);
/* The value after `name` in argv (e.g. "--team"), or NULL. */
const char *cli_opt(int argc, char **argv, const char *name);
/* True when `name` appears in argv. */
int cli_flag(int argc, char **argv, const char *name);
/* True when argv asks for help (-h or --help). */
int cli_wants_help(int argc, char **argv);

/* The admin commands' Redis (SF_REDIS_URL); NULL after printing why. */
redisContext *cli_redis(void);
/* 1 for a usable reply; else prints the error, frees r and returns 0. */
int cli_reply_ok(redisContext *rc, redisReply *r);
/* Calls row(fields, arg) for every key matching `match` (SCAN), with `fields` the reply to
 * the command `hmget` (e.g. "HMGET %s id team": %s is the key; one element per field, nil
 * when absent). Returns 0, or 1 after printing the Redis error. */
typedef void (*cli_scan_row)(redisReply *fields, void *arg);
int cli_scan_hashes(redisContext *rc, const char *match, const char *hmget, cli_scan_row row,
                    void *arg);

#define CLI_DEFAULT_HOME "/var/lib/sandfleet"
#define CLI_DEFAULT_REDIS "redis://127.0.0.1:6379"
#define CLI_DEFAULT_URL "http://127.0.0.1:8080/mcp"

#endif
