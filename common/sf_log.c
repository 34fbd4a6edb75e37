#include "sf_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

int sf_log_level = SF_LOG_INFO;
static const char *log_comp = "sandfleet";

void sf_log_init(const char *component, int level)
{
    log_comp = component;
    sf_log_level = level;
}

int sf_log_level_parse(const char *s)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

void sf_log_write(int level, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    char line[2048], ts[32];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int n;

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    n = snprintf(line, sizeof(line), "ts=%s.%03dZ level=%s comp=%s ", ts,
                 (int)(tv.tv_usec / 1000), names[level & 3], log_comp);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
