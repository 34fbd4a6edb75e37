#include "sf_config.h"
#include "sf_util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cfg_set(const sf_cfg_entry *e, void *obj, const char *val, const char *src, char *why,
                   size_t whylen)
{
    char *base = obj;
    int64_t v;

    switch (e->type) {
    case SF_CFG_STR: {
        char **dst = (char **)(base + e->off);
        char *s = strdup(val ? val : "");
        if (!s)
            return -ENOMEM;
        free(*dst);
        *dst = s;
        return 0;
    }
    case SF_CFG_INT:
        if (sf_parse_i64(val ? val : "0", e->min, e->max, &v) < 0) {
            snprintf(why, whylen,
                     "Setting '%s' from %s must be an integer from %lld to %lld (got '%s').",
                     e->name, src, (long long)e->min, (long long)e->max, val ? val : "");
            return -EINVAL;
        }
        *(int64_t *)(base + e->off) = v;
        return 0;
    case SF_CFG_BOOL:
        if (!val || !strcmp(val, "0") || !strcasecmp(val, "no") || !strcasecmp(val, "false"))
            *(int *)(base + e->off) = 0;
        else if (!strcmp(val, "1") || !strcasecmp(val, "yes") || !strcasecmp(val, "true"))
            *(int *)(base + e->off) = 1;
        else {
            snprintf(why, whylen, "Setting '%s' from %s must be yes or no (got '%s').", e->name,
                     src, val);
            return -EINVAL;
        }
        return 0;
    }
    return -EINVAL;
}

static const sf_cfg_entry *cfg_find(const sf_cfg_entry *tbl, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tbl[i].name, name))
            return &tbl[i];
    return NULL;
}

static int cfg_file(const sf_cfg_entry *tbl, size_t n, void *obj, const char *file, char *why,
                    size_t whylen)
{
    char line[4096], src[512];
    int lineno = 0, rc = 0;
    FILE *f = fopen(file, "re"); /* close-on-exec: a daemon may spawn children */

    if (!f) {
        snprintf(why, whylen, "Cannot open config file %s: %s.", file, strerror(errno));
        return -EINVAL;
    }
    while (fgets(line, sizeof(line), f)) {
        char *k = line, *v, *end;
        const sf_cfg_entry *e;

        lineno++;
        while (isspace((unsigned char)*k))
            k++;
        if (*k == '#' || *k == '\0')
            continue;
        end = k + strlen(k);
        while (end > k && isspace((unsigned char)end[-1]))
            *--end = '\0';
        v = k;
        while (*v && !isspace((unsigned char)*v))
            v++;
        if (*v)
            *v++ = '\0';
        while (isspace((unsigned char)*v))
            v++;
        if (!(e = cfg_find(tbl, n, k))) {
            snprintf(why, whylen, "Unknown setting '%s' at %s:%d; remove it or fix the name.", k,
                     file, lineno);
            rc = -EINVAL;
            break;
        }
        snprintf(src, sizeof(src), "%s:%d", file, lineno);
        if ((rc = cfg_set(e, obj, v, src, why, whylen)) < 0)
            break;
    }
    fclose(f);
    return rc;
}

int sf_config_load(const sf_cfg_entry *tbl, size_t n, void *obj, const char *file, char *why,
                   size_t whylen)
{
    int rc;

    for (size_t i = 0; i < n; i++)
        if ((rc = cfg_set(&tbl[i], obj, tbl[i].def, "the default", why, whylen)) < 0)
            return rc;
    if (file && (rc = cfg_file(tbl, n, obj, file, why, whylen)) < 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        char env[128], src[160];
        size_t j = 0;
        const char *val;

        memcpy(env, "SF_", 3);
        for (const char *p = tbl[i].name; *p && j + 4 < sizeof(env); p++, j++)
            env[3 + j] = (char)toupper((unsigned char)*p);
        env[3 + j] = '\0';
        if (!(val = getenv(env)))
            continue;
        snprintf(src, sizeof(src), "$%s", env);
        if ((rc = cfg_set(&tbl[i], obj, val, src, why, whylen)) < 0)
            return rc;
    }
    return 0;
}

void sf_config_free(const sf_cfg_entry *tbl, size_t n, void *obj)
{
    for (size_t i = 0; i < n; i++)
        if (tbl[i].type == SF_CFG_STR)
            sf_free((char **)((char *)obj + tbl[i].off));
}

static void cfg_usage(const char *prog, const sf_cfg_entry *tbl, size_t n)
{
    printf("usage: %s [-c FILE] [--check-config] [--help]\n\nsettings (file: 'name value'; "
           "environment: SF_NAME):\n", prog);
    for (size_t i = 0; i < n; i++)
        printf("  %-24s %s (default: %s)\n", tbl[i].name, tbl[i].help,
               tbl[i].def && *tbl[i].def ? tbl[i].def : "none");
}

int sf_config_main(int argc, char **argv, const char *prog, const sf_cfg_entry *tbl, size_t n,
                   void *obj)
{
    const char *file = NULL;
    int check = 0;
    char why[512];

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-c") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "--check-config"))
            check = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cfg_usage(prog, tbl, n);
            return 1;
        } else {
            fprintf(stderr, "%s: unknown argument '%s'; see --help.\n", prog, argv[i]);
            return -1;
        }
    }
    if (sf_config_load(tbl, n, obj, file, why, sizeof(why)) < 0) {
        fprintf(stderr, "%s: %s\n", prog, why);
        return -1;
    }
    if (check) {
        printf("%s: configuration OK\n", prog);
        return 1;
    }
    return 0;
}
