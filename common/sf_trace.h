/* sf_trace: per-job stage stamps, for finding where a slow job's time goes
 * (tests/bench/README.md, "Where a slow job waits"). Off unless sf_trace_open() was given
 * a folder (the daemons' `trace_dir`, the batch CLI's SF_TRACE_DIR); then each stamp is one
 * line "UNIX_US JOB_ID STAGE VALUE" in DIR/WHO.PID.trace, buffered and written in 64 KiB
 * blocks (and at sf_trace_close or exit). Wall-clock microseconds: stamps of processes on
 * one box compare; across hosts they are only as close as the hosts' clocks. When off, a
 * stamp costs one branch. Thread-safe. */
#ifndef SF_TRACE_H
#define SF_TRACE_H

#include <stdint.h>

extern int sf_trace_enabled;

/* dir NULL or empty: off. 0 or -errno (the folder cannot be written). */
int sf_trace_open(const char *dir, const char *who);
/* Writes what is buffered and stops; NULL-safe to call when off. */
void sf_trace_close(void);
/* One stamp of job's stage now (value: a figure of the stage, e.g. a duration; 0 if none). */
void sf_trace_stamp(const char *job, const char *stage, int64_t value);
#define SF_TRACE(job, stage, value)                                                             \
    do {                                                                                       \
        if (sf_trace_enabled)                                                                  \
            sf_trace_stamp((job), (stage), (value));                                           \
    } while (0)

#endif
