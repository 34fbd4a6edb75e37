/* sf_log: one logging macro, level checked before the arguments are evaluated.
 * Lines are key=value: "ts=... level=info comp=gateway msg=\"...\" job=...". */
#ifndef SF_LOG_H
#define SF_LOG_H

enum { SF_LOG_DEBUG = 0, SF_LOG_INFO = 1, SF_LOG_WARN = 2, SF_LOG_ERROR = 3 };

extern int sf_log_level;

/* Component name printed on every line ("gateway", "worker", ...). */
void sf_log_init(const char *component, int level);
/* Parses "debug" | "info" | "warn" | "error"; returns -1 when unknown. */
int sf_log_level_parse(const char *s);
void sf_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define sf_log(level, ...)                                                     \
    do {                                                                       \
        if ((level) >= sf_log_level)                                           \
            sf_log_write((level), __VA_ARGS__);                                \
    } while (0)
#define sf_debug(...) sf_log(SF_LOG_DEBUG, __VA_ARGS__)
#define sf_info(...)  sf_log(SF_LOG_INFO, __VA_ARGS__)
#define sf_warn(...)  sf_log(SF_LOG_WARN, __VA_ARGS__)
#define sf_error(...) sf_log(SF_LOG_ERROR, __VA_ARGS__)

#endif
