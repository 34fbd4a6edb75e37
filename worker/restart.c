/* restart.c: a worker restart keeps the host's sandboxes (restart.h). */
#include "restart.h"
#include "egress.h"
#include "sf_log.h"
#include "sf_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REC_DIR "boxes"
#define REC_MAX (1u << 20) /* one record (env and egress included) */
#define MSG_REC_DAMAGED "Its host-side record is damaged."
#define MSG_NOMEM "The worker ran out of memory while it took the sandbox back."

static int boxes_fd = -1; /* state_dir/boxes, checked: root's, 0700, no link */
static json_t *adopted;   /* {id: true} of the sandboxes taken back at start */

int wk_restart_init(wk_ctx *ctx)
{
    int sd, fd;
    struct stat st;

    if (!ctx->ops->adopt)
        return 0;
    if ((sd = open(ctx->cfg.state_dir, O_DIRECTORY | O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    if (mkdirat(sd, REC_DIR, 0700) < 0 && errno != EEXIST) {
        close(sd);
        return -errno;
    }
    fd = openat(sd, REC_DIR, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    close(sd);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
        close(fd);
        return -EPERM;
    }
    boxes_fd = fd;
    return 0;
}

static int rec_name(char *buf, size_t n, const char *id, const char *suffix)
{
    int w = snprintf(buf, n, "%s.json%s", id, suffix);
    return w < 0 || (size_t)w >= n ? -ENAMETOOLONG : 0;
}

void wk_restart_save(wk_box *b)
{
    char name[SF_ID_MAX + 16], tmp[SF_ID_MAX + 16], *text;
    json_t *pv, *rec;
    size_t len;
    int fd;

    if (boxes_fd < 0 || b->state != WK_BOX_RUNNING || !b->sb)
        return;
    if (!(pv = json_array()))
        return;
    for (int i = 0; i < b->pv_n; i++)
        json_array_append_new(pv, json_pack("[i, i, I]", (int)b->pv[i].port, (int)b->pv[i].priv,
                                            (json_int_t)b->pv[i].epoch));
    rec = json_pack("{s:i, s:s, s:s, s:s, s:O, s:i, s:o, s:o}", "v", 1, "id", b->id, "team",
                    b->team, "template", b->template_name, "env", b->env ? b->env : json_null(),
                    "pv_private", b->pv_private, "pv", pv, "egress", wk_egress_box_dump(b->eg));
    text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    if (!text || (len = strlen(text)) > REC_MAX || rec_name(name, sizeof(name), b->id, "") < 0 ||
        rec_name(tmp, sizeof(tmp), b->id, ".tmp") < 0) {
        sf_warn("msg=\"cannot record the sandbox for a worker restart\" sandbox=%s", b->id);
        free(text);
        return;
    }
    fd = openat(boxes_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || close(fd) < 0 ||
        renameat(boxes_fd, tmp, boxes_fd, name) < 0) {
        sf_warn("msg=\"cannot write the sandbox's record; a worker restart will lose it\" "
                "sandbox=%s err=%d", b->id, errno);
        if (fd >= 0)
            unlinkat(boxes_fd, tmp, 0);
    }
    free(text);
}

void wk_restart_forget(wk_ctx *ctx, const char *id)
{
    char name[SF_ID_MAX + 16];

    (void)ctx;
    if (boxes_fd >= 0 && rec_name(name, sizeof(name), id, "") == 0)
        unlinkat(boxes_fd, name, 0);
}

/* The record of id (bounded, root's, no link), parsed; NULL when unusable. */
static json_t *rec_read(const char *file)
{
    struct stat st;
    json_t *j = NULL;
    char *buf;
    ssize_t n;
    int fd = openat(boxes_fd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        !(st.st_mode & 077) && st.st_size > 0 && st.st_size <= REC_MAX &&
        (buf = malloc((size_t)st.st_size + 1))) {
        if ((n = read(fd, buf, (size_t)st.st_size)) == st.st_size)
            j = json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, NULL);
        free(buf);
    }
    close(fd);
    return j;
}

static void lost_add(json_t *lost, const char *id, const char *team, const char *why)
{
    json_array_append_new(lost, json_pack("{s:s, s:s, s:s}", "id", id, "team", team ? team : "",
                                          "why", why));
}

/* b from its record and the driver's sandbox: 0, or -1 with why. */
static int box_fill(wk_ctx *ctx, wk_box *b, const json_t *rec, wk_sandbox *sb,
                    const char **why)
{
    const json_t *env = json_object_get(rec, "env"), *pv = json_object_get(rec, "pv");
    const char *tpl = json_string_value(json_object_get(rec, "template"));
    int ns = ctx->ops->netns ? ctx->ops->netns(sb) : -ENOENT;
    size_t i;
    json_t *v;

    *why = MSG_REC_DAMAGED;
    if (!tpl || strlen(tpl) >= sizeof(b->template_name) || (!json_is_null(env) &&
        !json_is_object(env)) || !json_is_array(pv) || json_array_size(pv) > WK_PV_MAX)
        return -1;
    snprintf(b->template_name, sizeof(b->template_name), "%s", tpl);
    b->env = json_is_object(env) ? json_incref((json_t *)env) : NULL;
    b->pv_private = json_is_true(json_object_get(rec, "pv_private")) ||
                    json_integer_value(json_object_get(rec, "pv_private")) == 1;
    json_array_foreach(pv, i, v) {
        json_int_t port = json_integer_value(json_array_get(v, 0));
        json_int_t epoch = json_integer_value(json_array_get(v, 2));
        if (port < 1 || port > 65535 || epoch < 1)
            return -1;
        b->pv[b->pv_n].port = (uint16_t)port;
        b->pv[b->pv_n].priv = json_integer_value(json_array_get(v, 1)) == 1;
        b->pv[b->pv_n].epoch = (uint64_t)epoch;
        if ((uint64_t)epoch > ctx->pv_epoch_last)
            ctx->pv_epoch_last = (uint64_t)epoch;
        b->pv_n++;
    }
    *why = "Its egress record is damaged, or this host's egress proxy is off now.";
    if (wk_egress_box_load(ctx->egress, json_object_get(rec, "egress"), ns, &b->eg) < 0)
        return -1;
    return 0;
}

void wk_restart_adopt(wk_ctx *ctx, json_t *lost)
{
    struct dirent *e;
    DIR *d;
    int fd;

    if (boxes_fd < 0 || !ctx->ops->adopt)
        return;
    if (!adopted && !(adopted = json_object()))
        return;
    if ((fd = dup(boxes_fd)) < 0 || !(d = fdopendir(fd))) {
        if (fd >= 0)
            close(fd);
        ctx->ops->adopt_end(ctx->drv);
        return;
    }
    while ((e = readdir(d))) {
        char id[SF_ID_MAX];
        size_t len = strlen(e->d_name);
        const char *why = NULL, *team;
        wk_sandbox *sb = NULL;
        json_t *rec;
        wk_box *b;
        int paused = 0, rc;

        if (e->d_name[0] == '.')
            continue;
        if (len < 6 || len - 5 >= sizeof(id) || strcmp(e->d_name + len - 5, ".json")) {
            unlinkat(boxes_fd, e->d_name, 0); /* a write cut short */
            continue;
        }
        memcpy(id, e->d_name, len - 5);
        id[len - 5] = '\0';
        if (!sf_id_valid(id)) {
            unlinkat(boxes_fd, e->d_name, 0);
            continue;
        }
        rec = rec_read(e->d_name);
        team = json_string_value(json_object_get(rec, "team"));
        if (!rec || !team || !sf_id_valid(team) ||
            strcmp(json_string_value(json_object_get(rec, "id")) ?: "", id)) {
            why = MSG_REC_DAMAGED;
            rc = -EINVAL;
        } else {
            rc = ctx->ops->adopt(ctx->drv, id, &sb, &paused, &why);
        }
        if (rc == 0 && !(b = calloc(1, sizeof(*b)))) {
            why = MSG_NOMEM;
            rc = -ENOMEM;
        }
        if (rc == 0) {
            b->ctx = ctx;
            b->sb = sb;
            b->state = WK_BOX_RUNNING;
            snprintf(b->id, sizeof(b->id), "%s", id);
            snprintf(b->team, sizeof(b->team), "%s", team);
            ctx->ops->limits(sb, &b->lim);
            b->paused = paused;
            b->last_active_ms = sf_mono_ms();
            if (box_fill(ctx, b, rec, sb, &why) < 0 || sf_map_put(ctx->sandboxes, b->id, b) < 0) {
                if (!why)
                    why = MSG_NOMEM;
                ctx->ops->kill(sb, NULL, NULL);
                json_decref(b->env);
                wk_egress_box_free(b->eg);
                free(b);
                rc = -EINVAL;
            } else {
                ctx->used_mem_mib += b->lim.memory_mib;
                ctx->used_vcpu_milli += b->lim.vcpu_milli;
                ctx->used_disk_mib += b->lim.disk_mib;
                json_object_set_new(adopted, id, json_true());
                sf_info("msg=\"sandbox kept across the worker restart\" sandbox=%s team=%s "
                        "paused=%d previews=%d", id, team, paused, b->pv_n);
            }
        }
        if (rc < 0) {
            sf_warn("msg=\"sandbox lost across the worker restart\" sandbox=%s why=\"%s\"", id,
                    why ? why : "");
            lost_add(lost, id, team, why ? why : "It could not be taken back.");
            unlinkat(boxes_fd, e->d_name, 0);
        }
        json_decref(rec);
    }
    closedir(d);
    atomic_store(&ctx->beat.running, (int)sf_map_len(ctx->sandboxes));
    ctx->ops->adopt_end(ctx->drv); /* the rest: template builds, creates cut short */
}

int wk_restart_adopted(const char *id, void *arg)
{
    (void)arg;
    return adopted && json_object_get(adopted, id) != NULL;
}

static void collect(const char *key, void *val, void *arg)
{
    wk_box ***p = arg;
    *(*p)++ = val;
}

int wk_restart_keep_all(wk_ctx *ctx)
{
    size_t n = sf_map_len(ctx->sandboxes);
    wk_box **all, **p;

    if (!ctx->ops->keep || boxes_fd < 0 || !(all = calloc(n + 1, sizeof(*all))))
        return 0;
    p = all;
    sf_map_foreach(ctx->sandboxes, collect, &p);
    for (size_t i = 0; i < n; i++)
        if (all[i]->state == WK_BOX_RUNNING && all[i]->sb) {
            ctx->ops->keep(all[i]->sb);
            all[i]->kept = 1;
        }
    free(all);
    return 1;
}

void wk_restart_free_kept(wk_ctx *ctx)
{
    size_t n = sf_map_len(ctx->sandboxes);
    wk_box **all, **p;

    if (!(all = calloc(n + 1, sizeof(*all))))
        return;
    p = all;
    sf_map_foreach(ctx->sandboxes, collect, &p);
    for (size_t i = 0; i < n; i++)
        if (all[i]->kept) {
            sf_map_del(ctx->sandboxes, all[i]->id);
            json_decref(all[i]->env);
            wk_egress_box_free(all[i]->eg);
            free(all[i]);
        }
    free(all);
    json_decref(adopted);
    adopted = NULL;
    if (boxes_fd >= 0)
        close(boxes_fd);
    boxes_fd = -1;
}
