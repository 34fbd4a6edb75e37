/* sf_daemon: what every daemon's main() shares: the event base, clean stop on
 * SIGINT/SIGTERM, and the Kafka/Redis/log settings common to all of them. */
#ifndef SF_DAEMON_H
#define SF_DAEMON_H

#include "sf_config.h"
#include "sf_kafka.h"

#include <event2/event.h>
#include <stdint.h>

/* Settings every daemon has; embed as the first member `common` of a config struct. */
typedef struct sf_common_cfg {
    char *kafka_brokers;
    char *redis_url;
    char *log_level;
    int64_t kafka_fetch_wait_ms;
    int64_t kafka_session_timeout_ms;
    int64_t shutdown_deadline_ms;
    char *trace_dir;
    char *kafka_security_protocol;
    char *kafka_sasl_mechanism;
    char *kafka_sasl_username;
    char *kafka_sasl_password_file;
} sf_common_cfg;

#define SF_COMMON_CFG_ENTRIES(st)                                                              \
    {"kafka_brokers", SF_CFG_STR, offsetof(st, common.kafka_brokers), "127.0.0.1:9092", 0, 0,  \
     "Kafka bootstrap servers"},                                                               \
    {"redis_url", SF_CFG_STR, offsetof(st, common.redis_url), "redis://127.0.0.1:6379", 0, 0, \
     "Redis URL (redis://HOST:PORT or unix:/PATH)"},                                           \
    {"log_level", SF_CFG_STR, offsetof(st, common.log_level), "info", 0, 0,                   \
     "debug, info, warn or error"},                                                            \
    {"kafka_fetch_wait_ms", SF_CFG_INT, offsetof(st, common.kafka_fetch_wait_ms), "500", 1,    \
     10000, "Kafka fetch.wait.max.ms: how long an idle consumer's fetch waits at the broker "  \
     "(answered as soon as data arrives, so no delay; lower only adds idle fetches)"},         \
    {"kafka_session_timeout_ms", SF_CFG_INT, offsetof(st, common.kafka_session_timeout_ms),   \
     "3000", 1000, 300000,                                                                     \
     "Kafka session.timeout.ms: a dead member's partitions move to the others after this"},    \
    {"shutdown_deadline_ms", SF_CFG_INT, offsetof(st, common.shutdown_deadline_ms), "9000",    \
     500, 600000,                                                                              \
     "after SIGTERM the daemon exits within this, even when Kafka or Redis is gone"},         \
    {"trace_dir", SF_CFG_STR, offsetof(st, common.trace_dir), "", 0, 0,                       \
     "benchmarks: a folder for per-job stage stamps (empty: off; tests/bench/README.md)"},     \
    {"kafka_security_protocol", SF_CFG_STR, offsetof(st, common.kafka_security_protocol),     \
     "plaintext", 0, 0, "plaintext, sasl_plaintext or sasl_ssl (ops/RUNBOOK.md, Kafka ACLs)"}, \
    {"kafka_sasl_mechanism", SF_CFG_STR, offsetof(st, common.kafka_sasl_mechanism), "PLAIN",  \
     0, 0, "with SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},                                \
    {"kafka_sasl_username", SF_CFG_STR, offsetof(st, common.kafka_sasl_username), "", 0, 0,   \
     "with SASL: this daemon's Kafka user (its ACL principal)"},                               \
    {"kafka_sasl_password_file", SF_CFG_STR, offsetof(st, common.kafka_sasl_password_file),   \
     "", 0, 0, "with SASL: a file holding that user's password (one line)"}

/* The common settings alone, for a program that is not a daemon (the batch CLI): the
 * defaults, then the SF_* environment variables, checked against the same table. 0, or
 * -EINVAL with a sentence in why naming the setting. sf_common_config_free frees them. */
int sf_common_config_load(sf_common_cfg *c, char *why, size_t whylen);
void sf_common_config_free(sf_common_cfg *c);

typedef struct sf_daemon {
    struct event_base *base;
    struct event *ev_int, *ev_term;
    sf_kafka_settings kafka;
    int64_t shutdown_deadline_ms;
    int stopping;                 /* a stop signal arrived */
    /* Called (instead of leaving the loop at once) by the first SIGINT/SIGTERM, for a
     * daemon that drains first; it ends the loop itself. NULL: the loop ends at once. */
    void (*on_stop)(void *arg);
    void *on_stop_arg;
} sf_daemon;

/* 0 or -1 (message printed). The first SIGINT/SIGTERM starts the stop (on_stop, else the
 * loop ends) and a watchdog that ends the process after shutdown_deadline_ms whatever is
 * still waiting (a broker or Redis that is gone); a second signal ends it at once. */
int sf_daemon_init(sf_daemon *d, const char *component, const sf_common_cfg *c);
/* The daemon's loop is about to run: stop signals go to it from now on. Before this call a
 * stop signal ends the process at once (its start-up may block on a broker or Redis that
 * is gone, where no loop would see the signal). */
void sf_daemon_ready(void);
void sf_daemon_fini(sf_daemon *d);

#endif
