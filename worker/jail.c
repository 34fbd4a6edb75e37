/* The jail driver's public API (sandbox.h): host set-up and clean-up, sandbox
 * create and kill. The pieces live in template.c, cgroup.c, jail_fs.c,
 * jail_seccomp.c, jail_spawn.c and jail_agent.c (see jail_int.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jail_int.h"
#include "sf_log.h"
#include "sf_util.h"

#define ERR_KILLED "The sandbox was killed while the command ran."

typedef struct jail_cfg {
    uint64_t memory;
    int pids;
    uint32_t uid_base;
} jail_cfg;

static int check_opts(const wk_jail_opts *o, jail_cfg *c, const char **why)
{
    struct stat st;

    if (!o || !o->state_dir || o->state_dir[0] != '/' || strlen(o->state_dir) > 1024) {
        *why = "state_dir must be an absolute path of at most 1024 bytes.";
        return -EINVAL;
    }
    if (!o->agent_path || stat(o->agent_path, &st) < 0 || !S_ISREG(st.st_mode) ||
        !(st.st_mode & S_IXOTH)) {
        *why = "agent_path must name the built sandfleet-agent binary (a regular file executable by all).";
        return -EINVAL;
    }
    c->memory = o->memory_bytes ? o->memory_bytes : WK_MEMORY_DEFAULT;
    c->pids = o->pids_max > 0 ? o->pids_max : WK_PIDS_DEFAULT;
    c->uid_base = o->uid_base ? o->uid_base : WK_UID_BASE_DEFAULT;
    if (c->uid_base < WK_UID_RANGE || c->uid_base > UINT32_MAX - 2 * WK_UID_RANGE) {
        *why = "uid_base must be at least 65536 and leave room for one 65536-id range below 2^32.";
        return -EINVAL;
    }
    if (c->memory < (4ull << 20)) {
        *why = "memory_bytes must be at least 4 MiB.";
        return -EINVAL;
    }
    return 0;
}

static int sb_path(char *buf, size_t n, const char *state_dir, const char *id)
{
    int r = snprintf(buf, n, "%s/sandboxes%s%s", state_dir, id ? "/" : "", id ? id : "");
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

int wk_jail_host_init(const wk_jail_opts *o, const char **why)
{
    const struct sock_fprog *prog;
    char path[WK_PATH_MAX];
    jail_cfg c;
    int rc;

    *why = NULL;
    if ((rc = check_opts(o, &c, why)) < 0)
        return rc;
    if (geteuid() != 0) {
        *why = "The jail driver needs root (namespaces, cgroups, uid maps); run the worker as root.";
        return -EPERM;
    }
    sb_path(path, sizeof(path), o->state_dir, NULL);
    if ((rc = wk_mkdir_p(path, 0700)) < 0) {
        *why = "Cannot create state_dir/sandboxes; check that state_dir is writable by root.";
        return rc;
    }
    if ((rc = wk_template_ensure(o->state_dir, why)) < 0 || (rc = wk_cgroup_host_init(why)) < 0 ||
        (rc = wk_seccomp_prog(&prog, why)) < 0)
        return rc;
    sf_info("msg=\"jail driver ready\" state_dir=%s cgroup=%s uid_base=%u", o->state_dir,
            wk_cgroup_is_v2() ? "v2" : "v1", c.uid_base);
    return 0;
}

int wk_jail_create(struct event_base *base, const wk_jail_opts *o, const char *id,
                   wk_sandbox **out, const char **why)
{
    const struct sock_fprog *prog;
    char lower[WK_PATH_MAX];
    uint64_t t0 = sf_mono_us();
    wk_spawn_args sa;
    wk_sandbox *sb;
    int sv[2] = {-1, -1}, dir_made = 0, rc;
    jail_cfg c;

    *why = NULL;
    if (!base || !id || !out || !sf_id_valid(id)) {
        *why = "The sandbox id must match [a-z0-9_-]{1,63}.";
        return -EINVAL;
    }
    if ((rc = check_opts(o, &c, why)) < 0)
        return rc;
    if ((rc = wk_seccomp_prog(&prog, why)) < 0)
        return rc;
    if (wk_template_path(o->state_dir, lower, sizeof(lower)) < 0) {
        *why = "state_dir is too long; use a shorter path.";
        return -ENAMETOOLONG;
    }
    if (!(sb = calloc(1, sizeof(*sb)))) {
        *why = "The worker is out of memory.";
        return -ENOMEM;
    }
    memcpy(sb->id, id, strlen(id) + 1);
    sb->base = base;
    sb->pidfd = sb->slot_fd = -1;
    sb->cg.fd = -1;
    if (sb_path(sb->sbdir, sizeof(sb->sbdir), o->state_dir, id) < 0) {
        rc = -ENAMETOOLONG;
        *why = "state_dir is too long; use a shorter path.";
        goto fail;
    }
    if ((rc = wk_slot_acquire(c.uid_base, &sb->host_uid, &sb->slot_fd)) < 0) {
        *why = rc == -EAGAIN ? "Every uid range of this host is in use; kill a sandbox and retry."
                             : "Cannot lock a uid range under " WK_UID_LOCK_DIR "; run the worker as root.";
        goto fail;
    }
    if ((rc = wk_sbdir_create(sb->sbdir, sb->host_uid, why)) < 0)
        goto fail;
    dir_made = 1;
    if ((rc = wk_cgroup_create(&sb->cg, id, c.memory, c.pids, why)) < 0)
        goto fail;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = -errno;
        *why = "The worker is out of file descriptors; raise its limit (ulimit -n).";
        goto fail;
    }
    sa = (wk_spawn_args){
        .lower = lower,
        .sbdir = sb->sbdir,
        .agent_path = o->agent_path,
        .hostname = id,
        .host_uid = sb->host_uid,
        .cg = &sb->cg,
        .seccomp = prog,
        .sock = sv[1],
    };
    rc = wk_spawn(&sa, &sb->pid, &sb->pidfd, why);
    close(sv[1]);
    sv[1] = -1;
    if (rc < 0)
        goto fail;
    if ((rc = wk_agent_ping(sv[0], WK_PING_TIMEOUT_MS, why)) < 0)
        goto fail;
    if ((rc = wk_agent_attach(sb, sv[0])) < 0) {
        *why = "The worker is out of memory.";
        goto fail;
    }
    sv[0] = -1; /* owned by the bufferevent */
    sf_info("msg=\"sandbox created\" sandbox=%s pid=%d uid=%u create_us=%llu", id, (int)sb->pid,
            sb->host_uid, (unsigned long long)(sf_mono_us() - t0));
    *out = sb;
    return 0;
