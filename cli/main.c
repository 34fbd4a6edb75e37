/* sandfleet: the command-line tool. main() only dispatches: one module per command
 * group (keys.c, hosts.c, ...), each `int cli_NAME(int argc, char **argv)`. */
#include "cli.h"
#include "secrets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} cli_cmd;

static const cli_cmd commands[] = {
    {"keys", cli_keys, "keys create --team TEAM | list [--team TEAM] | revoke KEY_ID"},
    {"hosts", cli_hosts, "hosts [key HOST|drain HOST]  worker hosts: heartbeat, driver, load; a host's key; drain"},
    {"sandboxes", cli_sandboxes, "sandboxes [--team TEAM]      every team's sandboxes (admin)"},
    {"secrets", cli_secrets, "secrets create|rotate|list|delete ...   team secrets (cli/secrets.c)"},
    {"teams", cli_teams, "teams show|limits TEAM ...   a team's own limits, what it holds now"},
    {"templates", cli_templates, "templates build|list|delete|logs ...  team templates (build: progress until ready)"},
    {"servers", cli_servers, "servers add|list|show|remove|logs ...  the team's hosted MCP servers"},
    {"tokens", cli_tokens, "tokens list [--team TEAM] | revoke GRANT_ID   OAuth sign-ins"},
    {"batch", cli_batch, "batch run JOBS.jsonl --out RESULTS.jsonl   tool calls through the job queue"},
    {"mcp-stdio", cli_mcp_stdio, "mcp-stdio [URL]              stdio MCP server forwarding to the gateway"},
    {"connect", cli_connect, "connect CLIENT [--write]     configure an MCP client (claude-code, claude-desktop,\n"
                             "                                         cursor, vscode, windsurf, codex)"},
};

static void usage(FILE *f)
{
    fputs("usage: sandfleet COMMAND [ARGS]   (sandfleet COMMAND --help for details)\n", f);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  sandfleet %s\n", commands[i].summary);
    fputs("settings: SF_REDIS_URL, SF_AUTH_SECRET_FILE, SF_URL (secrets: SF_SECRETS_KEY_FILE)\n"
          "          from the environment, else from\n"
          "          $SF_HOME/env (written by ops/run; SF_HOME default " CLI_DEFAULT_HOME ")\n",
          f);
}

const char *cli_program;

/* Settings the stack's env file provides (ops/run writes $SF_HOME/env) become environment
 * variables when unset, so every command module (cli_setting or getenv) sees them. */
static void settings_from_env_file(void)
{
    static const char *const names[] = {"SF_REDIS_URL", "SF_AUTH_SECRET_FILE", "SF_URL",
                                        "SF_SECRETS_KEY_FILE", "SF_PROXY_CONTROL_SOCKET",
                                        "SF_KAFKA_BROKERS"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *v = cli_setting(names[i], NULL);
        if (v && !getenv(names[i]))
            setenv(names[i], v, 0);
    }
}

int main(int argc, char **argv)
{
    cli_program = argv[0];
    settings_from_env_file();
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
                      !strcmp(argv[1], "help"))) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; argc >= 2 && i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    if (argc >= 2)
        fprintf(stderr, "sandfleet: unknown command '%s'.\n", argv[1]);
    usage(stderr);
    return 2;
}
