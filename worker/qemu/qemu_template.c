/* The template snapshot: a guest booted once with its agent ready, saved so that
 * every sandbox_create restores it instead of booting (~10-40 s under TCG).
 *
 * vm_dir/guest/<id>/       kernel, initramfs, rootfs.img (worker/vm/build-guest)
 * vm_dir/templates/<key>/  one per guest and shape (memory, vCPUs, accelerator...):
 *   ram          the guest's memory: the template VM ran with this file as its RAM
 *                (shared mapping), so it is the snapshot's memory; zero pages are
 *                holes. Sandboxes map it privately: pages they never write stay
 *                shared by all of them through the page cache.
 *   state        device state only (migrated with x-ignore-shared: RAM excluded)
 *   disk.qcow2   the disk as the template left it (backing: the guest's rootfs.img)
 *   blank.qcow2  an empty overlay of disk.qcow2, copied for each sandbox
 *   console.log  the template boot's serial console
 *   ready        written last: the template is complete
 * Workers of one host share vm_dir; a lock file serializes builds. Blocking: host
 * init only (its own event loop drives QMP and the agent). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qemu_int.h"
#include "sf_log.h"
#include "sf_util.h"
#include "sf_msg.h"

#define BOOT_TIMEOUT_MS (300 * 1000) /* TCG on a loaded 2-core host: ~40 s seen */
#define SAVE_TIMEOUT_MS (60 * 1000)
#define FORMAT "sandfleet-qemu-template-2" /* bump when the way a template is made changes */

extern char **environ;

/* ---- small blocking helpers (host init only) ------------------------------- */

/* Runs argv, waits; its stdout into out (NUL-terminated, may be NULL). ctl: NULL, or it
 * runs in a process group of its own, named in ctl->pid while it runs (a stop kills the
 * group). 0 or -errno. */
static int run_ctl(char *const argv[], char *out, size_t out_n, wk_qtpl_ctl *ctl)
{
    posix_spawnattr_t at;
    posix_spawn_file_actions_t fa;
    int p[2] = {-1, -1}, status, rc;
    size_t got = 0;
    pid_t pid;

    if (out && pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    posix_spawn_file_actions_init(&fa);
    if (out)
        posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawnattr_init(&at);
    if (ctl) {
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&at, 0);
    }
    rc = -posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    if (ctl && rc == 0) {
        atomic_store(&ctl->pid, (int)pid);
        if (atomic_load(&ctl->stop)) /* a stop that came before the pid was known */
            kill(-pid, SIGTERM);
    }
    if (out) {
        close(p[1]);
        while (rc == 0) {
            ssize_t n = read(p[0], out + got, out_n - 1 - got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            got += (size_t)n;
            if (got == out_n - 1)
                break;
        }
        out[got] = '\0';
        close(p[0]);
    }
    if (rc < 0)
        return rc;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            rc = -errno;
            break;
        }
    if (ctl)
        atomic_store(&ctl->pid, 0);
    if (rc < 0)
        return rc;
    if (ctl && atomic_load(&ctl->stop))
        return -ECANCELED;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -ECHILD;
}

static int run(char *const argv[], char *out, size_t out_n)
{
    return run_ctl(argv, out, out_n, NULL);
}

static int mkdir_p(const char *path)
{
    char buf[WK_QEMU_PATH_MAX];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof(buf))
        return -ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    return mkdir(buf, 0755) < 0 && errno != EEXIST ? -errno : 0;
}

static int pathf(char *buf, size_t n, const char *fmt, const char *a, const char *b)
{
    int r = snprintf(buf, n, fmt, a, b);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

static uint64_t fnv(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Turns runs of zero pages into holes: a sandbox that reads them gets the zero page,
 * not page cache. */
static int dig_holes(const char *path)
{
    enum { PAGE = 4096, CHUNK = 1 << 20 };
    static const char zero[PAGE];
    char *buf = malloc(CHUNK);
    int fd = open(path, O_RDWR | O_CLOEXEC), rc = 0;
    off_t off = 0, hole = -1;
    ssize_t n;

    if (!buf || fd < 0) {
        rc = fd < 0 ? -errno : -ENOMEM;
        goto out;
    }
    while ((n = pread(fd, buf, CHUNK, off)) > 0) {
        for (ssize_t i = 0; i < n; i += PAGE) {
            size_t len = (size_t)(n - i) < PAGE ? (size_t)(n - i) : PAGE;
            int z = memcmp(buf + i, zero, len) == 0;
            if (z && hole < 0)
                hole = off + i;
            if (!z && hole >= 0) {
                if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, hole,
                              off + i - hole) < 0)
                    rc = -errno;
                hole = -1;
            }
        }
        off += n;
    }
    if (n < 0)
        rc = -errno;
    if (hole >= 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, hole, off - hole) < 0)
        rc = -errno;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

