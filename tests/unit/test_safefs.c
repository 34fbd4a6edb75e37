/* worker/safefs.c: host-side access inside a tenant-writable tree, in both resolution
 * modes (openat2 RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS, and the O_NOFOLLOW walk the
 * worker takes where the kernel has no openat2). Each case runs in a fresh tree under
 * /tmp built the way a tenant would: links out by absolute path, by ../.., through a
 * directory link in the middle, to magic links in /proc, and a FIFO. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "safefs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct tree {
    int mode;
    char dir[64];  /* the tenant's tree */
    char host[96]; /* a host file outside it */
    int root;
} tree;

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void at(char *out, size_t n, const tree *t, const char *rel)
{
    snprintf(out, n, "%s/%s", t->dir, rel);
}

static int setup(void **state, int mode)
{
    tree *t = calloc(1, sizeof(*t));
    char p[256];

    t->mode = mode;
    snprintf(t->dir, sizeof(t->dir), "/tmp/sfs-test-XXXXXX");
    if (!mkdtemp(t->dir))
        return -1;
    snprintf(t->host, sizeof(t->host), "%s.host", t->dir);
    put(t->host, "HOST-SECRET\n");
    at(p, sizeof(p), t, "etc");
    mkdir(p, 0755);
    at(p, sizeof(p), t, "etc/ssl");
    mkdir(p, 0755);
    at(p, sizeof(p), t, "etc/ssl/certs");
    mkdir(p, 0755);
    at(p, sizeof(p), t, "etc/ssl/certs/real.crt");
    put(p, "TENANT-CA\n");
    t->root = wk_sfs_root(t->dir);
    *state = t;
    return t->root < 0 ? -1 : 0;
}

static int setup_openat2(void **state) { return setup(state, WK_SFS_OPENAT2); }
static int setup_walk(void **state) { return setup(state, WK_SFS_WALK); }

static int teardown(void **state)
{
    tree *t = *state;
    wk_sfs_rm_contents(t->root, 64);
    close(t->root);
    rmdir(t->dir);
    unlink(t->host);
    free(t);
    return 0;
}

static void link_at(const tree *t, const char *target, const char *rel)
{
    char p[256];
    at(p, sizeof(p), t, rel);
    assert_int_equal(symlink(target, p), 0);
}

/* reads rel: never the host's contents; returns the error (or 0 with the text freed) */
static int read_rel(const tree *t, const char *rel, char **text)
{
    size_t n = 0;
    char *b = NULL;
    int rc = wk_sfs_read_file(t->root, rel, 1 << 20, &b, &n, t->mode);
    if (rc == 0) {
        assert_null(strstr(b, "HOST-SECRET"));
        assert_null(strstr(b, "PATH="));
        if (text)
            *text = b;
        else
            free(b);
    }
    return rc;
}

static void regular_file(void **state)
{
    tree *t = *state;
    char *b = NULL;
    struct stat st;
    assert_int_equal(read_rel(t, "etc/ssl/certs/real.crt", &b), 0);
    assert_string_equal(b, "TENANT-CA\n");
    free(b);
    assert_int_equal(read_rel(t, "/etc/ssl/certs/real.crt", &b), 0); /* '/' is the root */
    free(b);
    assert_int_equal(read_rel(t, "etc/ssl/certs/absent.crt", NULL), -ENOENT);
    /* too large for the bound */
    assert_int_equal(wk_sfs_read_file(t->root, "etc/ssl/certs/real.crt", 4, &b, &(size_t){0},
                                      t->mode),
                     -EFBIG);
    assert_int_equal(wk_sfs_stat(t->root, "etc/ssl/certs/real.crt", &st, t->mode), 0);
    assert_true(S_ISREG(st.st_mode));
    /* a link that stays inside: openat2 resolves it in the root; the walk refuses it */
    link_at(t, "/etc/ssl/certs/real.crt", "etc/ssl/certs/ca-certificates.crt");
    link_at(t, "../ssl", "etc/ssl/again");
    if (t->mode == WK_SFS_OPENAT2) {
        assert_int_equal(read_rel(t, "etc/ssl/certs/ca-certificates.crt", &b), 0);
        assert_string_equal(b, "TENANT-CA\n");
        free(b);
        assert_int_equal(read_rel(t, "etc/ssl/again/certs/real.crt", &b), 0);
        free(b);
    } else {
        assert_int_equal(read_rel(t, "etc/ssl/certs/ca-certificates.crt", NULL), -ELOOP);
        assert_int_equal(read_rel(t, "etc/ssl/again/certs/real.crt", NULL), -ENOTDIR);
    }
}

