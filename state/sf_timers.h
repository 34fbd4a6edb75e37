/* sf_timers: a sandbox's lifecycle timers, kept in Redis so they outlive the daemons that
 * set them (schemas/redis-keys.md). One zset per host, sf:host:{<host>}:timers, whose
 * members are "<kind>:<sandbox id>" scored by when they fire (ms since the epoch):
 *
 *   t:<id>  its lifetime ends (timeout_seconds, or the platform's default lifetime): killed
 *   i:<id>  no call for idle_ms while it runs: paused
 *   d:<id>  paused (stopped) for auto_delete_seconds: killed
 *
 * The record (sf:sb:{<id>}) keeps what sandbox_info shows and what later changes need:
 * `timeout_at`, `lifetime_at` (the default lifetime's end), `idle_ms`,
 * `auto_delete_seconds`, `paused_at`. The host's worker fires the timers (sf_timers_due
 * pops what is due) and changes them (sandbox_update); retiring a record
 * (sf_records) clears them.
 *
 * Library code: no logging. Functions return 0 or -errno (-ENOTCONN: Redis is down, cb not
 * called). */
#ifndef SF_TIMERS_H
#define SF_TIMERS_H

#include "sf_store.h" /* the key layout, the scripts */

#include <jansson.h>

#include <stdint.h>


enum { SF_TIMER_TIMEOUT = 't', SF_TIMER_IDLE = 'i', SF_TIMER_DELETE = 'd' };

/* A sandbox started on host: its timers and their record fields. timeout_at: when it is
 * killed (ms); lifetime_at: the platform default's end (what a timeout reset goes back to);
 * idle_ms: paused after this long without a call (0: never); auto_delete_s: killed this long
 * after a pause (0: never). The reply is 1, or 0 when the record is gone or not live. */
int sf_timers_start(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                    int64_t timeout_at, int64_t lifetime_at, int64_t idle_ms,
                    int64_t auto_delete_s, redisCallbackFn *cb, void *priv);
/* A call used the sandbox: its idle timer starts again (only while it has one). */
int sf_timers_touch(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                    redisCallbackFn *cb, void *priv);
/* Paused: state=paused and paused_at (only from running), the idle timer goes, the
 * auto-delete timer comes (if the record has auto_delete_seconds). Reply 1, or 0. */
int sf_timers_paused(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                     redisCallbackFn *cb, void *priv);
/* Resumed: state=running (only from paused), the auto-delete timer goes, the idle timer
 * comes back. Reply 1, or 0. */
int sf_timers_resumed(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                      redisCallbackFn *cb, void *priv);
/* Pops (atomically: each fires once) at most max timers of host due at now_ms. The reply
 * is an array of members ("t:<id>", ...). */
int sf_timers_due(sf_redis *r, const char *host, int64_t now_ms, int max, redisCallbackFn *cb,
                  void *priv);
/* Puts a popped timer back (a due idle timer whose sandbox was used meanwhile). */
int sf_timers_set(sf_redis *r, const char *host, char kind, const char *id, int64_t at_ms,
                  redisCallbackFn *cb, void *priv);
/* Drops every timer of host (its sandboxes are gone: a restarted worker), blocking. */
int sf_timers_clear_host_sync(redisContext *c, const char *host);

/* sandbox_update of team's sandbox id. Each change is optional: metadata (JSON object text,
 * replaces the old; NULL: unchanged); timeout: SF_TIMERS_KEEP, SF_TIMERS_RESET (back to the
 * default lifetime) or seconds from now; auto_delete: SF_TIMERS_KEEP, or seconds (0: none).
 * The reply is {verdict, state}: verdict "ok", "none" (no such sandbox of the team) or "dead"
 * (killed, failed, lost, or being killed). */
#define SF_TIMERS_KEEP (-1)
#define SF_TIMERS_RESET (-2)
int sf_timers_update(sf_redis *r, const char *id, const char *team, int64_t now_ms,
                     const char *metadata, int64_t timeout_s, int64_t auto_delete_s,
                     redisCallbackFn *cb, void *priv);

/* What sandbox_info and sandbox_update show of a record's lifecycle (rec: the record as a
 * JSON object of strings, sf:sb:{<id>}'s fields). While it runs or is paused, view gets
 * "timers" (timeout_at; idle_pause_at while it runs; auto_delete_at while paused, as ISO
 * 8601 UTC), "paused_at" while paused, "auto_delete_seconds" when set. */
void sf_timers_view(const json_t *rec, json_t *view);

#endif