fail:
    sf_error("msg=\"sandbox create failed\" sandbox=%s err=%d why=\"%s\"", id, rc,
             *why ? *why : "");
    if (sv[0] >= 0)
        close(sv[0]);
    wk_spawn_kill(&sb->pidfd);
    wk_cgroup_destroy(&sb->cg);
    if (dir_made)
        wk_rmtree(sb->sbdir);
    if (sb->slot_fd >= 0)
        close(sb->slot_fd);
    free(sb);
    return rc;
}

void wk_sandbox_kill(wk_sandbox *sb)
{
    uint64_t t0 = sf_mono_us();
    int rc;

    if (!sb || sb->killed)
        return;
    sb->killed = 1;
    sb->depth++;
    wk_agent_fail_all(sb, ERR_KILLED);
    wk_agent_detach(sb);
    wk_cgroup_thaw(&sb->cg);
    wk_spawn_kill(&sb->pidfd);
    if ((rc = wk_cgroup_destroy(&sb->cg)) < 0)
        sf_error("msg=\"cannot remove the sandbox cgroups\" sandbox=%s err=%d", sb->id, rc);
    if ((rc = wk_rmtree(sb->sbdir)) < 0)
        sf_error("msg=\"cannot remove the sandbox directory\" sandbox=%s dir=%s err=%d", sb->id,
                 sb->sbdir, rc);
    if (sb->slot_fd >= 0) {
        close(sb->slot_fd);
        sb->slot_fd = -1;
    }
    sf_info("msg=\"sandbox killed\" sandbox=%s kill_us=%llu", sb->id,
            (unsigned long long)(sf_mono_us() - t0));
    sb->depth--;
    wk_sandbox_release(sb);
}

const char *wk_sandbox_id(const wk_sandbox *sb)
{
    return sb ? sb->id : NULL;
}

void wk_jail_host_cleanup(const wk_jail_opts *o)
{
    char dir[WK_PATH_MAX], path[WK_PATH_MAX];
    struct dirent *e;
    DIR *d;

    if (!o || !o->state_dir || o->state_dir[0] != '/')
        return;
    wk_template_cleanup(o->state_dir);
    if (sb_path(dir, sizeof(dir), o->state_dir, NULL) < 0 || !(d = opendir(dir)))
        return;
    while ((e = readdir(d))) {
        wk_cgroup cg;
        int rc;

        if (!sf_id_valid(e->d_name) || sb_path(path, sizeof(path), o->state_dir, e->d_name) < 0)
            continue;
        /* Its agent exits when the old worker's socket end closes, which ends
         * the pid namespace; the cgroup sweep catches anything still there. */
        wk_cgroup_lookup(&cg, e->d_name);
        if ((rc = wk_cgroup_destroy(&cg)) < 0)
            sf_error("msg=\"cannot remove a leftover sandbox cgroup\" sandbox=%s err=%d", e->d_name, rc);
        if ((rc = wk_rmtree(path)) < 0)
            sf_error("msg=\"cannot remove a leftover sandbox\" dir=%s err=%d", path, rc);
        else
            sf_info("msg=\"removed a leftover sandbox\" sandbox=%s", e->d_name);
    }
    closedir(d);
}
