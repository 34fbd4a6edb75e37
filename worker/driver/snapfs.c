/* snapfs.c: copying and measuring a snapshot's files (snapfs.h). */
#include "snapfs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int wk_snap_copy(const char *from, const char *to)
{
    char *argv[] = {"cp", "-a", "--sparse=always", "--", (char *)from, (char *)to, NULL};
    int status = 0, rc;
    pid_t pid;

    if ((rc = posix_spawnp(&pid, "cp", NULL, NULL, argv, environ)) != 0)
        return -rc;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

static uint64_t bytes_sum, files_sum; /* nftw has no argument: under bytes_mu */
static pthread_mutex_t bytes_mu = PTHREAD_MUTEX_INITIALIZER;

static int add_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)path;
    (void)flag;
    (void)ftw;
    bytes_sum += (uint64_t)st->st_blocks * 512u;
    files_sum++;
    return 0;
}

uint64_t wk_snap_measure(const char *root, uint64_t *files)
{
    uint64_t n;

    pthread_mutex_lock(&bytes_mu);
    bytes_sum = files_sum = 0;
    nftw(root, add_one, 32, FTW_PHYS | FTW_MOUNT);
    n = bytes_sum;
    if (files)
        *files = files_sum;
    pthread_mutex_unlock(&bytes_mu);
    return n;
}

uint64_t wk_snap_bytes(const char *root)
{
    return wk_snap_measure(root, NULL);
}

int wk_snap_meta_write(const char *dir, const char *driver, const char *words)
{
    char path[4200];
    FILE *f;
    int rc;

    if (snprintf(path, sizeof(path), "%s/" WK_SNAP_META, dir) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    if (!(f = fopen(path, "wxe")))
        return -errno;
    rc = fprintf(f, "%s %s\n", driver, words) < 0 ? -EIO : 0;
    if (fclose(f) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

int wk_snap_meta_read(const char *dir, const char *driver, char *buf, size_t n)
{
    char path[4200], line[512];
    size_t dl = strlen(driver), len;
    FILE *f;

    if (snprintf(path, sizeof(path), "%s/" WK_SNAP_META, dir) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    if (!(f = fopen(path, "re")))
        return -errno;
    if (!fgets(line, sizeof(line), f)) {
        fclose(f);
        return -EIO;
    }
    fclose(f);
    len = strcspn(line, "\n");
    line[len] = '\0';
    if (strncmp(line, driver, dl) != 0 || line[dl] != ' ')
        return -ESTALE;
    if (len - dl - 1 >= n)
        return -ENAMETOOLONG;
    memcpy(buf, line + dl + 1, len - dl);
    return 0;
}