/* ---- the boot and the snapshot (driven by a private event loop) ------------- */

typedef struct boot {
    struct event_base *base;
    wk_qmp *qmp;
    wk_alink *link;
    int state_fd;
    int done, rc;
    const char *why;
    int step;
    wk_qtpl_ctl *ctl;
} boot;

static void finish(boot *b, int rc, const char *why)
{
    if (b->done)
        return;
    b->done = 1;
    b->rc = rc;
    b->why = why;
    event_base_loopbreak(b->base);
}

static void on_migrated(void *arg, json_t *ret, const char *err);

static void on_qmp_event(void *arg, const char *event, json_t *data)
{
    boot *b = arg;
    const char *status;

    if (!event) {
        finish(b, -EPIPE, "QEMU exited while the template was being built; see console.log "
                          "and qemu.log in vm_dir/templates/<key>.tmp.");
        return;
    }
    if (strcmp(event, "MIGRATION") != 0)
        return;
    status = json_string_value(json_object_get(data, "status"));
    if (status && !strcmp(status, "completed"))
        finish(b, 0, NULL);
    else if (status && !strcmp(status, "failed"))
        finish(b, -EIO, "Saving the template snapshot failed; see qemu.log in "
                        "vm_dir/templates/<key>.tmp.");
}

static void on_qmp_step(void *arg, json_t *ret, const char *err)
{
    boot *b = arg;

    if (err) {
        sf_error("msg=\"template snapshot command failed\" err=\"%s\"", err);
        finish(b, -EIO, "QEMU refused a step of the template snapshot; see the worker log.");
    }
}

static void on_migrated(void *arg, json_t *ret, const char *err)
{
    on_qmp_step(arg, ret, err); /* completion comes as a MIGRATION event */
}

static void on_dropped(void *arg, const wk_exec_result *res)
{
    boot *b = arg;
    json_t *caps;

    if (res->error || res->exit_code != 0)
        sf_warn("msg=\"template: dropping the guest's caches failed\" err=\"%s\"",
                res->error ? res->error : "exit status");
    /* The RAM file is the memory: saving the device state (RAM excluded) is enough,
     * and the VM may keep running until the switch-over stops it. */
    caps = wk_qmp_caps();
    if (wk_qmp_cmd(b->qmp, "migrate-set-capabilities", caps, -1, on_qmp_step, b) < 0 ||
        wk_qmp_cmd(b->qmp, "getfd", json_pack("{s:s}", "fdname", "tplstate"), b->state_fd,
                   on_qmp_step, b) < 0 ||
        wk_qmp_cmd(b->qmp, "migrate", json_pack("{s:s}", "uri", "fd:tplstate"), -1, on_migrated,
                   b) < 0)
        finish(b, -ENOMEM, SF_MSG_HOST_NOMEM);
}

static void on_pong(void *arg, int rc, const char *why)
{
    boot *b = arg;
    /* Clean page cache and slab out of the snapshot (fewer pages for every sandbox to
     * share, a smaller file), then read the shell back in: every sandbox's first command
     * finds it cached. */
    wk_exec_req req = {.command = "sync; echo 3 > /proc/sys/vm/drop_caches; /bin/sh -c true",
                       .timeout_ms = 60000};

    if (rc < 0) {
        finish(b, rc, rc == -ETIMEDOUT
                          ? "The template VM's agent did not answer within 300 s of boot; see "
                            "console.log in vm_dir/templates/<key>.tmp."
                          : why);
        return;
    }
    sf_info("msg=\"template VM booted\"");
    if (wk_alink_exec(b->link, &req, on_dropped, b) < 0)
        finish(b, -ENOMEM, SF_MSG_HOST_NOMEM);
}

