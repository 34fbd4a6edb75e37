/* sf_hosted: the keys of hosted MCP servers (issue 24; schemas/redis-keys.md). The gateway
 * owns them all: the registry (written through its /v1/servers API by `sandfleet servers`),
 * the sessions of /mcp?name=, the crash logs. Each key lives in one slot: the team's, or
 * the session's. */
#ifndef SF_HOSTED_H
#define SF_HOSTED_H

#define SF_RK_SRV "sf:team:{%s}:srv:%s"        /* hash: one registered server */
#define SF_RK_SRVS "sf:team:{%s}:srvs"         /* set: the team's server names */
#define SF_RK_SRV_LOG "sf:team:{%s}:srv:%s:log" /* string: its last crash's log lines */
#define SF_RK_SRV_WARM "sf:team:{%s}:srv:%s:warm" /* list: its warm pool, "GEN SANDBOX" */
#define SF_RK_HSESS "sf:hsess:{%s}"            /* hash, TTL idle: team, name, sandbox */
#define SF_RK_TEAM_HSESS "sf:team:{%s}:hsess:%s" /* zset: a server's session ids -> expiry (ms) */

#define SF_HOSTED_SERVERS_MAX 64               /* servers one team may register */
#define SF_HOSTED_LOG_MAX (64 * 1024)          /* bytes of a crash log kept */
#define SF_HOSTED_MSG_MAX (256 * 1024 - 1)     /* a client's message to a hosted server */
#define SF_HOSTED_IDLE_DEFAULT_S 1800
#define SF_HOSTED_SESSIONS_DEFAULT 16          /* a server's sessions per team at once */

#endif
