/* snapshot.c: sandbox_snapshot on this host, and what a snapshot's files need here.
 *
 * A snapshot's files live under state_dir/snapshots/<id>/: `owner` (its team and name)
 * and `files/`, which the driver's `snapshot` fills (driver.h) and a create's `snapshot`
 * starts from. Its record is in Redis (state/sf_snapshots.h): reserved `taking` within
 * the team's limits (snapshots_per_team, snapshot_team_mib) before the driver runs,
 * `ready` with its size after (or dropped, with the files, when it failed or would pass
 * the team's bytes). Redis is the state of record: every snapshot_sweep_ms (and at start-up, when
 * a record still `taking` is stale: its worker died) the worker removes the files whose
 * record is gone (sandbox_snapshot_delete in the scheduler drops only the record), except
 * those a create or a snapshot here is using. */
#include "worker.h"
#include "snapfs.h"
#include "fs.h"
#include "sf_log.h"
#include "sf_snapshots.h"
#include "sf_msg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SNAP_DIR "snapshots"

static struct {
    sf_map *busy;        /* snapshot id -> (users), while taken or used by a create */
    sf_map *mib;         /* snapshot id -> (MiB of disk it holds here), until its files go */
    struct event *ev_sweep;
    int swept;           /* a sweep ran (the first one drops stale `taking` records) */
    wk_ctx *ctx;
} S;

static void busy_add(const char *id, int d)
{
    intptr_t n = S.busy ? (intptr_t)sf_map_get(S.busy, id) : 0;

    if (!S.busy)
        return;
    n += d;
    sf_map_del(S.busy, id);
    if (n > 0 && sf_map_put(S.busy, id, (void *)n) < 0)
        sf_warn("msg=\"snapshot use not tracked (out of memory)\" snapshot=%s", id);
}

/* The disk a snapshot's files hold here counts in the host's (create.c no_room, the
 * heartbeat's disk_used_mib) from when it is ready until its files are removed. */
static void disk_add(wk_ctx *ctx, const char *id, uint64_t bytes)
{
    uint64_t mib = (bytes + (1 << 20) - 1) >> 20;

    if (!S.mib || sf_map_get(S.mib, id) || mib == 0)
        return;
    if (sf_map_put(S.mib, id, (void *)(uintptr_t)mib) < 0) {
        sf_warn("msg=\"snapshot disk not counted (out of memory)\" snapshot=%s", id);
        return;
    }
    ctx->snap_disk_mib += mib;
}

static void disk_release(wk_ctx *ctx, const char *id)
{
    uint64_t mib = S.mib ? (uint64_t)(uintptr_t)sf_map_get(S.mib, id) : 0;

    if (!mib)
        return;
    sf_map_del(S.mib, id);
    ctx->snap_disk_mib -= mib < ctx->snap_disk_mib ? mib : ctx->snap_disk_mib;
}