/* WK_SFS_AUTO takes openat2 here (the kernel has it) unless SF_SAFEFS_FORCE_WALK=1 was set
 * before its first use: then it walks (what a kernel without openat2 gets). Runs first. */
static void auto_mode_and_env(void **state)
{
    tree *t = *state;
    link_at(t, "/etc/ssl/certs/real.crt", "etc/ssl/certs/ca-certificates.crt");
    setenv("SF_SAFEFS_FORCE_WALK", "1", 1);
    assert_int_equal(wk_sfs_read_file(t->root, "etc/ssl/certs/ca-certificates.crt", 4096,
                                      &(char *){NULL}, &(size_t){0}, WK_SFS_AUTO),
                     -ELOOP);
    unsetenv("SF_SAFEFS_FORCE_WALK"); /* read once: AUTO stays the walk in this process */
    char *b = NULL;
    size_t n;
    assert_int_equal(wk_sfs_read_file(t->root, "etc/ssl/certs/real.crt", 4096, &b, &n,
                                      WK_SFS_AUTO), 0);
    free(b);
}

static void absolute_link(void **state)
{
    tree *t = *state;
    link_at(t, "/proc/self/environ", "etc/ssl/certs/ca-certificates.crt");
    link_at(t, t->host, "etc/ssl/certs/host.crt");
    assert_int_not_equal(read_rel(t, "etc/ssl/certs/ca-certificates.crt", NULL), 0);
    assert_int_not_equal(read_rel(t, "etc/ssl/certs/host.crt", NULL), 0);
}

static void relative_link(void **state)
{
    tree *t = *state;
    char up[256];
    /* from etc/ssl/certs, ../../../../.. leaves the tree (and /tmp) on the host */
    snprintf(up, sizeof(up), "../../../../../../../..%s", t->host);
    link_at(t, up, "etc/ssl/certs/ca-certificates.crt");
    link_at(t, "../../../../../../../../proc/self/environ", "etc/ssl/certs/env.crt");
    assert_int_not_equal(read_rel(t, "etc/ssl/certs/ca-certificates.crt", NULL), 0);
    assert_int_not_equal(read_rel(t, "etc/ssl/certs/env.crt", NULL), 0);
    /* ".." in the path itself: clamped at the root (openat2) or refused (walk) */
    int rc = read_rel(t, "../../../../../../proc/self/environ", NULL);
    assert_int_not_equal(rc, 0);
}

static void dir_link_in_middle(void **state)
{
    tree *t = *state;
    char p[256], hostdir[128];
    /* etc/ssl2 -> the host's /tmp dir that holds the host file: etc/ssl2/<host> */
    snprintf(hostdir, sizeof(hostdir), "/tmp");
    link_at(t, hostdir, "etc/ssl2");
    snprintf(p, sizeof(p), "etc/ssl2/%s", strrchr(t->host, '/') + 1);
    assert_int_not_equal(read_rel(t, p, NULL), 0);
    /* every helper refuses to act through it */
    snprintf(p, sizeof(p), "etc/ssl2/sfs-made-%d", (int)getpid());
    int fd = wk_sfs_create(t->root, p, 0644, 1, t->mode);
    assert_true(fd < 0);
    char hp[256];
    snprintf(hp, sizeof(hp), "/tmp/sfs-made-%d", (int)getpid());
    assert_int_equal(access(hp, F_OK), -1);
    assert_int_not_equal(wk_sfs_mkdir(t->root, p, 0755, t->mode), 0);
    assert_int_equal(access(hp, F_OK), -1);
    snprintf(p, sizeof(p), "etc/ssl2/%s", strrchr(t->host, '/') + 1);
    assert_int_not_equal(wk_sfs_chmod(t->root, p, 0777, (uid_t)-1, (gid_t)-1, t->mode), 0);
    assert_int_not_equal(wk_sfs_unlink(t->root, p, 0, t->mode), 0);
    assert_int_equal(access(t->host, F_OK), 0); /* still there */
    struct stat st;
    stat(t->host, &st);
    assert_int_not_equal(st.st_mode & 0777, 0777);
}

