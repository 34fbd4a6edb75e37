/* session.h: MCP sessions (session.c). A session is a cheap record in Redis
 * (SF_RK_SESSION: team, protocol, log level, a tombstone when its client deleted it),
 * shared by every gateway and cached by each instance (ctx->sess_cache).
 *
 * Sessions never strand a client: a session id this team presents that Redis no longer
 * knows (expired, evicted, lost) is recreated on the spot (the tools keep no per-session
 * state); only a session of another team, or one the client deleted (kept as a tombstone
 * for the session lifetime), gets 404. A team over max_sessions_team evicts its least
 * recently used sessions when it opens a new one. */
#ifndef GW_SESSION_H
#define GW_SESSION_H

#include "gateway.h"

/* MCP log levels (RFC 5424 order, as logging/setLevel names them). */
enum { GW_LOG_DEBUG, GW_LOG_INFO, GW_LOG_NOTICE, GW_LOG_WARNING, GW_LOG_ERROR, GW_LOG_CRITICAL,
       GW_LOG_ALERT, GW_LOG_EMERGENCY };
#define GW_LOG_LEVEL_DEFAULT GW_LOG_INFO
int gw_session_level_parse(const char *name); /* -1 when unknown */
const char *gw_session_level_name(int level);

/* An MCP session as this gateway knows it (cached; Redis holds the record). */
typedef struct gw_session {
    char id[SF_ID_MAX];
    char team[SF_ID_MAX];
    char protocol[16];
    int level;             /* notifications/message at or above this level are sent */
    int64_t touched_ms;    /* monotonic: when its TTL and LRU rank were last refreshed */
    unsigned long gen;     /* the deletion generation it was read at */
} gw_session;

/* The cache of one instance: emptied (and made) / freed. */
void gw_session_cache_clear(gw_ctx *ctx);
void gw_session_cache_free(gw_ctx *ctx);
/* The hot path: the cached session sid, or NULL (unknown here, or a session was deleted
 * since it was read: ask Redis). */
gw_session *gw_session_known(gw_ctx *ctx, const char *sid);
/* Refreshes its TTL and LRU rank in Redis, at most every 30 s unless force. */
void gw_session_touch(gw_ctx *ctx, gw_session *s, int force);
/* Drops sid from this instance's cache (announced as deleted or changed). */
void gw_session_forget(gw_ctx *ctx, const char *sid);

/* The record of a session as Redis has it. */
typedef struct gw_session_rec {
    int found, deleted, level;
    char team[SF_ID_MAX];
    char protocol[16];
} gw_session_rec;
/* Reads sid's record: cb(ac, reply, arg) gets the reply for gw_session_parse. 0 or -EIO. */
int gw_session_fetch(gw_ctx *ctx, const char *sid, redisCallbackFn *cb, void *arg);
/* 0 (rec filled; rec->found 0 when there is none), or -EIO (Redis did not answer). */
int gw_session_parse(const redisReply *rep, gw_session_rec *rec);
/* What team's request naming sid gets, from its record: 200 and *out (cached here;
 * recreated when Redis had none, with protocol, or the newest version when NULL), 404
 * (another team's, or deleted), 503 (out of memory). */
int gw_session_resolve(gw_ctx *ctx, const char *sid, const char *team, const gw_session_rec *rec,
                       const char *protocol, gw_session **out);

/* status: 200 and the new session id (the team's least recently used sessions are evicted
 * past max_sessions_team), 503 Redis down, 507 Redis full (at its maxmemory). */
typedef void (*gw_session_cb)(void *arg, int status, const char *sid);
void gw_session_create(gw_ctx *ctx, const char *team, const char *protocol, gw_session_cb cb,
                       void *arg);
/* The client ended it: a tombstone for the session lifetime, announced to every gateway;
 * cb(arg, ok) once it is written, ok as for gw_session_set_level. */
void gw_session_delete(gw_ctx *ctx, const char *team, const char *sid,
                       void (*cb)(void *arg, int ok), void *arg);
/* Keeps the session's log level in Redis; cb(arg, ok) once it is written: ok 1, 0 (Redis
 * unreachable) or -1 (Redis full: the level holds on this gateway only). */
void gw_session_set_level(gw_ctx *ctx, gw_session *s, int level, void (*cb)(void *arg, int ok),
                          void *arg);

#endif
