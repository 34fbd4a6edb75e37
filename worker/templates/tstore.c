/* tstore.c: this host's template store (tstore.h). */
#include "tstore.h"
#include "fs.h"
#include "template.h"
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


extern char **environ;

enum { DEB_MISSING, DEB_BUILDING, DEB_READY, DEB_FAILED };

/* A built-in template built once per host by its script beside sandfleet-worker. */
typedef struct tpl_builtin {
    struct wk_tstore *ts;
    const char *name;            /* "debian", "desktop" */
    const char *version;         /* the stamp in rootfs/etc/sandfleet-template */
    char script[TS_PATH_MAX];    /* tpl/build-<name> beside sandfleet-worker ("" = none) */
    atomic_int state;            /* DEB_* */
    atomic_int pid;              /* the running build script (its own process group), or 0 */
    pthread_t th;
    int th_started;
    time_t failed_at;
} tpl_builtin;
enum { TB_DEBIAN, TB_DESKTOP, TB_N };

struct wk_tstore {
    char dir[TS_PATH_MAX];       /* templates_dir */
    char state_dir[TS_PATH_MAX];
    tpl_builtin bi[TB_N];
    /* the driver's own image of the tree (driver.h tpl_image; NULL: the layers serve) */
    const wk_driver_ops *ops;
    wk_driver *drv;
    unsigned caps;               /* the driver's: WK_CAP_DEBIAN, WK_CAP_DESKTOP */
    atomic_int stopping;
};

