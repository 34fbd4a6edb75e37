/* The base template (worker/template.c): a fresh build holds the version stamp and the
 * nohup and disown scripts busybox lacks; a build without this version's stamp is rebuilt
 * and the old one moved aside, not removed; a current one is left alone. No root needed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "jail_int.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/sf-tpl-test.XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf -- '%s'", dir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static int exists(const char *rel)
{
    char p[256];
    struct stat st;
    snprintf(p, sizeof(p), "%s/templates/base/%s", dir, rel);
    return lstat(p, &st) == 0;
}

static int old_dirs(void)
{
    char p[256];
    struct dirent *e;
    int n = 0;
    DIR *d;

    snprintf(p, sizeof(p), "%s/templates/base", dir);
    assert_non_null(d = opendir(p));
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, "rootfs.old-", 11);
    closedir(d);
    return n;
}

static void test_fresh_stamp_and_scripts(void **state)
{
    const char *why = NULL;
    char cmd[512];
    struct stat st;
    char p[256];

    (void)state;
    if (access("/bin/busybox", X_OK) < 0)
        skip();
    assert_int_equal(wk_template_ensure(dir, &why), 0);
    assert_true(exists("rootfs/etc/sandfleet-base"));
    assert_true(exists("rootfs/usr/bin/disown"));
    snprintf(p, sizeof(p), "%s/templates/base/rootfs/usr/bin/nohup", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_true(st.st_mode & S_IXUSR);
    /* the script runs its command (ignoring SIGHUP) and passes its status on */
    snprintf(cmd, sizeof(cmd), "/bin/busybox sh %s /bin/busybox sh -c 'kill -HUP $$; exit 3' "
             ">/dev/null 2>&1", p);
    assert_int_equal(WEXITSTATUS(system(cmd)), 3);
    snprintf(cmd, sizeof(cmd), "/bin/busybox sh %s >/dev/null 2>&1", p);
    assert_int_equal(WEXITSTATUS(system(cmd)), 125);
    assert_int_equal(old_dirs(), 0);
}

static void test_older_build_is_rebuilt(void **state)
{
    const char *why = NULL;
    char p[256];
    FILE *f;

    (void)state;
    if (access("/bin/busybox", X_OK) < 0)
        skip();
    assert_int_equal(wk_template_ensure(dir, &why), 0);
    /* an older worker's build: no stamp (or another one), something of its own */
    snprintf(p, sizeof(p), "%s/templates/base/rootfs/etc/sandfleet-base", dir);
    assert_non_null(f = fopen(p, "w"));
    fputs("sandfleet-base 1\n", f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/templates/base/rootfs/old-marker", dir);
    assert_non_null(f = fopen(p, "w"));
    fclose(f);
    assert_int_equal(wk_template_ensure(dir, &why), 0);
    assert_false(exists("rootfs/old-marker"));
    assert_true(exists("rootfs/usr/bin/nohup"));
    assert_int_equal(old_dirs(), 1);
    /* current now: left alone */
    assert_int_equal(wk_template_ensure(dir, &why), 0);
    assert_int_equal(old_dirs(), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fresh_stamp_and_scripts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_older_build_is_rebuilt, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