static void on_stop_tick(evutil_socket_t fd, short what, void *arg)
{
    boot *b = arg;

    if (b->ctl && atomic_load(&b->ctl->stop))
        finish(b, -ECANCELED, "The worker is stopping.");
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    finish(arg, -ETIMEDOUT, "Building the template snapshot took too long; see console.log in "
                            "vm_dir/templates/<key>.tmp.");
}

static int boot_and_save(const wk_qemu_cfg *c, const wk_qtpl *t, const char *tmp,
                         wk_qtpl_ctl *ctl, const char **why)
{
    struct event *tick = NULL;
    struct timeval tick_tv = {0, 200 * 1000};
    char disk[WK_QEMU_PATH_MAX], con[WK_QEMU_PATH_MAX], log[WK_QEMU_PATH_MAX],
        st[WK_QEMU_PATH_MAX];
    int ag[2] = {-1, -1}, mon[2] = {-1, -1}, pidfd = -1, report = -1, rc;
    wk_qtpl tt = *t;
    char **argv = NULL;
    boot b = {0};
    struct event *dl = NULL;
    struct timeval tv = {SAVE_TIMEOUT_MS / 1000 + BOOT_TIMEOUT_MS / 1000, 0};
    pid_t pid;
    wk_qspawn sp;

    b.state_fd = -1;
    b.ctl = ctl;
    snprintf(tt.dir, sizeof(tt.dir), "%s", tmp);
    if (pathf(disk, sizeof(disk), "%s/%s", tmp, WK_QTPL_DISK) < 0 ||
        pathf(con, sizeof(con), "%s/%s", tmp, "console.log") < 0 ||
        pathf(log, sizeof(log), "%s/%s", tmp, "qemu.log") < 0 ||
        pathf(st, sizeof(st), "%s/%s", tmp, WK_QTPL_STATE) < 0) {
        *why = SF_MSG_VM_DIR_LONG;
        return -ENAMETOOLONG;
    }
    if (!(b.base = event_base_new()) || !(argv = wk_qargs(c, &tt, WK_QARGS_BOOT, disk, con))) {
        rc = -ENOMEM;
        *why = SF_MSG_HOST_NOMEM;
        goto out;
    }
    if ((b.state_fd = open(st, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ag) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, mon) < 0) {
        rc = -errno;
        *why = "Cannot create the template's files or sockets; check vm_dir and the worker's fd limit.";
        goto out;
    }
    sp = (wk_qspawn){.argv = (const char *const *)argv, .agent_fd = ag[1], .qmp_fd = mon[1],
                     .incoming_fd = -1, .netns_fd = -1, .tap = 1, .log_path = log,
                     .cg_fd = -1};
    if ((rc = wk_qspawn_start(&sp, &pid, &pidfd, &report, why)) < 0)
        goto out;
    close(ag[1]);
    close(mon[1]);
    ag[1] = mon[1] = -1;
    sf_info("msg=\"booting the template VM\" dir=%s pid=%d accel=%s", tmp, (int)pid,
            c->kvm ? "kvm" : "tcg");
    if (!(b.qmp = wk_qmp_new(b.base, mon[0], on_qmp_event, &b))) {
        rc = -ENOMEM;
        *why = SF_MSG_HOST_NOMEM;
        goto out;
    }
    mon[0] = -1;
    b.link = wk_alink_new(b.base, ag[0], "template");
    ag[0] = -1;
    if (!b.link || wk_alink_ping(b.link, 0, NULL, 0, NULL, BOOT_TIMEOUT_MS, on_pong, &b) < 0 ||
        !(dl = evtimer_new(b.base, on_deadline, &b)) || evtimer_add(dl, &tv) < 0 ||
        (ctl && (!(tick = event_new(b.base, -1, EV_PERSIST, on_stop_tick, &b)) ||
                 event_add(tick, &tick_tv) < 0))) {
        rc = -ENOMEM;
        *why = SF_MSG_HOST_NOMEM;
        goto out;
    }
    event_base_dispatch(b.base);
    rc = b.rc;
    *why = b.why;
    if (rc == 0) {
        /* The device state is saved: let QEMU go (quit), then make sure it is gone. */
        wk_alink_free(b.link);
        b.link = NULL;
        wk_qmp_cmd(b.qmp, "quit", NULL, -1, NULL, NULL);
        for (int i = 0; i < 300 && wk_qspawn_reap(pidfd) < 0; i++) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            event_base_loop(b.base, EVLOOP_NONBLOCK);
            nanosleep(&ts, NULL);
        }
    }