static void magic_link(void **state)
{
    tree *t = *state;
    /* rooted at /proc/<pid> (/proc/self is itself a link, refused as a root): "root",
     * "cwd" and "fd/N" are magic links */
    char pp[64];
    snprintf(pp, sizeof(pp), "/proc/%d", (int)getpid());
    assert_true(wk_sfs_root("/proc/self") < 0); /* ENOTDIR: O_DIRECTORY on a link */
    int proc = wk_sfs_root(pp);
    assert_true(proc >= 0);
    char *b = NULL;
    size_t n;
    assert_int_not_equal(wk_sfs_read_file(proc, "root/etc/hostname", 4096, &b, &n, t->mode), 0);
    assert_true(wk_sfs_open(proc, "fd/0", O_RDONLY, t->mode) < 0);
    assert_true(wk_sfs_open(proc, "cwd", O_RDONLY | O_DIRECTORY, t->mode) < 0);
    /* a plain file there still reads */
    assert_int_equal(wk_sfs_read_file(proc, "comm", 4096, &b, &n, t->mode), 0);
    free(b);
    close(proc);
}

static void fifo_fails_fast(void **state)
{
    tree *t = *state;
    char p[256];
    struct timespec a, b;
    at(p, sizeof(p), t, "etc/ssl/certs/ca-certificates.crt");
    assert_int_equal(mkfifo(p, 0644), 0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(read_rel(t, "etc/ssl/certs/ca-certificates.crt", NULL), -EINVAL);
    /* creating over it (no O_EXCL) refuses instead of blocking on a reader */
    assert_true(wk_sfs_create(t->root, "etc/ssl/certs/ca-certificates.crt", 0644, 0, t->mode) < 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    /* a blocking open would never return: reaching here at all is the check; the bound
     * says the calls did not wait on anything */
    assert_true(b.tv_sec - a.tv_sec < 5);
}

static void create_write_rename(void **state)
{
    tree *t = *state;
    char *b = NULL;
    struct stat st;
    int fd = wk_sfs_create(t->root, "etc/new.txt", 0600, 1, t->mode);
    assert_true(fd >= 0);
    assert_int_equal(wk_sfs_write_all(fd, "hello", 5), 0);
    close(fd);
    assert_int_equal(wk_sfs_create(t->root, "etc/new.txt", 0600, 1, t->mode), -EEXIST);
    fd = wk_sfs_create(t->root, "etc/new.txt", 0600, 0, t->mode); /* truncates */
    assert_true(fd >= 0);
    assert_int_equal(wk_sfs_write_all(fd, "hi", 2), 0);
    close(fd);
    assert_int_equal(read_rel(t, "etc/new.txt", &b), 0);
    assert_string_equal(b, "hi");
    free(b);
    assert_int_equal(wk_sfs_chmod(t->root, "etc/new.txt", 0640, (uid_t)-1, (gid_t)-1, t->mode), 0);
    assert_int_equal(wk_sfs_stat(t->root, "etc/new.txt", &st, t->mode), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    assert_int_equal(wk_sfs_mkdir(t->root, "etc/d", 0755, t->mode), 0);
    assert_int_equal(wk_sfs_rename(t->root, "etc/new.txt", "etc/d/moved.txt", t->mode), 0);
    assert_int_equal(wk_sfs_stat(t->root, "etc/d/moved.txt", &st, t->mode), 0);
    /* bad last components */
    assert_int_equal(wk_sfs_unlink(t->root, "etc/..", 0, t->mode), -EINVAL);
    assert_int_equal(wk_sfs_rename(t->root, "etc/d/moved.txt", "etc/d/..", t->mode), -EINVAL);
    assert_int_equal(wk_sfs_mkdir(t->root, "etc/", 0755, t->mode), -EINVAL);
    assert_int_equal(wk_sfs_unlink(t->root, "etc/d/moved.txt", 0, t->mode), 0);
    assert_int_equal(wk_sfs_unlink(t->root, "etc/d", AT_REMOVEDIR, t->mode), 0);
    /* a link as the last component: stat reports the link, chmod refuses it */
    link_at(t, t->host, "etc/l");
    assert_int_equal(wk_sfs_stat(t->root, "etc/l", &st, t->mode), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_not_equal(wk_sfs_chmod(t->root, "etc/l", 0777, (uid_t)-1, (gid_t)-1, t->mode), 0);
}

static void rm_contents_keeps_host(void **state)
{
    tree *t = *state;
    char p[256];
    /* a directory link and a file link into the host: removing the tree removes the links */
    link_at(t, "/tmp", "etc/tmp-link");
    link_at(t, t->host, "etc/ssl/host-link");
    at(p, sizeof(p), t, "etc/ssl/certs/deep");
    mkdir(p, 0755);
    assert_int_equal(wk_sfs_rm_contents(t->root, 64), 0);
    assert_int_equal(access(t->host, F_OK), 0);
    assert_int_equal(access("/tmp", F_OK), 0);
    at(p, sizeof(p), t, "etc");
    assert_int_equal(access(p, F_OK), -1);
    DIR *d = wk_sfs_opendir_at(t->root, "etc");
    assert_null(d);
    /* opendir_at on a link refuses */
    at(p, sizeof(p), t, "l");
    assert_int_equal(symlink("/tmp", p), 0);
    assert_null(wk_sfs_opendir_at(t->root, "l"));
    assert_int_equal(wk_sfs_mkdir(t->root, "real", 0755, t->mode), 0);
    d = wk_sfs_opendir_at(t->root, "real");
    assert_non_null(d);
    closedir(d);
}

typedef struct count {
    int entries, links, dirs;
    int root_seen;
} count;

static int count_one(int dir, const char *name, const struct stat *st, void *arg)
{
    count *c = arg;
    c->entries++;
    c->links += S_ISLNK(st->st_mode);
    c->dirs += S_ISDIR(st->st_mode);
    c->root_seen += strcmp(name, ".") == 0;
    /* what tree_shift and open_up do: change through the parent's fd */
    if (S_ISREG(st->st_mode) || S_ISDIR(st->st_mode))
        return wk_sfs_chmod(dir, name, 0750, (uid_t)-1, (gid_t)-1, WK_SFS_AUTO);
    return 0;
}

static int deny_one(int dir, const char *name, const struct stat *st, void *arg)
{
    (void)dir;
    (void)st;
    (void)arg;
    return strcmp(name, "real.crt") == 0 ? -EPERM : 0;
}

static void walk_stays_inside(void **state)
{
    tree *t = *state;
    struct stat st;
    count c = {0};
    char p[256];
    /* a directory link and a file link into the host: visited as links, never entered */
    link_at(t, "/tmp", "etc/tmp-link");
    link_at(t, t->host, "etc/host-link");
    chmod(t->host, 0600);
    assert_int_equal(wk_sfs_walk(t->root, 64, count_one, &c), 0);
    assert_int_equal(c.root_seen, 1);
    assert_int_equal(c.links, 2);
    assert_int_equal(c.dirs, 4); /* ., etc, etc/ssl, etc/ssl/certs */
    assert_int_equal(c.entries, 7);
    stat(t->host, &st);
    assert_int_equal(st.st_mode & 0777, 0600); /* the host file is untouched */
    at(p, sizeof(p), t, "etc/ssl/certs/real.crt");
    stat(p, &st);
    assert_int_equal(st.st_mode & 0777, 0750);
    /* an error stops the walk and is returned; a depth bound is kept */
    assert_int_equal(wk_sfs_walk(t->root, 64, deny_one, NULL), -EPERM);
    assert_int_equal(wk_sfs_walk(t->root, 2, deny_one, NULL), -ELOOP);
}

#define BOTH(f)                                                                            \
    cmocka_unit_test_setup_teardown(f, setup_openat2, teardown),                           \
        cmocka_unit_test_setup_teardown(f, setup_walk, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(auto_mode_and_env, setup_openat2, teardown),
        BOTH(regular_file),    BOTH(absolute_link),   BOTH(relative_link),
        BOTH(dir_link_in_middle), BOTH(magic_link),   BOTH(fifo_fails_fast),
        BOTH(create_write_rename), BOTH(rm_contents_keeps_host),
        cmocka_unit_test_setup_teardown(walk_stays_inside, setup_openat2, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
