/* The agent's file requests (fread, fwrite, flist, fmove, fdel): done by pid 1 of the
 * sandbox, in the sandbox's own mount namespace and root, so every path resolves inside
 * it ('..' stops at its root, absolute symlinks and /proc/1/root point into it) and no
 * host path is ever opened on a tenant's behalf.
 *
 * The agent is single-threaded: nothing here may block. Files are opened O_NONBLOCK and
 * must be regular files (a FIFO or a device would stall the loop), directories are read
 * in bounded pages, and each answer fits one frame. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_int.h"

#define ENTRIES_BYTES (900u * 1024) /* an entries answer stays under the frame limit */

static void fail(uint32_t id, int err, const char *what, const char *path)
{
    char msg[SF_AP_MSG_MAX];

    snprintf(msg, sizeof(msg), "%s %.3000s failed: %s.", what, path, strerror(err));
    agent_send_error(id, err, msg);
}

/* Opens path (a regular file) with flags; -errno. A directory gives -EISDIR, anything
 * else that is not a regular file -EINVAL. */
static int open_regular(const char *path, int flags, mode_t mode, struct stat *st)
{
    int fd = open(path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode), e;

    if (fd < 0)
        return -errno;
    if (fstat(fd, st) < 0) {
        e = errno;
        close(fd);
        return -e;
    }
    if (!S_ISREG(st->st_mode)) {
        e = S_ISDIR(st->st_mode) ? EISDIR : EINVAL;
        close(fd);
        return -e;
    }
    return fd;
}

/* mkdir -p of path's parent directories (path itself is left alone). */
static int make_parents(const char *path)
{
    char buf[SF_AP_PATH_MAX + 1];
    size_t n = strlen(path);

    if (n > SF_AP_PATH_MAX)
        return -ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) {
            int e = errno;
            *p = '/';
            return -e;
        }
        *p = '/';
    }
    return 0;
}

static void do_fread(const sf_ap_msg *m)
{
    sf_ap_msg r = {.op = SF_AP_DATA, .id = m->id};
    struct stat st;
    char *buf;
    size_t got = 0;
    int fd = open_regular(m->path, O_RDONLY | ((m->flags & SF_AP_F_NOFOLLOW) ? O_NOFOLLOW : 0),
                          0, &st);

    if (fd < 0) {
        fail(m->id, -fd, "Reading", m->path);
        return;
    }
    if (!(buf = malloc(m->len))) {
        close(fd);
        fail(m->id, ENOMEM, "Reading", m->path);
        return;
    }
    while (got < m->len) {
        ssize_t n = pread(fd, buf + got, m->len - got, (off_t)(m->off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            fail(m->id, e, "Reading", m->path);
            return;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    r.data = buf;
    r.data_len = got;
    r.size = (uint64_t)st.st_size;
    r.mtime = (int64_t)st.st_mtime;
    agent_send(&r);
    free(buf);
}

static void do_fwrite(const sf_ap_msg *m)
{
    sf_ap_msg r = {.op = SF_AP_OK, .id = m->id};
    int flags = O_WRONLY, fd, rc;
    size_t put = 0;
    struct stat st;

    if ((m->flags & SF_AP_F_MKDIRS) && (rc = make_parents(m->path)) < 0) {
        fail(m->id, -rc, "Creating the parent directories of", m->path);
        return;
    }
    if (m->flags & SF_AP_F_CREATE)
        flags |= O_CREAT | O_TRUNC;
    if (m->flags & SF_AP_F_EXCL)
        flags |= O_EXCL | O_NOFOLLOW;
    if ((fd = open_regular(m->path, flags, 0644, &st)) < 0) {
        fail(m->id, -fd, "Writing", m->path);
        return;
    }
    while (put < m->data_len) {
        ssize_t n = pwrite(fd, m->data + put, m->data_len - put, (off_t)(m->off + put));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            fail(m->id, e, "Writing", m->path);
            return;
        }
        put += (size_t)n;
    }
    if (close(fd) < 0) {
        fail(m->id, errno, "Writing", m->path);
        return;
    }
    r.size = m->off + put;
    agent_send(&r);
}

static char type_of(mode_t mode)
{
    return S_ISREG(mode) ? 'f' : S_ISDIR(mode) ? 'd' : S_ISLNK(mode) ? 'l' : 'o';
}

/* One page of a directory: entries off .. off+len in readdir order (the worker sorts). */
static void do_flist(const sf_ap_msg *m)
{
    sf_ap_msg r = {.op = SF_AP_ENTRIES, .id = m->id};
    sf_ap_entry *ents = calloc(m->len, sizeof(*ents));
    char *names = malloc((size_t)m->len * (SF_AP_ENTRY_NAME_MAX + 1));
    size_t n = 0, bytes = 0, used = 0;
    uint64_t skip = m->off;
    struct dirent *e;
    DIR *d = NULL;
    int fd;

    if (!ents || !names) {
        fail(m->id, ENOMEM, "Listing", m->path);
        goto out;
    }
    fd = open(m->path, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || !(d = fdopendir(fd))) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        fail(m->id, err, "Listing", m->path);
        goto out;
    }
    errno = 0;
    while ((e = readdir(d))) {
        struct stat st;
        size_t len = strlen(e->d_name);

        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || len > SF_AP_ENTRY_NAME_MAX)
            continue;
        if (skip > 0) {
            skip--;
            continue;
        }
        if (n == m->len || bytes + len + 40 > ENTRIES_BYTES) {
            r.more = 1;
            break;
        }
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone meanwhile */
        memcpy(names + used, e->d_name, len + 1);
        ents[n].name = names + used;
        ents[n].type = type_of(st.st_mode);
        ents[n].size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
        ents[n].mtime = (int64_t)st.st_mtime;
        used += len + 1;
        bytes += len + 40;
        n++;
    }
    r.entries = ents;
    r.n_entries = n;
    agent_send(&r);
out:
    if (d)
        closedir(d);
    free(ents);
    free(names);
}

static void do_fmove(const sf_ap_msg *m)
{
    sf_ap_msg r = {.op = SF_AP_OK, .id = m->id};

    if (rename(m->path, m->to) < 0) {
        fail(m->id, errno, "Moving", m->path);
        return;
    }
    agent_send(&r);
}

static void do_fdel(const sf_ap_msg *m)
{
    sf_ap_msg r = {.op = SF_AP_OK, .id = m->id};

    if (unlink(m->path) < 0) {
        fail(m->id, errno, "Deleting", m->path);
        return;
    }
    agent_send(&r);
}

void agent_fs_request(const sf_ap_msg *m)
{
    switch (m->op) {
    case SF_AP_FREAD:
        do_fread(m);
        break;
    case SF_AP_FWRITE:
        do_fwrite(m);
        break;
    case SF_AP_FLIST:
        do_flist(m);
        break;
    case SF_AP_FMOVE:
        do_fmove(m);
        break;
    case SF_AP_FDEL:
        do_fdel(m);
        break;
    default:
        agent_send_error(m->id, EINVAL, "The agent cannot do this file request.");
        break;
    }
}