out:
    wk_alink_free(b.link);
    wk_qmp_free(b.qmp);
    wk_qspawn_kill(&pidfd);
    if (dl)
        event_free(dl);
    if (tick)
        event_free(tick);
    if (b.base)
        event_base_free(b.base);
    for (int i = 0; i < 2; i++) {
        if (ag[i] >= 0)
            close(ag[i]);
        if (mon[i] >= 0)
            close(mon[i]);
    }
    if (report >= 0)
        close(report);
    if (b.state_fd >= 0)
        close(b.state_fd);
    wk_qargs_free(argv);
    return rc;
}

/* ---- the public entry -------------------------------------------------------- */

static int rmtree_cmd(const char *path)
{
    char *argv[] = {"/bin/rm", "-rf", "--one-file-system", (char *)path, NULL};
    return run(argv, NULL, 0);
}

/* Marks the template and its guest as in use (mtime = now): workers do it at start and
 * hourly, and prune() keeps what was marked within WK_QTPL_KEEP_S. */
void wk_qtpl_touch(const wk_qtpl *t)
{
    char path[WK_QEMU_PATH_MAX];

    if (pathf(path, sizeof(path), "%s/%s", t->dir, "ready") == 0)
        utimensat(AT_FDCWD, path, NULL, 0);
    if (pathf(path, sizeof(path), "%s/%s", t->guest, "id") == 0)
        utimensat(AT_FDCWD, path, NULL, 0);
}

static int stale(const char *dir, const char *mark, time_t now)
{
    char path[WK_QEMU_PATH_MAX];
    struct stat st;

    if (pathf(path, sizeof(path), "%s/%s", dir, mark) < 0)
        return 0;
    if (stat(path, &st) < 0 && stat(dir, &st) < 0)
        return 0;
    return now - st.st_mtime > WK_QTPL_KEEP_S;
}

/* Removes templates and guests no worker of this host marked for WK_QTPL_KEEP_S (they
 * are rebuilt whenever an input changes: the agent, the kernel, the shape...). Under
 * the templates lock. */
static void prune(const wk_qemu_cfg *c, const wk_qtpl *t)
{
    static const char *const kinds[] = {"templates", "guest"};
    time_t now = time(NULL);

    for (size_t k = 0; k < 2; k++) {
        char dir[WK_QEMU_PATH_MAX], path[WK_QEMU_PATH_MAX];
        struct dirent *e;
        DIR *d;

        if (pathf(dir, sizeof(dir), "%s/%s", c->vm_dir, kinds[k]) < 0 || !(d = opendir(dir)))
            continue;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.' || pathf(path, sizeof(path), "%s/%s", dir, e->d_name) < 0 ||
                !strcmp(path, k == 0 ? t->dir : t->guest) ||
                !stale(path, k == 0 ? "ready" : "id", now))
                continue;
            if (rmtree_cmd(path) == 0)
                sf_info("msg=\"removed an unused VM %s\" dir=%s", k == 0 ? "template" : "guest",
                        path);
        }
        closedir(d);
    }
}

static int qemu_id(const char *qemu, char *buf, size_t n)
{
    struct stat st;

    if (stat(qemu, &st) < 0)
        return -errno;
    snprintf(buf, n, "%s:%lld:%lld", qemu, (long long)st.st_size, (long long)st.st_mtime);
    return 0;
}

