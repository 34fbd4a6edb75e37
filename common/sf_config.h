/* sf_config: one table per daemon (name, type, default, bounds, help), read from
 * a "name value" file and overridable by SF_<NAME> environment variables
 * (redis config table style). */
#ifndef SF_CONFIG_H
#define SF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SF_CFG_STR, SF_CFG_INT, SF_CFG_BOOL } sf_cfg_type;

typedef struct sf_cfg_entry {
    const char *name;  /* lower_snake; env var is SF_ + upper(name) */
    sf_cfg_type type;
    size_t off;        /* offsetof() into the daemon's config struct: char *, int64_t or int */
    const char *def;   /* default, as text (NULL = empty string / 0) */
    int64_t min, max;  /* bounds for SF_CFG_INT */
    const char *help;
} sf_cfg_entry;

#define SF_CFG_S(st, field, def, help) {#field, SF_CFG_STR, offsetof(st, field), def, 0, 0, help}
#define SF_CFG_I(st, field, def, lo, hi, help) {#field, SF_CFG_INT, offsetof(st, field), def, lo, hi, help}
#define SF_CFG_B(st, field, def, help) {#field, SF_CFG_BOOL, offsetof(st, field), def, 0, 1, help}

/* Defaults, then the file (if not NULL), then the environment.
 * 0, or -EINVAL with a sentence in why naming the setting. */
int sf_config_load(const sf_cfg_entry *tbl, size_t n, void *obj, const char *file,
                   char *why, size_t whylen);
void sf_config_free(const sf_cfg_entry *tbl, size_t n, void *obj);
/* Parses a daemon's argv: [-c FILE] [--check-config] [--help].
 * Returns 0 to run, 1 to exit successfully (help / config ok), -1 on error (printed to stderr). */
int sf_config_main(int argc, char **argv, const char *prog, const sf_cfg_entry *tbl, size_t n,
                   void *obj);

#endif
