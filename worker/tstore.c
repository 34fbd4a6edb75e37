/* tstore.c: this host's template store (tstore.h). */
#include "tstore.h"
#include "sf_log.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TS_PATH_MAX 4096

/* template.c, jail_fs.c (declared in jail_int.h) */
int wk_template_path(const char *state_dir, char *buf, size_t n);
int wk_rmtree(const char *path);
int wk_mkdir_p(const char *path, mode_t mode);

extern char **environ;

enum { DEB_MISSING, DEB_BUILDING, DEB_READY, DEB_FAILED };

struct wk_tstore {
    char dir[TS_PATH_MAX];       /* templates_dir */
    char state_dir[TS_PATH_MAX];
    char script[TS_PATH_MAX];    /* tpl/build-debian beside sandfleet-worker ("" = none) */
    atomic_int debian;           /* DEB_* */
    atomic_int pid;              /* the running build script (its own process group), or 0 */
    pthread_t th;
    int th_started;
    time_t failed_at;
    /* the driver's own image of the tree (driver.h tpl_image; NULL: the layers serve) */
    const wk_driver_ops *ops;
    wk_driver *drv;
    atomic_int stopping;
};

static int debian_root(const wk_tstore *ts, char *buf, size_t n)
{
    int r = snprintf(buf, n, "%s/debian/rootfs", ts->dir);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

/* The tree is there and from today's builder: rootfs/etc/sandfleet-template holds
 * SF_DEBIAN_TEMPLATE_VERSION (a cache from an older builder is rebuilt, not trusted). */
static int debian_present(const wk_tstore *ts)
{
    char p[TS_PATH_MAX], v[32];
    size_t n;
    FILE *f;

    if (snprintf(p, sizeof(p), "%s/debian/rootfs/etc/sandfleet-template", ts->dir) >=
        (int)sizeof(p))
        return 0;
    if (!(f = fopen(p, "re")))
        return 0;
    n = fread(v, 1, sizeof(v) - 1, f);
    fclose(f);
    v[n] = '\0';
    v[strcspn(v, "\n")] = '\0';
    return !strcmp(v, SF_DEBIAN_TEMPLATE_VERSION);
}

/* The driver's image of the tree (driver.h tpl_image), once the tree is there: 1 ready
 * (or none needed), 0 being built (the first call starts it), -errno + why. Any thread. */
static int debian_image(wk_tstore *ts, const char **why)
{
    char root[TS_PATH_MAX];

    *why = NULL;
    if (!ts->ops || !ts->ops->tpl_image)
        return 1;
    if (atomic_load(&ts->stopping))
        return -ESHUTDOWN;
    if (debian_root(ts, root, sizeof(root)) < 0)
        return -ENAMETOOLONG;
    return ts->ops->tpl_image(ts->drv, "debian", root, why);
}

/* The build thread: runs the script (which holds the host-wide lock) and waits for it. */
static void *debian_build(void *arg)
{
    wk_tstore *ts = arg;
    char *argv[] = {ts->script, ts->dir, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    pid_t pid;
    int status = 0, rc;

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP); /* its own group: stopped whole */
    posix_spawnattr_setpgroup(&at, 0);
    rc = posix_spawn(&pid, ts->script, &fa, &at, argv, environ);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    if (rc == 0) {
        atomic_store(&ts->pid, (int)pid);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        atomic_store(&ts->pid, 0);
    }
    if (debian_present(ts)) {
        const char *why;
        sf_info("msg=\"template ready\" template=debian dir=%s", ts->dir);
        atomic_store(&ts->debian, DEB_READY);
        debian_image(ts, &why); /* the driver's image of it starts now (qemu) */
    } else {
        sf_error("msg=\"building the debian template failed; its log is "
                 "templates_dir/debian/build.log\" script=%s rc=%d status=%d",
                 ts->script, rc, status);
        atomic_store(&ts->debian, DEB_FAILED);
    }
    return NULL;
}

/* Starts the build unless one runs; the loop thread only. */
static void debian_start(wk_tstore *ts)
{
    if (!ts->script[0] || atomic_load(&ts->debian) == DEB_BUILDING)
        return;
    if (ts->th_started) {
        pthread_join(ts->th, NULL); /* the previous build ended */
        ts->th_started = 0;
    }
    atomic_store(&ts->debian, DEB_BUILDING);
    if (pthread_create(&ts->th, NULL, debian_build, ts) != 0) {
        atomic_store(&ts->debian, DEB_FAILED);
        return;
    }
    ts->th_started = 1;
    sf_info("msg=\"building the debian template (debootstrap; a few minutes)\" dir=%s", ts->dir);
}

/* tpl/build-debian beside sandfleet-worker (the build copies it there). */
static void find_script(wk_tstore *ts)
{
    ssize_t len = readlink("/proc/self/exe", ts->script, sizeof(ts->script) - 32);
    char *slash;

    if (len <= 0) {
        ts->script[0] = '\0';
        return;
    }
    ts->script[len] = '\0';
    if (!(slash = strrchr(ts->script, '/')))
        return;
    snprintf(slash + 1, 32, "tpl/build-debian");
    if (access(ts->script, X_OK) < 0)
        ts->script[0] = '\0';
}

int wk_tstore_new(const char *templates_dir, const char *state_dir, const wk_driver_ops *ops,
                  wk_driver *drv, wk_tstore **out)
{
    int build_debian = ops && (ops->caps & WK_CAP_DEBIAN);
    wk_tstore *ts;

    if (!templates_dir || templates_dir[0] != '/' || !state_dir ||
        strlen(templates_dir) > 1024 || strlen(state_dir) > 1024)
        return -EINVAL;
    if (!(ts = calloc(1, sizeof(*ts))))
        return -ENOMEM;
    snprintf(ts->dir, sizeof(ts->dir), "%s", templates_dir);
    snprintf(ts->state_dir, sizeof(ts->state_dir), "%s", state_dir);
    ts->ops = build_debian ? ops : NULL;
    ts->drv = drv;
    atomic_init(&ts->stopping, 0);
    find_script(ts);
    {
        /* builds a killed worker left half-done (tpl_build.c): their copies go */
        char pat[TS_PATH_MAX + 64];
        glob_t g;
        snprintf(pat, sizeof(pat), "%s/templates/team/*/*/rootfs.tmp-*", ts->state_dir);
        if (glob(pat, GLOB_NOSORT, NULL, &g) == 0) {
            for (size_t i = 0; i < g.gl_pathc; i++)
                wk_rmtree(g.gl_pathv[i]);
            globfree(&g);
        }
        /* ...and deleted templates it had not removed yet */
        snprintf(pat, sizeof(pat), "%s/templates/trash", ts->state_dir);
        wk_rmtree(pat);
    }
    atomic_init(&ts->debian, debian_present(ts) ? DEB_READY : DEB_MISSING);
    if (build_debian && atomic_load(&ts->debian) == DEB_MISSING)
        debian_start(ts);
    if (atomic_load(&ts->debian) == DEB_READY) {
        const char *why;
        debian_image(ts, &why); /* the driver's image of a tree already there (qemu) */
    }
    *out = ts;
    return 0;
}

void wk_tstore_free(wk_tstore *ts)
{
    int pid;

    if (!ts)
        return;
    atomic_store(&ts->stopping, 1); /* (before the driver goes: no more tpl_image calls) */
    /* A build still running is stopped (the next one starts over): shutdown never waits
     * for debootstrap. */
    if ((pid = atomic_load(&ts->pid)) > 0)
        kill(-pid, SIGTERM);
    if (ts->th_started)
        pthread_join(ts->th, NULL);
    free(ts);
}

int wk_tstore_debian_ready(wk_tstore *ts)
{
    return wk_tstore_debian_state(ts) == '1';
}

char wk_tstore_debian_state(wk_tstore *ts)
{
    int st = atomic_load(&ts->debian), rc;
    const char *why;

    /* on disk, each heartbeat: a template another worker of the host (or an operator)
     * built is ready within one beat */
    if (st != DEB_READY && st != DEB_BUILDING && debian_present(ts)) {
        atomic_store(&ts->debian, DEB_READY);
        st = DEB_READY;
    }
    if (st == DEB_READY && (rc = debian_image(ts, &why)) != 1) /* the driver's image */
        return rc == 0 ? 'b' : '0';
    return st == DEB_READY ? '1' : st == DEB_BUILDING ? 'b' : '0';
}

int wk_tstore_team_dir(const wk_tstore *ts, const char *team, const char *name, char *buf,
                       size_t n)
{
    int r = snprintf(buf, n, "%s/templates/team/%s/%s", ts->state_dir, team, name);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

void wk_tstore_layers_free(char *l[WK_LAYERS_MAX + 1])
{
    for (int i = 0; i <= WK_LAYERS_MAX && l[i]; i++) {
        free(l[i]);
        l[i] = NULL;
    }
}

static int push(char *out[WK_LAYERS_MAX + 1], int *n, const char *dir)
{
    if (*n == WK_LAYERS_MAX)
        return -E2BIG;
    if (!(out[*n] = strdup(dir)))
        return -ENOMEM;
    out[++*n] = NULL;
    return 0;
}

int wk_tstore_layers(wk_tstore *ts, const char *team, const char *name,
                     char *out[WK_LAYERS_MAX + 1], char *why, size_t whylen)
{
    char dir[TS_PATH_MAX];
    const char *cur = name && name[0] ? name : "base";
    int n = 0, rc = 0, st;

    out[0] = NULL;
    do {
        if (!strcmp(cur, "base"))
            return 0; /* the driver's own */
        if (!strcmp(cur, "debian")) {
            st = atomic_load(&ts->debian);
            if (st != DEB_READY && debian_present(ts))
                st = DEB_READY; /* another worker of this host built it */
            if (st == DEB_READY) {
                const char *iwhy;
                int img;
                atomic_store(&ts->debian, DEB_READY);
                if ((img = debian_image(ts, &iwhy)) != 1) { /* qemu: its guest image */
                    snprintf(why, whylen, "%s", img < 0 && iwhy ? iwhy
                             : "The 'debian' template's guest image is still being built on "
                               "this host (a few minutes, once); retry sandbox_create in a "
                               "minute.");
                    return -EAGAIN;
                }
                rc = debian_root(ts, dir, sizeof(dir)) < 0 ? -ENAMETOOLONG : push(out, &n, dir);
                break;
            }
            if (st == DEB_MISSING || (st == DEB_FAILED && time(NULL) - ts->failed_at > WK_TPL_RETRY_S)) {
                ts->failed_at = time(NULL);
                debian_start(ts);
            }
            wk_tstore_layers_free(out);
            if (!ts->script[0]) {
                snprintf(why, whylen, "The 'debian' template is not on this host and its builder "
                         "(tpl/build-debian beside sandfleet-worker) is missing; reinstall the "
                         "worker, or use from_template 'base'.");
                return -ENOENT;
            }
            snprintf(why, whylen, atomic_load(&ts->debian) == DEB_FAILED
                     ? "The 'debian' template could not be built on this host (its log: "
                       "templates_dir/debian/build.log); use 'base', or retry in 10 minutes."
                     : "The 'debian' template is still being built on this host (a few "
                       "minutes, once); retry sandbox_create in a minute.");
            return -EAGAIN;
        }
        /* a team's: one whole root filesystem (tpl_build.c) */
        if (wk_tstore_team_dir(ts, team, cur, dir, sizeof(dir) - 8) < 0) {
            rc = -ENAMETOOLONG;
            break;
        }
        memcpy(dir + strlen(dir), "/rootfs", 8);
        if (access(dir, F_OK) < 0) {
            snprintf(why, whylen, "Template '%.63s' does not exist on this host; list your "
                     "templates with sandbox_template_list.", name);
            return -ENOENT;
        }
        rc = push(out, &n, dir);
    } while (0);
    if (rc < 0) {
        wk_tstore_layers_free(out);
        snprintf(why, whylen, "Template '%.63s' cannot be used on this host (%s); build it "
                 "again under another name.", name, strerror(-rc));
    }
    return rc;
}

int wk_tstore_service(wk_tstore *ts, const char *team, const char *name, char **start,
                      char **ready)
{
    char path[TS_PATH_MAX];
    const char *s, *r;
    json_t *j;
    size_t len;

    *start = *ready = NULL;
    if (!name || !strcmp(name, "base") || !strcmp(name, "debian"))
        return 0;
    if (wk_tstore_team_dir(ts, team, name, path, sizeof(path) - 16) < 0)
        return -ENOENT;
    len = strlen(path);
    snprintf(path + len, sizeof(path) - len, "/" WK_TSTORE_SERVICE);
    /* a few KiB at most (the schema bounds both commands to 4 KiB) */
    if (!(j = json_load_file(path, JSON_REJECT_DUPLICATES, NULL)))
        return access(path, F_OK) == 0 ? 0 : -ENOENT;
    s = json_string_value(json_object_get(j, "start_cmd"));
    r = json_string_value(json_object_get(j, "ready_cmd"));
    if ((s && *s && !(*start = strdup(s))) || (r && *r && !(*ready = strdup(r)))) {
        free(*start);
        *start = NULL;
        json_decref(j);
        return -ENOMEM;
    }
    json_decref(j);
    return 0;
}

int wk_tstore_trash_path(const wk_tstore *ts, const char *id, char *buf, size_t n)
{
    int r = snprintf(buf, n, "%s/templates/trash", ts->state_dir), rc;

    if (r < 0 || (size_t)r >= n)
        return -ENAMETOOLONG;
    if ((rc = wk_mkdir_p(buf, 0700)) < 0)
        return rc;
    r = snprintf(buf, n, "%s/templates/trash/%s", ts->state_dir, id);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}