int wk_qtpl_ensure(const wk_qemu_cfg *c, const char *rootfs, const char *agent,
                   uint32_t memory_mib, uint32_t vcpus, uint32_t pids_max, uint32_t disk_mib,
                   const char *tree_key, wk_qtpl_ctl *ctl, wk_qtpl *t, const char **why)
{
    char out[WK_QEMU_PATH_MAX + 64], disk_s[24], qid[WK_QEMU_PATH_MAX + 64], desc[3 * WK_QEMU_PATH_MAX],
        path[WK_QEMU_PATH_MAX], tmp[WK_QEMU_PATH_MAX];
    char *nl;
    uint64_t h = 1469598103934665603ull, t0 = sf_mono_ms();
    int lock = -1, rc, n;
    struct stat st;

    memset(t, 0, sizeof(*t));
    t->memory_mib = memory_mib;
    t->vcpus = vcpus;
    t->pids_max = pids_max;
    t->disk_mib = disk_mib;
    snprintf(disk_s, sizeof(disk_s), "%u", disk_mib);
    {
        char *argv[] = {(char *)c->builder, (char *)c->vm_dir, (char *)rootfs, (char *)agent,
                        disk_s, (char *)tree_key, NULL};
        if ((rc = run_ctl(argv, out, sizeof(out), ctl)) < 0) {
            *why = rc == -ECANCELED ? "The worker is stopping." : "Building the microVM guest failed (worker/vm/build-guest; its message is in "
                   "the worker log): it needs Debian's linux-image-amd64 (apt-get download), "
                   "busybox-static, e2fsprogs, kmod and cpio.";
            return rc;
        }
    }
    if ((nl = strchr(out, '\n')))
        *nl = '\0';
    if (!out[0] || strlen(out) >= sizeof(t->guest)) {
        *why = "worker/vm/build-guest printed no guest directory.";
        return -EIO;
    }
    memcpy(t->guest, out, strlen(out) + 1);
    if (c->kvm)
        n = snprintf(t->append, sizeof(t->append),
                     "console=ttyS0 panic=-1 loglevel=4 pci=off init_on_free=1 sf.pids=%u",
                     pids_max);
    else
        /* TCG: no calibration against the PIT (a loaded host makes it fail and the
         * boot hang): the TSC runs at the host's rate, which we tell the kernel. */
        n = snprintf(t->append, sizeof(t->append),
                     "console=ttyS0 panic=-1 loglevel=4 pci=off init_on_free=1 sf.pids=%u "
                     "lpj=5000000 tsc=reliable tsc_early_khz=%u",
                     pids_max, c->tsc_khz);
    if (n < 0 || (size_t)n >= sizeof(t->append) || qemu_id(c->qemu, qid, sizeof(qid)) < 0) {
        *why = "QEMU (qemu-system-x86_64) is not installed; install qemu-system-x86.";
        return -ENOENT;
    }
    /* the guest's disk as it is now (a guest built again, after its folder was removed, is
     * another file: the snapshots of the old one must not be taken for it) */
    if (pathf(path, sizeof(path), "%s/%s", t->guest, "rootfs.img") < 0 || stat(path, &st) < 0) {
        *why = "worker/vm/build-guest left no rootfs.img in its guest directory.";
        return -EIO;
    }
    snprintf(desc, sizeof(desc),
             FORMAT " guest=%s disk=%llu.%lld.%ld mem=%u vcpus=%u kvm=%d qemu=%s append=%s",
             t->guest, (unsigned long long)st.st_ino, (long long)st.st_mtim.tv_sec,
             (long)st.st_mtim.tv_nsec, memory_mib, vcpus, c->kvm, qid, t->append);
    h = fnv(h, desc);
    snprintf(t->key, sizeof(t->key), "%016llx", (unsigned long long)h);
    if (pathf(t->dir, sizeof(t->dir), "%s/templates/%s", c->vm_dir, t->key) < 0 ||
        pathf(path, sizeof(path), "%s/%s", t->dir, "ready") < 0) {
        *why = SF_MSG_VM_DIR_LONG;
        return -ENAMETOOLONG;
    }
    if (stat(path, &st) == 0) {
        wk_qtpl_touch(t);
        return 0;
    }

    /* Not built yet: one builder at a time per host. */
    if (pathf(tmp, sizeof(tmp), "%s/%s", c->vm_dir, "templates") < 0 || mkdir_p(tmp) < 0 ||
        pathf(tmp, sizeof(tmp), "%s/%s", c->vm_dir, "templates/.lock") < 0 ||
        (lock = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644)) < 0) {
        rc = -errno;
        *why = SF_MSG_VM_TEMPLATES_LOCK;
        goto out;
    }
    /* (a build on its own thread looks at its stop while another worker builds) */
    while (flock(lock, ctl ? LOCK_EX | LOCK_NB : LOCK_EX) < 0) {
        struct timespec nap = {0, 100 * 1000 * 1000};
        if (errno == EINTR)
            continue;
        if (errno != EWOULDBLOCK) {
            rc = -errno;
            *why = SF_MSG_VM_TEMPLATES_LOCK;
            goto out;
        }
        if (atomic_load(&ctl->stop)) {
            rc = -ECANCELED;
            *why = "The worker is stopping.";
            goto out;
        }
        nanosleep(&nap, NULL);
    }
    if (stat(path, &st) == 0) { /* another worker built it meanwhile */
        wk_qtpl_touch(t);
        rc = 0;
        goto out;
    }
    prune(c, t);
    if (pathf(tmp, sizeof(tmp), "%s.%s", t->dir, "tmp") < 0) {
        rc = -ENAMETOOLONG;
        *why = SF_MSG_VM_DIR_LONG;
        goto out;
    }
    rmtree_cmd(tmp);
    rmtree_cmd(t->dir);
    if (mkdir(tmp, 0755) < 0) {
        rc = -errno;
        *why = "Cannot create a template directory under vm_dir/templates.";
        goto out;
    }
    {
        char backing[WK_QEMU_PATH_MAX], disk[WK_QEMU_PATH_MAX];
        char *argv[] = {(char *)c->qemu_img, "create", "-q", "-f", "qcow2", "-b", backing,
                        "-F", "raw", disk, NULL};
        if (pathf(backing, sizeof(backing), "%s/%s", t->guest, "rootfs.img") < 0 ||
            pathf(disk, sizeof(disk), "%s/%s", tmp, WK_QTPL_DISK) < 0 ||
            (rc = run(argv, NULL, 0)) < 0) {
            rc = rc < 0 ? rc : -ENAMETOOLONG;
            *why = "qemu-img could not create the template's disk; install qemu-utils.";
            goto out;
        }
    }
    if ((rc = boot_and_save(c, t, tmp, ctl, why)) < 0)
        goto out;
    if (pathf(path, sizeof(path), "%s/%s", tmp, WK_QTPL_RAM) < 0 || (rc = dig_holes(path)) < 0) {
        *why = "Cannot rewrite the template's RAM file sparsely; check vm_dir's free space.";
        goto out;
    }
    if (rename(tmp, t->dir) < 0) {
        rc = -errno;
        *why = "Cannot move the built template into place under vm_dir/templates.";
        goto out;
    }
    {
        char backing[WK_QEMU_PATH_MAX], blank[WK_QEMU_PATH_MAX];
        char *argv[] = {(char *)c->qemu_img, "create", "-q", "-f", "qcow2", "-b", backing,
                        "-F", "qcow2", blank, NULL};
        if (pathf(backing, sizeof(backing), "%s/%s", t->dir, WK_QTPL_DISK) < 0 ||
            pathf(blank, sizeof(blank), "%s/%s", t->dir, WK_QTPL_BLANK) < 0 ||
            (rc = run(argv, NULL, 0)) < 0) {
            rc = rc < 0 ? rc : -ENAMETOOLONG;
            *why = "qemu-img could not create the sandboxes' disk overlay; install qemu-utils.";
            goto out;
        }
    }
    /* The template's disk is now the backing of every sandbox: never written again. */
    if (pathf(path, sizeof(path), "%s/%s", t->dir, WK_QTPL_DISK) == 0)
        chmod(path, 0444);
    if (pathf(path, sizeof(path), "%s/%s", t->dir, "ready") < 0 ||
        (n = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        rc = -errno;
        *why = SF_MSG_TPL_READY_MARK;
        goto out;
    }
    if (write(n, desc, strlen(desc)) < 0 || close(n) < 0) {
        rc = -EIO;
        *why = SF_MSG_TPL_READY_MARK;
        goto out;
    }
    sf_info("msg=\"template snapshot built\" dir=%s ms=%lld", t->dir,
            (long long)(sf_mono_ms() - (int64_t)t0));
    rc = 0;
out:
    if (rc < 0 && pathf(tmp, sizeof(tmp), "%s.%s", t->dir, "tmp") == 0)
        sf_error("msg=\"template snapshot failed; its console and QEMU logs are kept\" dir=%s "
                 "rc=%d why=\"%s\"", tmp, rc, *why ? *why : "");
    if (lock >= 0)
        close(lock);
    return rc;
}