static int snap_path(const wk_ctx *ctx, char *buf, size_t n, const char *id, const char *leaf)
{
    int r = snprintf(buf, n, "%s/" SNAP_DIR "%s%s%s%s", ctx->cfg.state_dir, id ? "/" : "",
                     id ? id : "", leaf ? "/" : "", leaf ? leaf : "");
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

/* ---- removal of a snapshot's files (on the pool) ------------------------------------ */

typedef struct rm_job {
    char id[SF_ID_MAX];
    char path[4200];
} rm_job;

static void rm_work(void *arg)
{
    rm_job *j = arg;
    int rc = wk_rmtree(j->path);

    if (rc < 0 && rc != -ENOENT)
        sf_warn("msg=\"cannot remove a snapshot's files\" dir=%s rc=%d", j->path, rc);
}

static void rm_done(void *arg)
{
    rm_job *j = arg;

    disk_release(S.ctx, j->id);
    busy_add(j->id, -1);
    free(j);
}

static void snap_remove(wk_ctx *ctx, const char *id)
{
    rm_job *j = calloc(1, sizeof(*j));

    if (!j || snap_path(ctx, j->path, sizeof(j->path), id, NULL) < 0) {
        free(j);
        return;
    }
    snprintf(j->id, sizeof(j->id), "%s", id);
    busy_add(id, 1); /* not swept twice */
    if (wk_pool_run(ctx->pool, rm_work, rm_done, j) < 0) {
        rm_work(j);
        rm_done(j);
    }
}

/* ---- sandbox_snapshot -------------------------------------------------------------- */

typedef struct snap_call {
    wk_call *c;
    char id[SF_ID_MAX];
    char name[64];
    uint64_t bytes;
} snap_call;

static void snap_fail(snap_call *s, const char *code, const char *text, int drop)
{
    wk_ctx *ctx = s->c->ctx;

    if (drop && sf_snap_drop(ctx->redis, s->c->job.team, s->name, s->id, wk_redis_logged,
                             NULL) < 0)
        sf_warn("msg=\"cannot drop a failed snapshot's record; Redis is down\" snapshot=%s",
                s->id);
    snap_remove(ctx, s->id);
    busy_add(s->id, -1);
    wk_reply_error(s->c, code, text);
    free(s);
}

static void on_finished(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    snap_call *s = priv;
    wk_ctx *ctx = s->c->ctx;
    const char *v = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
                            rep->element[0]->type == REDIS_REPLY_STRING
                        ? rep->element[0]->str
                        : "";
    char text[320];

    (void)ac;
    if (!strcmp(v, "ok")) {
        sf_info("msg=\"snapshot ready\" sandbox=%s snapshot=%s name=%s bytes=%llu",
                s->c->job.sandbox, s->id, s->name, (unsigned long long)s->bytes);
        wk_touch(ctx, s->c->job.sandbox);
        disk_add(ctx, s->id, s->bytes);
        wk_host_disk_publish(ctx);
        busy_add(s->id, -1);
        wk_reply_result(s->c, json_pack("{s:s, s:s, s:I, s:s, s:s}", "snapshot_id", s->id,
                                        "name", s->name, "size", (json_int_t)s->bytes,
                                        "sandbox_id", s->c->job.sandbox, "driver",
                                        ctx->ops->name));
        free(s);
    } else if (!strcmp(v, "bytes")) {
        snprintf(text, sizeof(text), "This snapshot (%llu MiB) would take your team's snapshots "
                 "past their limit of %lld MiB; delete snapshots with sandbox_snapshot_delete "
                 "(sandbox_snapshot_list shows them), or remove files from the sandbox, then "
                 "retry.", (unsigned long long)((s->bytes + (1 << 20) - 1) >> 20),
                 (long long)ctx->cfg.snapshot_team_mib);
        snap_fail(s, SF_ERR_LIMIT, text, 0);
    } else if (!strcmp(v, "gone")) {
        snap_fail(s, SF_ERR_NOT_FOUND, "The snapshot was deleted while it was taken.", 0);
    } else {
        snap_fail(s, SF_ERR_UNAVAILABLE, "The platform's state store is unreachable, so the "
                  "snapshot could not be recorded; retry in a few seconds.", 1);
    }
}

static void on_snapped(void *arg, int rc, uint64_t bytes, const char *why)
{
    snap_call *s = arg;
    wk_ctx *ctx = s->c->ctx;
    char text[384];

    if (rc < 0) {
        snprintf(text, sizeof(text), "The snapshot could not be taken: %s", why ? why : "");
        snap_fail(s, rc == -ESRCH ? SF_ERR_NOT_FOUND : SF_ERR_UNAVAILABLE, text, 1);
        return;
    }
    s->bytes = bytes;
    if (sf_snap_finish(ctx->redis, s->c->job.team, s->name, s->id, bytes,
                       ctx->cfg.snapshot_team_mib << 20, on_finished, s) < 0)
        on_finished(NULL, NULL, s);
}

/* The record is reserved: the owner file, then the driver. */
static void on_reserved(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    snap_call *s = priv;
    wk_call *c = s->c;
    wk_ctx *ctx = c->ctx;
    const char *v = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
                            rep->element[0]->type == REDIS_REPLY_STRING
                        ? rep->element[0]->str
                        : "";
    char text[384], dir[4200], files[4200];
    wk_box *b;
    FILE *f;
    int rc;

    (void)ac;
    if (strcmp(v, "ok") != 0) {
        busy_add(s->id, -1);
        if (!strcmp(v, "taken"))
            snprintf(text, sizeof(text), "Your team has a snapshot named '%s' already; choose "
                     "another name, or delete that one with sandbox_snapshot_delete.", s->name);
        else if (!strcmp(v, "count"))
            snprintf(text, sizeof(text), "Your team holds %lld snapshots, its limit; delete one "
                     "with sandbox_snapshot_delete (sandbox_snapshot_list shows them), then "
                     "retry.", (long long)ctx->cfg.snapshots_per_team);
        else if (!strcmp(v, "bytes"))
            snprintf(text, sizeof(text), "Your team's snapshots hold %lld MiB, their limit; "
                     "delete one with sandbox_snapshot_delete (sandbox_snapshot_list shows "
                     "them), then retry.", (long long)ctx->cfg.snapshot_team_mib);
        else if (sf_redis_is_oom(rep))
            snprintf(text, sizeof(text), "%s", SF_MSG_PLATFORM_FULL);
        else
            snprintf(text, sizeof(text), SF_MSG_STORE_DOWN);
        wk_reply_error(c, !strcmp(v, "") && !sf_redis_is_oom(rep) ? SF_ERR_UNAVAILABLE
                          : !strcmp(v, "taken")                 ? SF_ERR_INVALID
                                                                : SF_ERR_LIMIT,
                       text);
        free(s);
        return;
    }
    b = sf_map_get(ctx->sandboxes, c->job.sandbox);
    if (!b || b->state != WK_BOX_RUNNING || !b->sb) {
        snprintf(text, sizeof(text), "Sandbox '%s' was killed meanwhile; nothing was captured.",
                 c->job.sandbox);
        snap_fail(s, SF_ERR_NOT_FOUND, text, 1);
        return;
    }
    if (snap_path(ctx, dir, sizeof(dir), s->id, NULL) < 0 ||
        snap_path(ctx, files, sizeof(files), s->id, "files") < 0 ||
        (snap_path(ctx, text, sizeof(text), NULL, NULL) == 0 && mkdir(text, 0700) < 0 &&
         errno != EEXIST) ||
        mkdir(dir, 0700) < 0) {
        snap_fail(s, SF_ERR_UNAVAILABLE, "The host could not make the snapshot's directory "
                  "under its state_dir; retry later.", 1);
        return;
    }
    rc = snap_path(ctx, dir, sizeof(dir), s->id, "owner") < 0 || !(f = fopen(dir, "wxe"));
    if (!rc) {
        rc = fprintf(f, "%s\n%s\n", c->job.team, s->name) < 0;
        rc |= fclose(f) != 0;
    }
    if (rc) {
        snap_fail(s, SF_ERR_UNAVAILABLE, "The host could not write the snapshot's files under "
                  "its state_dir (disk full?); retry later.", 1);
        return;
    }
    rc = ctx->ops->snapshot(b->sb, files, on_snapped, s);
    if (rc == -EBUSY)
        snap_fail(s, SF_ERR_UNAVAILABLE, "A snapshot of this sandbox is being taken already; "
                  "retry once it is done.", 1);
    else if (rc == -EAGAIN)
        snap_fail(s, SF_ERR_UNAVAILABLE, "The sandbox is still starting; retry in a moment.", 1);
    else if (rc == -ESRCH || rc == -EIO)
        snap_fail(s, SF_ERR_NOT_FOUND, "The sandbox is being killed or its VM stopped; nothing "
                  "was captured.", 1);
    else if (rc < 0)
        snap_fail(s, SF_ERR_UNAVAILABLE, "The host could not start the snapshot; retry later.", 1);
}

static void do_snapshot(wk_call *c, wk_box *b)
{
    wk_ctx *ctx = c->ctx;
    const char *name = json_string_value(json_object_get(c->job.args, "name"));
    snap_call *s;
    sf_snap_rec rec;
    char text[256];

    if (!ctx->ops->snapshot) {
        snprintf(text, sizeof(text), "This host's %s driver cannot take snapshots.",
                 ctx->ops->name);
        wk_reply_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (!(s = calloc(1, sizeof(*s))) || sf_id_new(s->id, "snp_") < 0) {
        free(s);
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    s->c = c;
    snprintf(s->name, sizeof(s->name), "%s", name ? name : s->id);
    rec = (sf_snap_rec){.id = s->id, .name = s->name, .host = ctx->host_id,
                        .driver = ctx->ops->name, .template_name = b->template_name,
                        .sandbox = b->id, .memory_mib = b->lim.memory_mib,
                        .vcpu_milli = b->lim.vcpu_milli, .disk_mib = b->lim.disk_mib,
                        .pids_max = b->lim.pids_max, .inodes = b->lim.inodes};
    busy_add(s->id, 1);
    if (sf_snap_reserve(ctx->redis, c->job.team, &rec, sf_now_ms(), ctx->cfg.snapshots_per_team,
                        ctx->cfg.snapshot_team_mib << 20, on_reserved, s) < 0)
        on_reserved(NULL, NULL, s);
}

/* ---- a create from a snapshot ------------------------------------------------------ */

int wk_snap_use(wk_ctx *ctx, const char *id, char *dir, size_t n, const char **why)
{
    struct stat st;

    if (!sf_id_valid(id) || snap_path(ctx, dir, n, id, "files") < 0) {
        *why = "The snapshot id is not valid (set by the scheduler).";
        return -EINVAL;
    }
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        *why = "The snapshot's files are missing on its host; delete it with "
               "sandbox_snapshot_delete and take a new one.";
        return -ENOENT;
    }
    busy_add(id, 1);
    return 0;
}

void wk_snap_unuse(wk_ctx *ctx, const char *id)
{
    (void)ctx;
    if (id && id[0])
        busy_add(id, -1);
}

/* ---- the sweep: files whose record is gone ----------------------------------------- */

typedef struct check_arg {
    wk_ctx *ctx;
    char id[SF_ID_MAX];
} check_arg;

static void on_checked(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    check_arg *a = priv;

    (void)ac;
    /* (S.busy is gone once wk_snap_stop ran: a check answered during the stop removes
     * nothing; the next start's sweep looks again) */
    if (S.busy && rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 0 &&
        !sf_map_get(S.busy, a->id)) {
        sf_info("msg=\"removing the files of a deleted snapshot\" snapshot=%s", a->id);
        snap_remove(a->ctx, a->id);
    }
    free(a);
}

static void sweep(wk_ctx *ctx)
{
    char dir[4200], path[4400], team[SF_ID_MAX + 2], name[72];
    size_t dl;
    struct dirent *e;
    int all = 1;
    DIR *d;

    if (!sf_redis_connected(ctx->redis))
        return; /* the next sweep */
    if (snap_path(ctx, dir, sizeof(dir), NULL, NULL) < 0 || !(d = opendir(dir))) {
        S.swept = 1;
        return;
    }
    while ((e = readdir(d))) {
        check_arg *a;
        FILE *f;
        int ok = 0;

        if (strncmp(e->d_name, "snp_", 4) != 0 || !sf_id_valid(e->d_name) ||
            sf_map_get(S.busy, e->d_name))
            continue;
        dl = strlen(dir);
        memcpy(path, dir, dl);
        path[dl] = '/';
        memcpy(path + dl + 1, e->d_name, strlen(e->d_name));
        memcpy(path + dl + 1 + strlen(e->d_name), "/owner", 7);
        team[0] = name[0] = '\0';
        if ((f = fopen(path, "re"))) {
            ok = fgets(team, sizeof(team), f) && fgets(name, sizeof(name), f);
            fclose(f);
        }
        team[strcspn(team, "\n")] = name[strcspn(name, "\n")] = '\0';
        if (!ok || !sf_id_valid(team) || !name[0]) { /* a snapshot cut short by a crash */
            snap_remove(ctx, e->d_name);
            continue;
        }
        if (!(a = calloc(1, sizeof(*a)))) {
            all = 0;
            break;
        }
        a->ctx = ctx;
        memcpy(a->id, e->d_name, strlen(e->d_name) + 1); /* valid: < SF_ID_MAX */
        if (sf_snap_check(ctx->redis, team, name, a->id, !S.swept, on_checked, a) < 0) {
            free(a);
            all = 0;
            break; /* Redis is down: the next sweep */
        }
    }
    closedir(d);
    if (all)
        S.swept = 1;
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sweep(arg);
}

/* At start: the snapshots an earlier run left here. The host's offer was measured with
 * their files on the disk, so they join it and count as held (a delete frees their room). */
static void disk_count_all(wk_ctx *ctx)
{
    char dir[4200], files[4400];
    struct dirent *e;
    uint64_t before = ctx->snap_disk_mib;
    DIR *d;

    if (snap_path(ctx, dir, sizeof(dir), NULL, NULL) < 0 || !(d = opendir(dir)))
        return;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "snp_", 4) != 0 || !sf_id_valid(e->d_name) ||
            snprintf(files, sizeof(files), "%s/%s", dir, e->d_name) >= (int)sizeof(files))
            continue;
        disk_add(ctx, e->d_name, wk_snap_bytes(files));
    }
    closedir(d);
    ctx->res.disk_mib += ctx->snap_disk_mib - before;
}

int wk_snap_start(wk_ctx *ctx)
{
    struct timeval tv = {(time_t)(ctx->cfg.snapshot_sweep_ms / 1000),
                         (suseconds_t)(ctx->cfg.snapshot_sweep_ms % 1000) * 1000};

    S.ctx = ctx;
    if (!(S.busy = sf_map_new(4096)) || !(S.mib = sf_map_new(4096)) ||
        !(S.ev_sweep = event_new(ctx->d.base, -1, EV_PERSIST, on_sweep, ctx)) ||
        event_add(S.ev_sweep, &tv) < 0)
        return -ENOMEM;
    disk_count_all(ctx);
    wk_host_disk_publish(ctx);
    sweep(ctx);
    return 0;
}

void wk_snap_stop(wk_ctx *ctx)
{
    (void)ctx;
    if (S.ev_sweep)
        event_free(S.ev_sweep);
    S.ev_sweep = NULL;
    sf_map_free(S.busy);
    S.busy = NULL;
    sf_map_free(S.mib);
    S.mib = NULL;
}

WK_HANDLERS({"sandbox_snapshot", do_snapshot});