static int builtin_root(const tpl_builtin *t, char *buf, size_t n)
{
    int r = snprintf(buf, n, "%s/%s/rootfs", t->ts->dir, t->name);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

/* The tree is there and from today's builder: rootfs/etc/sandfleet-template holds its
 * version (SF_DEBIAN_TEMPLATE_VERSION, SF_DESKTOP_TEMPLATE_VERSION; a cache from an older
 * builder is rebuilt, not trusted). */
static int builtin_present(const tpl_builtin *t)
{
    char p[TS_PATH_MAX], v[32];
    size_t n;
    FILE *f;

    if (snprintf(p, sizeof(p), "%s/%s/rootfs/etc/sandfleet-template", t->ts->dir, t->name) >=
        (int)sizeof(p))
        return 0;
    if (!(f = fopen(p, "re")))
        return 0;
    n = fread(v, 1, sizeof(v) - 1, f);
    fclose(f);
    v[n] = '\0';
    v[strcspn(v, "\n")] = '\0';
    return !strcmp(v, t->version);
}

/* The driver's image of the 'debian' tree (driver.h tpl_image), once the tree is there: 1
 * ready (or none needed), 0 being built (the first call starts it), -errno + why. Any
 * thread. 'desktop' has none (jail only). */
static int builtin_image(tpl_builtin *t, const char **why)
{
    wk_tstore *ts = t->ts;
    char root[TS_PATH_MAX];

    *why = NULL;
    if (t != &ts->bi[TB_DEBIAN] || !ts->ops || !ts->ops->tpl_image)
        return 1;
    if (atomic_load(&ts->stopping))
        return -ESHUTDOWN;
    if (builtin_root(t, root, sizeof(root)) < 0)
        return -ENAMETOOLONG;
    return ts->ops->tpl_image(ts->drv, t->name, root, why);
}

/* The build thread: runs the script (which holds the host-wide lock) and waits for it. */
static void *builtin_build(void *arg)
{
    tpl_builtin *t = arg;
    char *argv[] = {t->script, t->ts->dir, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    pid_t pid;
    int status = 0, rc;
    struct timespec t0, t1;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP); /* its own group: stopped whole */
    posix_spawnattr_setpgroup(&at, 0);
    rc = posix_spawn(&pid, t->script, &fa, &at, argv, environ);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    if (rc == 0) {
        atomic_store(&t->pid, (int)pid);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        atomic_store(&t->pid, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (builtin_present(t)) {
        const char *why;
        sf_info("msg=\"template ready\" template=%s dir=%s s=%lld", t->name, t->ts->dir,
                (long long)(t1.tv_sec - t0.tv_sec));
        atomic_store(&t->state, DEB_READY);
        builtin_image(t, &why); /* the driver's image of it starts now (qemu) */
    } else {
        sf_error("msg=\"building a built-in template failed; its log is "
                 "templates_dir/%s/build.log\" template=%s script=%s rc=%d status=%d",
                 t->name, t->name, t->script, rc, status);
        atomic_store(&t->state, DEB_FAILED);
    }
    return NULL;
}

/* Starts the build unless one runs; the loop thread only. */
static void builtin_start(tpl_builtin *t)
{
    if (!t->script[0] || atomic_load(&t->state) == DEB_BUILDING)
        return;
    if (t->th_started) {
        pthread_join(t->th, NULL); /* the previous build ended */
        t->th_started = 0;
    }
    atomic_store(&t->state, DEB_BUILDING);
    if (pthread_create(&t->th, NULL, builtin_build, t) != 0) {
        atomic_store(&t->state, DEB_FAILED);
        return;
    }
    t->th_started = 1;
    sf_info("msg=\"building the %s template (a few minutes, once per host)\" dir=%s", t->name,
            t->ts->dir);
}

/* tpl/build-<name> beside sandfleet-worker (the build copies it there). */
static void find_script(tpl_builtin *t)
{
    ssize_t len = readlink("/proc/self/exe", t->script, sizeof(t->script) - 32);
    char *slash;

    if (len <= 0) {
        t->script[0] = '\0';
        return;
    }
    t->script[len] = '\0';
    if (!(slash = strrchr(t->script, '/')))
        return;
    snprintf(slash + 1, 32, "tpl/build-%s", t->name);
    if (access(t->script, X_OK) < 0)
        t->script[0] = '\0';
}

/* '1' ready, 'b' being built here, '0' absent (or failed); any thread. */
static char builtin_state(tpl_builtin *t)
{
    int st = atomic_load(&t->state), rc;
    const char *why;

    /* on disk, each heartbeat: a template another worker of the host (or an operator)
     * built is ready within one beat */
    if (st != DEB_READY && st != DEB_BUILDING && builtin_present(t)) {
        atomic_store(&t->state, DEB_READY);
        st = DEB_READY;
    }
    if (st == DEB_READY && (rc = builtin_image(t, &why)) != 1) /* the driver's image */
        return rc == 0 ? 'b' : '0';
    return st == DEB_READY ? '1' : st == DEB_BUILDING ? 'b' : '0';
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
    ts->caps = ops ? ops->caps : 0;
    atomic_init(&ts->stopping, 0);
    ts->bi[TB_DEBIAN] = (tpl_builtin){.ts = ts, .name = "debian",
                                      .version = SF_DEBIAN_TEMPLATE_VERSION};
    ts->bi[TB_DESKTOP] = (tpl_builtin){.ts = ts, .name = "desktop",
                                       .version = SF_DESKTOP_TEMPLATE_VERSION};
    for (int i = 0; i < TB_N; i++) {
        find_script(&ts->bi[i]);
        atomic_init(&ts->bi[i].state, builtin_present(&ts->bi[i]) ? DEB_READY : DEB_MISSING);
        atomic_init(&ts->bi[i].pid, 0);
    }
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
    /* 'debian' is built at start-up; 'desktop' (large) on its first create */
    if (build_debian && atomic_load(&ts->bi[TB_DEBIAN].state) == DEB_MISSING)
        builtin_start(&ts->bi[TB_DEBIAN]);
    if (atomic_load(&ts->bi[TB_DEBIAN].state) == DEB_READY) {
        const char *why;
        builtin_image(&ts->bi[TB_DEBIAN], &why); /* the driver's image of a tree there (qemu) */
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
    for (int i = 0; i < TB_N; i++)
        if ((pid = atomic_load(&ts->bi[i].pid)) > 0)
            kill(-pid, SIGTERM);
    for (int i = 0; i < TB_N; i++)
        if (ts->bi[i].th_started)
            pthread_join(ts->bi[i].th, NULL);
    free(ts);
}

int wk_tstore_debian_ready(wk_tstore *ts)
{
    return wk_tstore_debian_state(ts) == '1';
}

char wk_tstore_debian_state(wk_tstore *ts)
{
    return builtin_state(&ts->bi[TB_DEBIAN]);
}

char wk_tstore_desktop_state(wk_tstore *ts)
{
    if (!(ts->caps & WK_CAP_DESKTOP))
        return '0';
    return builtin_state(&ts->bi[TB_DESKTOP]);
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
        if (!strcmp(cur, "debian") || !strcmp(cur, "desktop")) {
            tpl_builtin *t = &ts->bi[!strcmp(cur, "debian") ? TB_DEBIAN : TB_DESKTOP];
            if (t == &ts->bi[TB_DESKTOP] && !(ts->caps & WK_CAP_DESKTOP)) {
                snprintf(why, whylen, "The 'desktop' template runs only on hosts with the jail "
                         "driver; create it where one runs, or use 'debian'.");
                return -ENOTSUP;
            }
            st = atomic_load(&t->state);
            if (st != DEB_READY && builtin_present(t))
                st = DEB_READY; /* another worker of this host built it */
            if (st == DEB_READY) {
                const char *iwhy;
                int img;
                atomic_store(&t->state, DEB_READY);
                if ((img = builtin_image(t, &iwhy)) != 1) { /* qemu: its guest image */
                    snprintf(why, whylen, "%s", img < 0 && iwhy ? iwhy
                             : "The 'debian' template's guest image is still being built on "
                               "this host (a few minutes, once); retry sandbox_create in a "
                               "minute.");
                    return -EAGAIN;
                }
                rc = builtin_root(t, dir, sizeof(dir)) < 0 ? -ENAMETOOLONG : push(out, &n, dir);
                break;
            }
            if (st == DEB_MISSING || (st == DEB_FAILED && time(NULL) - t->failed_at > WK_TPL_RETRY_S)) {
                t->failed_at = time(NULL);
                builtin_start(t);
            }
            wk_tstore_layers_free(out);
            if (!t->script[0]) {
                snprintf(why, whylen, "The '%s' template is not on this host and its builder "
                         "(tpl/build-%s beside sandfleet-worker) is missing; reinstall the "
                         "worker, or use from_template 'base'.", t->name, t->name);
                return -ENOENT;
            }
            if (atomic_load(&t->state) == DEB_FAILED)
                snprintf(why, whylen, "The '%s' template could not be built on this host (its "
                         "log: templates_dir/%s/build.log); use 'base', or retry in 10 "
                         "minutes.", t->name, t->name);
            else
                snprintf(why, whylen, "The '%s' template is still being built on this host (a "
                         "few minutes, once); retry sandbox_create in a minute.", t->name);
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
    if (name && !strcmp(name, "desktop")) { /* its display, panel and live view */
        if (!(*start = strdup(WK_DESKTOP_START)) || !(*ready = strdup(WK_DESKTOP_READY))) {
            free(*start);
            *start = NULL;
            return -ENOMEM;
        }
        return 0;
    }
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
