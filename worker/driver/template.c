/* The base template: a busybox root filesystem, built once per host under
 * state_dir/templates/base/rootfs and shared read-only (overlay lower layer)
 * by every sandbox. Its files belong to host root, which no sandbox maps, so
 * inside a sandbox they show as nobody and cannot be changed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs.h"
#include "template.h"
#include "sf_buf.h"
#include "sf_util.h"
#include "sf_msg.h"

#define BUSYBOX "/bin/busybox"
#define TEMPLATE_SUB "/templates/base"
/* Written last into a build; a rootfs without this exact stamp was built by an older
 * worker and is rebuilt (the old one moved aside: running sandboxes still use it).
 * Bump when what a build holds changes. */
#define STAMP_PATH "etc/sandfleet-base"
#define STAMP "sandfleet-base 2 (busybox + nohup, disown)\n"

extern char **environ;

int wk_template_path(const char *state_dir, char *buf, size_t n)
{
    int r = snprintf(buf, n, "%s" TEMPLATE_SUB "/rootfs", state_dir);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

static int write_file(int dfd, const char *name, const char *text, mode_t mode)
{
    size_t len = strlen(text);
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    ssize_t w;

    if (fd < 0)
        return -errno;
    w = write(fd, text, len);
    if (w != (ssize_t)len || fchmod(fd, mode) < 0) {
        int e = w < 0 ? errno : EIO;
        close(fd);
        return -e;
    }
    return close(fd) < 0 ? -errno : 0;
}

static int copy_file(const char *src, int dfd, const char *name, mode_t mode)
{
    char buf[65536];
    int in, out, rc = 0;
    ssize_t n;

    if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    out = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (out < 0) {
        rc = -errno;
        close(in);
        return rc;
    }
    while ((n = read(in, buf, sizeof(buf))) > 0)
        if (write(out, buf, (size_t)n) != n) {
            rc = -EIO;
            break;
        }
    if (n < 0)
        rc = -errno;
    if (rc == 0 && fchmod(out, mode) < 0)
        rc = -errno;
    close(in);
    if (close(out) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* Runs `busybox --list-full` (one process, at build time only). */
static int busybox_applets(sf_buf *out)
{
    char *argv[] = {BUSYBOX, "--list-full", NULL};
    posix_spawn_file_actions_t fa;
    char buf[4096];
    int p[2], status, rc = 0;
    pid_t pid;
    ssize_t n;

    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    rc = -posix_spawn(&pid, BUSYBOX, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc < 0) {
        close(p[0]);
        return rc;
    }
    while ((n = read(p[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR))
        if (n > 0 && rc == 0)
            rc = sf_buf_append(out, buf, (size_t)n);
    close(p[0]);
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -ENOEXEC;
    return rc;
}

/* Only plain applet paths in the usual directories become links. */
static int applet_path_ok(const char *s)
{
    static const char *const dirs[] = {"bin/", "sbin/", "usr/bin/", "usr/sbin/"};
    const char *name = NULL;

    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        if (!strncmp(s, dirs[i], strlen(dirs[i])))
            name = s + strlen(dirs[i]);
    if (!name || !*name || !strcmp(name, "busybox"))
        return 0;
    for (const char *c = name; *c; c++)
        if (*c == '/' || *c == ' ' || (*c == '.' && (c == name)))
            return 0;
    return 1;
}

static int link_applets(int rootfd)
{
    sf_buf list;
    char *line, *nl;
    int rc;

    sf_buf_init(&list, 1 << 20);
    if ((rc = busybox_applets(&list)) < 0 || !list.p)
        goto out;
    for (line = list.p; *line; line = nl + 1) {
        if (!(nl = strchr(line, '\n')))
            break; /* every line ends with \n; a cut one is skipped */
        *nl = '\0';
        if (!applet_path_ok(line))
            continue;
        if (symlinkat(BUSYBOX, rootfd, line) < 0 && errno != EEXIST) {
            rc = -errno;
            goto out;
        }
    }
out:
    sf_buf_fini(&list);
    return rc;
}

static const struct {
    const char *path;
    mode_t mode;
} template_dirs[] = {
    /* Directories are 0755 (root/ too): the overlay looks them up with the
     * sandbox's credentials; the sandbox's own root/, tmp/, home/ and run/
     * are created per sandbox in the upper layer (jail_fs.c). */
    {"bin", 0755},  {"sbin", 0755}, {"usr", 0755},  {"usr/bin", 0755}, {"usr/sbin", 0755},
    {"etc", 0755},  {"root", 0755}, {"tmp", 01777}, {"proc", 0755},    {"dev", 0755},
    {"sys", 0755},  {"run", 0755},  {"home", 0755}, {"var", 0755},     {"var/tmp", 01777},
    {"mnt", 0755},
};

static const struct {
    const char *path;
    const char *text;
    mode_t mode;
} template_files[] = {
    {"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", 0644},
    {"etc/group", "root:x:0:\nnogroup:x:65534:\n", 0644},
    {"etc/hostname", "sandbox\n", 0644},
    {"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost\n", 0644},
    {"etc/profile", "export PS1='\\h:\\w\\$ '\n", 0644},
    {"sbin/sandfleet-agent", "", 0755}, /* bind-mount target */
    /* busybox-static has no nohup applet, and ash no disown builtin: without these,
     * `nohup CMD &` and `CMD & disown` fail with "not found" (issue 20). */
    {"usr/bin/nohup",
     "#!/bin/sh\n"
     "# nohup for the busybox template: ignore SIGHUP, then run the command.\n"
     "if [ $# -eq 0 ]; then echo 'Usage: nohup COMMAND [ARG]...' >&2; exit 125; fi\n"
     "trap '' HUP\n"
     "if [ -t 1 ]; then exec >>nohup.out; echo 'nohup: appending output to nohup.out' >&2; fi\n"
     "if [ -t 2 ]; then exec 2>&1; fi\n"
     "exec \"$@\"\n",
     0755},
    {"usr/bin/disown",
     "#!/bin/sh\n"
     "# disown for the busybox template: background jobs already outlive the command\n"
     "# (the sandbox's agent never signals them), so there is nothing to detach.\n"
     "exit 0\n",
     0755},
};

static int build(const char *dir, const char **why)
{
    int fd, rc;

    if (mkdir(dir, 0755) < 0 || chmod(dir, 0755) < 0) {
        *why = "Cannot create the template directory under state_dir; check that it is writable.";
        return -errno;
    }
    if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    for (size_t i = 0; i < sizeof(template_dirs) / sizeof(template_dirs[0]); i++)
        if (mkdirat(fd, template_dirs[i].path, 0755) < 0 ||
            fchmodat(fd, template_dirs[i].path, template_dirs[i].mode, 0) < 0) {
            rc = -errno;
            *why = "Cannot create the template's directories; check state_dir.";
            goto out;
        }
    if ((rc = copy_file(BUSYBOX, fd, "bin/busybox", 0755)) < 0) {
        *why = "Cannot copy /bin/busybox into the template; install busybox-static.";
        goto out;
    }
    for (size_t i = 0; i < sizeof(template_files) / sizeof(template_files[0]); i++)
        if ((rc = write_file(fd, template_files[i].path, template_files[i].text,
                             template_files[i].mode)) < 0) {
            *why = SF_MSG_TPL_FILES;
            goto out;
        }
    if ((rc = link_applets(fd)) < 0) {
        *why = "Cannot list busybox applets (/bin/busybox --list-full); install busybox-static.";
        goto out;
    }
    if ((rc = write_file(fd, STAMP_PATH, STAMP, 0644)) < 0) {
        *why = SF_MSG_TPL_FILES;
        goto out;
    }
    rc = 0;
out:
    close(fd);
    return rc;
}

/* True when root holds this version's stamp. */
static int stamp_ok(const char *root)
{
    char path[WK_PATH_MAX], buf[sizeof(STAMP) + 1];
    ssize_t n;
    int fd, r = snprintf(path, sizeof(path), "%s/" STAMP_PATH, root);

    if (r < 0 || (size_t)r >= sizeof(path) ||
        (fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
        return 0;
    n = read(fd, buf, sizeof(buf));
    close(fd);
    return n == (ssize_t)(sizeof(STAMP) - 1) && !memcmp(buf, STAMP, sizeof(STAMP) - 1);
}

int wk_template_ensure(const char *state_dir, const char **why)
{
    char root[WK_PATH_MAX], tmp[WK_PATH_MAX], sh[WK_PATH_MAX];
    struct stat st;
    int rc, n, older;

    if (wk_template_path(state_dir, root, sizeof(root)) < 0)
        goto toolong;
    n = snprintf(sh, sizeof(sh), "%s/bin/sh", root);
    if (n < 0 || (size_t)n >= sizeof(sh))
        goto toolong;
    older = lstat(sh, &st) == 0;
    if (older && stamp_ok(root))
        return 0;
    if (access(BUSYBOX, X_OK) < 0) {
        *why = "The jail template needs a static busybox at /bin/busybox; install busybox-static.";
        return -ENOENT;
    }
    n = snprintf(tmp, sizeof(tmp), "%s.tmp-%d", root, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof(tmp))
        goto toolong;
    n = snprintf(sh, sizeof(sh), "%s" TEMPLATE_SUB, state_dir);
    if (n < 0 || (size_t)n >= sizeof(sh))
        goto toolong;
    if ((rc = wk_mkdir_p(sh, 0755)) < 0) {
        *why = "Cannot create state_dir/templates/base; check that state_dir is writable by the worker.";
        return rc;
    }
    wk_rmtree(tmp);
    if ((rc = build(tmp, why)) < 0) {
        wk_rmtree(tmp);
        return rc;
    }
    if (older) {
        /* An older build: moved aside, not removed (sandboxes running on it keep it as
         * their lower layer). */
        char old[WK_PATH_MAX];
        n = snprintf(old, sizeof(old), "%s.old-%d", root, (int)getpid());
        if (n < 0 || (size_t)n >= sizeof(old) || (rename(root, old) < 0 && errno != ENOENT)) {
            wk_rmtree(tmp);
            *why = "Cannot move the older base template aside; check state_dir.";
            return -EIO;
        }
    }
    if (rename(tmp, root) < 0) {
        rc = -errno;
        wk_rmtree(tmp);
        if (rc == -EEXIST || rc == -ENOTEMPTY)
            return 0; /* another worker built it first */
        *why = "Cannot move the built template into place; check state_dir.";
        return rc;
    }
    return 0;
toolong:
    *why = SF_MSG_STATE_DIR_LONG;
    return -ENAMETOOLONG;
}

void wk_template_cleanup(const char *state_dir)
{
    char dir[WK_PATH_MAX], path[WK_PATH_MAX];
    struct dirent *e;
    DIR *d;
    int n = snprintf(dir, sizeof(dir), "%s" TEMPLATE_SUB, state_dir);

    if (n < 0 || (size_t)n >= sizeof(dir) || !(d = opendir(dir)))
        return;
    while ((e = readdir(d))) {
        int64_t pid;
        if (strncmp(e->d_name, "rootfs.tmp-", 11) != 0 ||
            sf_parse_i64(e->d_name + 11, 1, INT32_MAX, &pid) < 0)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* its builder still runs */
        n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (n > 0 && (size_t)n < sizeof(path))
            wk_rmtree(path);
    }
    closedir(d);
}
