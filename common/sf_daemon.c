#include "sf_daemon.h"
#include "sf_trace.h"
#include "sf_log.h"
#include "sf_util.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *watchdog(void *arg)
{
    int64_t ms = (int64_t)(intptr_t)arg;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
    sf_error("msg=\"shutdown deadline passed; exiting now\" deadline_ms=%lld", (long long)ms);
    _exit(1);
    return NULL;
}

static void on_stop_signal(evutil_socket_t sig, short what, void *arg)
{
    sf_daemon *d = arg;
    pthread_t t;

    if (d->stopping) {
        sf_warn("msg=\"second stop signal: exiting at once\" signal=%d", (int)sig);
        _exit(1);
    }
    d->stopping = 1;
    sf_info("msg=\"stopping\" signal=%d deadline_ms=%lld", (int)sig,
            (long long)d->shutdown_deadline_ms);
    if (pthread_create(&t, NULL, watchdog, (void *)(intptr_t)d->shutdown_deadline_ms) == 0)
        pthread_detach(t);
    if (d->on_stop)
        d->on_stop(d->on_stop_arg);
    else
        event_base_loopexit(d->base, NULL);
}

/* Until the daemon's loop runs (sf_daemon_ready), nothing would see a stop signal: its
 * start-up may block on a broker or Redis that is gone (a metadata request, a
 * reconnection). A stop signal then ends the process at once: nothing was taken on yet.
 * After that, the loop's own handler (libevent's, chained here) takes it. */
static volatile sig_atomic_t daemon_ready;
static struct sigaction loop_handler[2]; /* SIGINT, SIGTERM: what the loop installed */

static void on_early_signal(int sig)
{
    static const char msg[] = "stop signal during start-up: exiting at once\n";
    const struct sigaction *h = &loop_handler[sig == SIGTERM];

    if (daemon_ready && !(h->sa_flags & SA_SIGINFO) && h->sa_handler != SIG_DFL &&
        h->sa_handler != SIG_IGN) {
        h->sa_handler(sig);
        return;
    }
    if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
        /* nothing more to do */
    }
    _exit(1);
}

static void guard_signal(int sig)
{
    struct sigaction sa, old;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_early_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, &old) == 0 && old.sa_handler != on_early_signal)
        loop_handler[sig == SIGTERM] = old;
}

void sf_daemon_ready(void)
{
    daemon_ready = 1;
}

static void log_delivery_error(const char *topic, const char *err)
{
    sf_error("msg=\"Kafka refused a message\" topic=%s err=\"%s\"", topic, err);
}

/* Credentials or ACLs refused: what to fix, once per sentence and 10 s (a client refused
 * so asks again about every second). Kafka's callbacks run on the thread that polls the
 * client (a gateway has one loop thread per instance): remembered per thread. */
static void log_refused(const char *sentence, const char *detail)
{
    static __thread const char *last;
    static __thread int64_t last_ms;
    int64_t now = sf_mono_ms();

    if (sentence == last && now - last_ms < 10000)
        return;
    last = sentence;
    last_ms = now;
    sf_error("msg=\"%s\" detail=\"%s\"", sentence, detail);
}

int sf_daemon_init(sf_daemon *d, const char *component, const sf_common_cfg *c)
{
    int level = sf_log_level_parse(c->log_level);
    char why[512];

    memset(d, 0, sizeof(*d));
    if (level < 0) {
        fprintf(stderr, "%s: log_level must be debug, info, warn or error.\n", component);
        return -1;
    }
    sf_log_init(component, level);
    if (sf_trace_open(c->trace_dir, component) < 0) {
        fprintf(stderr, "%s: cannot write stage stamps in trace_dir %s; check the folder.\n",
                component, c->trace_dir);
        return -1;
    }
    if (sf_kafka_security_set(&d->kafka, c->kafka_security_protocol, c->kafka_sasl_mechanism,
                              c->kafka_sasl_username, c->kafka_sasl_password_file, why,
                              sizeof(why)) < 0) {
        fprintf(stderr, "%s: %s\n", component, why);
        sf_trace_close();
        return -1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (!(d->base = event_base_new())) {
        fprintf(stderr, "%s: cannot create the event loop.\n", component);
        return -1;
    }
    d->ev_int = evsignal_new(d->base, SIGINT, on_stop_signal, d);
    d->ev_term = evsignal_new(d->base, SIGTERM, on_stop_signal, d);
    event_add(d->ev_int, NULL);
    event_add(d->ev_term, NULL);
    guard_signal(SIGINT);
    guard_signal(SIGTERM);
    d->kafka.brokers = c->kafka_brokers;
    d->kafka.on_refused = log_refused;
    d->kafka.fetch_wait_ms = (int)c->kafka_fetch_wait_ms;
    d->kafka.session_timeout_ms = (int)c->kafka_session_timeout_ms;
    d->kafka.linger_ms = 0;
    d->kafka.on_delivery_error = log_delivery_error;
    d->shutdown_deadline_ms = c->shutdown_deadline_ms;
    return 0;
}

void sf_daemon_fini(sf_daemon *d)
{
    explicit_bzero(d->kafka.sasl_password, sizeof(d->kafka.sasl_password));
    sf_trace_close();
    if (d->ev_int)
        event_free(d->ev_int);
    if (d->ev_term)
        event_free(d->ev_term);
    if (d->base)
        event_base_free(d->base);
    memset(d, 0, sizeof(*d));
}

typedef struct common_only {
    sf_common_cfg common;
} common_only;

static const sf_cfg_entry common_tbl[] = {SF_COMMON_CFG_ENTRIES(common_only)};

int sf_common_config_load(sf_common_cfg *c, char *why, size_t whylen)
{
    common_only o = {0};
    int rc = sf_config_load(common_tbl, SF_ARRAY_LEN(common_tbl), &o, NULL, why, whylen);

    if (rc < 0) {
        sf_config_free(common_tbl, SF_ARRAY_LEN(common_tbl), &o);
        return rc;
    }
    *c = o.common;
    return 0;
}

void sf_common_config_free(sf_common_cfg *c)
{
    common_only o = {.common = *c};

    sf_config_free(common_tbl, SF_ARRAY_LEN(common_tbl), &o);
    memset(c, 0, sizeof(*c));
}
