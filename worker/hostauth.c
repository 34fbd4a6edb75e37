/* hostauth.c: who put a job on this host's topic. The scheduler signs every job it hands a
 * worker (sf-key "scheduler", sf-iat, sf-mac; common/sf_jobauth.h) with this host's own key,
 * HMAC(auth secret, host id): the worker reads it from host_key_file (`sandfleet hosts key
 * HOST` writes it; a worker on a host of its own never holds the auth secret), or derives it
 * from auth_secret_file on a box that has the secret anyway (ops/run's one-box stack). A job
 * that is unsigned, signed with another key or older than SF_HOSTJOB_WINDOW_MS is refused
 * before it touches anything: no guard, no record, no sandbox. */
#include "worker.h"
#include "sf_auth.h"
#include "sf_jobauth.h"
#include "sf_log.h"
#include "sf_util.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wk_hostauth_init(wk_ctx *ctx, char *why, size_t whylen)
{
    uint8_t secret[32];

    if (ctx->cfg.host_key_file[0])
        return sf_key_file_read(ctx->cfg.host_key_file, ctx->host_key, why, whylen) < 0 ? -1 : 0;
    if (!ctx->cfg.auth_secret_file[0]) {
        snprintf(why, whylen, "This worker cannot check the jobs it is given: set host_key_file "
                 "(SF_HOST_KEY_FILE) to the file 'sandfleet hosts key %s' writes.", ctx->host_id);
        return -1;
    }
    if (sf_auth_secret_load(ctx->cfg.auth_secret_file, secret, why, whylen) < 0)
        return -1;
    sf_host_job_key(secret, ctx->host_id, ctx->host_key);
    sodium_memzero(secret, sizeof(secret));
    return 0;
}

int wk_hostauth_check(const wk_ctx *ctx, const sf_job *job, char *text, size_t n)
{
    const sf_job_auth *a = &job->auth;
    int64_t now = sf_now_ms();

    if (a->state == 0) {
        snprintf(text, n, "The job is not signed; only the platform's scheduler hands jobs to a "
                 "host (put tool calls on sf.jobs).");
        return -1;
    }
    if (a->state < 0) {
        snprintf(text, n, "The job's signature cannot be read: %s.", a->why);
        return -1;
    }
    if (strcmp(a->key, SF_JOBAUTH_SCHEDULER) != 0 || sf_jobauth_check(a, ctx->host_key) < 0) {
        snprintf(text, n, "The job's signature is not this host's scheduler's (sf-key '%s'); "
                 "only the scheduler hands jobs to a host. If the scheduler sent it, this "
                 "worker's host key differs: give it host_key_file from 'sandfleet hosts key %s'.",
                 a->key, ctx->host_id);
        return -1;
    }
    if (a->iat < now - SF_HOSTJOB_WINDOW_MS || a->iat > now + SF_JOBAUTH_SKEW_MS) {
        snprintf(text, n, "The job expired: the scheduler signed it %lld s %s and a host takes "
                 "a job for %d s after signing; call again.",
                 (long long)(llabs(now - a->iat) / 1000), a->iat > now ? "ahead" : "ago",
                 SF_HOSTJOB_WINDOW_MS / 1000);
        return -1;
    }
    return 0;
}
