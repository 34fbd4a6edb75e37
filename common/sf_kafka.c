#include "sf_kafka.h"
#include "sf_util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int conf_set(rd_kafka_conf_t *c, const char *k, const char *v, char *why, size_t whylen)
{
    return rd_kafka_conf_set(c, k, v, why, whylen) == RD_KAFKA_CONF_OK ? 0 : -EINVAL;
}

static int conf_set_int(rd_kafka_conf_t *c, const char *k, int v, char *why, size_t whylen)
{
    char num[24];
    snprintf(num, sizeof(num), "%d", v);
    return conf_set(c, k, num, why, whylen);
}

/* ---- credentials ---- */

static const char *const protocols[] = {"plaintext", "sasl_plaintext", "sasl_ssl"};
static const char *const mechanisms[] = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"};

static const char *pick(const char *v, const char *const *names, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        if (!strcasecmp(v, names[i]))
            return names[i];
    return NULL;
}

static int printable(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f)
            return 0;
    return 1;
}

/* The first line of path, at most SF_KAFKA_PASSWORD_MAX bytes, into out. */
static int read_password(const char *path, char out[SF_KAFKA_PASSWORD_MAX + 1], char *why,
                         size_t whylen)
{
    char buf[SF_KAFKA_PASSWORD_MAX + 3];
    size_t len = 0;
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0) {
        int e = errno;
        snprintf(why, whylen, "Cannot read kafka_sasl_password_file %s: %s; point "
                 "SF_KAFKA_SASL_PASSWORD_FILE at a readable file holding the Kafka password.",
                 path, strerror(e));
        return -e;
    }
    while (len < sizeof(buf) && (n = read(fd, buf + len, sizeof(buf) - len)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            snprintf(why, whylen, "Cannot read kafka_sasl_password_file %s: %s.", path,
                     strerror(e));
            return -e;
        }
        len += (size_t)n;
    }
    close(fd);
    if (len > 0 && buf[len - 1] == '\n')
        len--;
    if (len > 0 && buf[len - 1] == '\r')
        len--;
    if (len == 0 || len > SF_KAFKA_PASSWORD_MAX || !printable(buf, len)) {
        explicit_bzero(buf, sizeof(buf));
        snprintf(why, whylen, "kafka_sasl_password_file %s must hold the Kafka password on one "
                 "line (1-%d bytes, no control characters).", path, SF_KAFKA_PASSWORD_MAX);
        return -EINVAL;
    }
    memcpy(out, buf, len);
    out[len] = '\0';
    explicit_bzero(buf, sizeof(buf));
    return 0;
}

int sf_kafka_security_set(sf_kafka_settings *s, const char *protocol, const char *mechanism,
                          const char *username, const char *password_file, char *why,
                          size_t whylen)
{
    const char *proto = pick(protocol && *protocol ? protocol : "plaintext", protocols, 3);
    const char *mech = pick(mechanism && *mechanism ? mechanism : "PLAIN", mechanisms, 3);
    size_t ulen = username ? strlen(username) : 0;
    char pw[SF_KAFKA_PASSWORD_MAX + 1];
    int rc;

    if (!proto) {
        snprintf(why, whylen, "kafka_security_protocol (SF_KAFKA_SECURITY_PROTOCOL) is '%.40s'; "
                 "set plaintext, sasl_plaintext or sasl_ssl.", protocol);
        return -EINVAL;
    }
    if (proto == protocols[0]) {
        if (ulen || (password_file && *password_file)) {
            snprintf(why, whylen, "kafka_sasl_username or kafka_sasl_password_file is set but "
                     "kafka_security_protocol (SF_KAFKA_SECURITY_PROTOCOL) is plaintext, which "
                     "sends no credentials; set sasl_plaintext or sasl_ssl, or clear them.");
            return -EINVAL;
        }
        s->security_protocol = NULL;
        s->sasl_mechanism = s->sasl_username = NULL;
        explicit_bzero(s->sasl_password, sizeof(s->sasl_password));
        return 0;
    }
    if (!mech) {
        snprintf(why, whylen, "kafka_sasl_mechanism (SF_KAFKA_SASL_MECHANISM) is '%.40s'; set "
                 "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (the broker's sasl.enabled.mechanisms).",
                 mechanism);
        return -EINVAL;
    }
    if (ulen == 0 || ulen > 255 || !printable(username, ulen)) {
        snprintf(why, whylen, "kafka_security_protocol is %s, so kafka_sasl_username "
                 "(SF_KAFKA_SASL_USERNAME) must name this daemon's Kafka user (1-255 "
                 "printable characters).", proto);
        return -EINVAL;
    }
    if (!password_file || !*password_file) {
        snprintf(why, whylen, "kafka_security_protocol is %s, so kafka_sasl_password_file "
                 "(SF_KAFKA_SASL_PASSWORD_FILE) must name the file holding the password of "
                 "Kafka user %.255s.", proto, username);
        return -EINVAL;
    }
    if ((rc = read_password(password_file, pw, why, whylen)) < 0)
        return rc;
    s->security_protocol = proto;
    s->sasl_mechanism = mech;
    s->sasl_username = username;
    memcpy(s->sasl_password, pw, sizeof(pw));
    explicit_bzero(pw, sizeof(pw));
    return 0;
}

const char *sf_kafka_err_hint(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
        return "Kafka refused this client's credentials; check kafka_sasl_username "
               "(SF_KAFKA_SASL_USERNAME), the password in kafka_sasl_password_file and "
               "kafka_sasl_mechanism against the broker's users, and kafka_security_protocol "
               "against its listener (SCRAM against Apache Kafka 4 needs librdkafka 2.6.1 or "
               "later).";
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM:
    case RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE:
        return "The Kafka listener does not offer kafka_sasl_mechanism (SF_KAFKA_SASL_MECHANISM); "
               "set one of its sasl.enabled.mechanisms.";
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
        return "Kafka's ACLs refuse this client's principal (kafka_sasl_username) the topic; "
               "grant it the ACLs of its role in ops/RUNBOOK.md (Kafka ACLs).";
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
        return "Kafka's ACLs refuse this client's principal (kafka_sasl_username) its consumer "
               "group; grant it the ACLs of its role in ops/RUNBOOK.md (Kafka ACLs).";
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return "Kafka's ACLs refuse this client's principal (kafka_sasl_username) a cluster "
               "operation; grant it the ACLs of its role in ops/RUNBOOK.md (Kafka ACLs).";
    default:
        return NULL;
    }
}

/* Tells s's on_refused about err when it is the operator's to fix. */
static void refused(const sf_kafka_settings *s, rd_kafka_resp_err_t err, const char *detail)
{
    const char *hint = sf_kafka_err_hint(err);

    if (hint && s && s->on_refused)
        s->on_refused(hint, detail ? detail : rd_kafka_err2str(err));
}

static rd_kafka_conf_t *conf_common(const sf_kafka_settings *s, char *why, size_t whylen)
{
    rd_kafka_conf_t *c = rd_kafka_conf_new();

    if (s->security_protocol &&
        (conf_set(c, "security.protocol", s->security_protocol, why, whylen) < 0 ||
         conf_set(c, "sasl.mechanism", s->sasl_mechanism, why, whylen) < 0 ||
         conf_set(c, "sasl.username", s->sasl_username, why, whylen) < 0 ||
         conf_set(c, "sasl.password", s->sasl_password, why, whylen) < 0)) {
        rd_kafka_conf_destroy(c);
        return NULL;
    }
    if (conf_set(c, "bootstrap.servers", s->brokers, why, whylen) < 0 ||
        conf_set(c, "socket.nagle.disable", "true", why, whylen) < 0 ||
        conf_set(c, "log.connection.close", "false", why, whylen) < 0 ||
        conf_set(c, "topic.metadata.refresh.interval.ms", "10000", why, whylen) < 0 ||
        /* a broker that comes back (a restart) is found within a second, not librdkafka's
         * default of up to 10 s */
        conf_set(c, "reconnect.backoff.ms", "50", why, whylen) < 0 ||
        conf_set(c, "reconnect.backoff.max.ms", "1000", why, whylen) < 0) {
        rd_kafka_conf_destroy(c);
        return NULL;
    }
    return c;
}

typedef struct delivery_cb {
    void (*fn)(void *arg, int err);
    void *arg;
} delivery_cb;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    const sf_kafka_settings *s = opaque;
    delivery_cb *d = m->_private;

    if (m->err && s && s->on_delivery_error)
        s->on_delivery_error(m->rkt ? rd_kafka_topic_name(m->rkt) : "?", rd_kafka_err2str(m->err));
    if (m->err)
        refused(s, m->err, m->rkt ? rd_kafka_topic_name(m->rkt) : NULL);
    if (d) {
        d->fn(d->arg, m->err ? -EIO : 0);
        free(d);
    }
}

static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    const sf_kafka_settings *s = opaque;

    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN && s && s->on_brokers_down)
        s->on_brokers_down(s->down_arg);
    refused(s, err, reason);
}

rd_kafka_t *sf_kafka_producer_new(const sf_kafka_settings *s, char *why, size_t whylen)
{
    rd_kafka_conf_t *c = conf_common(s, why, whylen);
    rd_kafka_t *rk;

    if (!c)
        return NULL;
    /* One produce request in flight per broker: what is produced while it travels goes
     * out together in the next one, one record batch per partition. Batches so grow with
     * the load by themselves (fewer requests, fewer fetches to carry them), and an idle
     * producer adds no delay (linger.ms can stay 0). */
    if (conf_set_int(c, "linger.ms", s->linger_ms, why, whylen) < 0 ||
        conf_set(c, "max.in.flight.requests.per.connection", "1", why, whylen) < 0 ||
        /* a job is acknowledged once every in-sync replica has it (min.insync.replicas on
         * the brokers says how many must be: ops/RUNBOOK.md) */
        conf_set(c, "acks", "all", why, whylen) < 0 ||
        conf_set(c, "message.max.bytes", "2000000", why, whylen) < 0 ||
        conf_set(c, "message.timeout.ms", "30000", why, whylen) < 0) {
        rd_kafka_conf_destroy(c);
        return NULL;
    }
    rd_kafka_conf_set_dr_msg_cb(c, on_delivery);
    rd_kafka_conf_set_error_cb(c, on_error);
    rd_kafka_conf_set_opaque(c, (void *)s);
    if (!(rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, why, whylen)))
        rd_kafka_conf_destroy(c);
    return rk;
}

/* What a consumer's rebalance callback calls (the consumer's opaque). */
typedef struct consumer_hooks {
    void (*on_revoke)(void *arg, int32_t partition);
    void *arg;
    const sf_kafka_settings *s; /* the consumer's settings (its on_refused) */
} consumer_hooks;

static void on_consumer_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    consumer_hooks *h = opaque;

    refused(h ? h->s : NULL, err, reason);
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    consumer_hooks *h = opaque;
    int coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    rd_kafka_error_t *e = NULL;

    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        if (coop)
            e = rd_kafka_incremental_assign(rk, parts);
        else
            rd_kafka_assign(rk, parts);
        if (e)
            rd_kafka_error_destroy(e);
        return;
    }
    /* Revoked: work still running on these partitions must not move their offsets when
     * it ends (another member owns them now and starts from the committed offset). With
     * cooperative-sticky assignment only the partitions that move are revoked; the rest
     * keep flowing through a rebalance. */
    for (int i = 0; h && h->on_revoke && i < parts->cnt; i++)
        h->on_revoke(h->arg, parts->elems[i].partition);
    if (coop)
        e = rd_kafka_incremental_unassign(rk, parts);
    else
        rd_kafka_assign(rk, NULL);
    if (e)
        rd_kafka_error_destroy(e);
}

void sf_kafka_on_revoke(rd_kafka_t *consumer, void (*fn)(void *arg, int32_t partition),
                        void *arg)
{
    consumer_hooks *h = rd_kafka_opaque(consumer);
    if (h) {
        h->on_revoke = fn;
        h->arg = arg;
    }
}

rd_kafka_t *sf_kafka_consumer_new(const sf_kafka_settings *s, const char *group, char *why,
                                  size_t whylen)
{
    rd_kafka_conf_t *c = conf_common(s, why, whylen);
    consumer_hooks *hooks = calloc(1, sizeof(*hooks));
    rd_kafka_t *rk;
    int hb = s->session_timeout_ms / 3;

    if (!c || !hooks) {
        if (c)
            rd_kafka_conf_destroy(c);
        free(hooks);
        return NULL;
    }
    hooks->s = s;
    rd_kafka_conf_set_opaque(c, hooks);
    rd_kafka_conf_set_rebalance_cb(c, on_rebalance);
    rd_kafka_conf_set_error_cb(c, on_consumer_error);
    if (conf_set(c, "group.id", group, why, whylen) < 0 ||
        /* the broker long-polls (the embedded one and Apache Kafka alike): a fetch is
         * answered as soon as fetch.min.bytes are there, else when fetch.wait.max.ms
         * ends, so a message's latency does not depend on the wait, and an idle consumer
         * asks once per wait */
        conf_set_int(c, "fetch.wait.max.ms", s->fetch_wait_ms, why, whylen) < 0 ||
        conf_set(c, "fetch.min.bytes", "1", why, whylen) < 0 ||
        conf_set_int(c, "session.timeout.ms", s->session_timeout_ms, why, whylen) < 0 ||
        conf_set_int(c, "heartbeat.interval.ms", hb > 100 ? hb : 100, why, whylen) < 0 ||
        conf_set(c, "auto.offset.reset", "earliest", why, whylen) < 0 ||
        conf_set(c, "enable.auto.offset.store", "false", why, whylen) < 0 ||
        conf_set(c, "enable.auto.commit", "true", why, whylen) < 0 ||
        conf_set(c, "auto.commit.interval.ms", "200", why, whylen) < 0 ||
        conf_set(c, "allow.auto.create.topics", "true", why, whylen) < 0 ||
        conf_set(c, "fetch.error.backoff.ms", "20", why, whylen) < 0 ||
        /* a member that leaves or dies moves only its own partitions; the others keep
         * consuming through the rebalance */
        conf_set(c, "partition.assignment.strategy", "cooperative-sticky", why, whylen) < 0) {
        rd_kafka_conf_destroy(c);
        free(hooks);
        return NULL;
    }
    if (!(rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, why, whylen))) {
        rd_kafka_conf_destroy(c);
        free(hooks);
    }
    return rk;
}

/* Leaving the group waits for the group coordinator; a broker that is gone would make
 * rd_kafka_consumer_close() wait forever, so the close runs in the background and is
 * given SF_KAFKA_CLOSE_MS (rebalance events it raises are served here), then the handle
 * is destroyed without a second close. */
#define SF_KAFKA_CLOSE_MS 3000
/* How long a closing client asks whether any broker still answers: with none, leaving
 * the group and flushing could only wait out their whole limits (a daemon told to stop
 * while the broker is gone must still end within its shutdown deadline). */
#define SF_KAFKA_PROBE_MS 500

static int broker_answers(rd_kafka_t *rk)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, NULL, &md, SF_KAFKA_PROBE_MS);

    if (md)
        rd_kafka_metadata_destroy(md);
    return err == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Even without a consumer close, a consumer's destroy waits for its group's last offset
 * commit, up to session.timeout.ms when the coordinator is gone. The destroy runs on a
 * thread of its own and is waited for at most ms; after that the process goes on (it is
 * ending) and the handle is left to that thread. 0 when it ended in time, else -ETIMEDOUT. */
#define SF_KAFKA_DESTROY_MS 1000

typedef struct destroy_job {
    rd_kafka_t *rk;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, abandoned;
} destroy_job;

static void destroy_job_free(destroy_job *j)
{
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void *destroy_thread(void *arg)
{
    destroy_job *j = arg;
    int abandoned;

    rd_kafka_destroy_flags(j->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    abandoned = j->abandoned;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (abandoned) /* the caller went on without it */
        destroy_job_free(j);
    return NULL;
}

static int destroy_bounded(rd_kafka_t *rk, int ms)
{
    destroy_job *j = calloc(1, sizeof(*j));
    pthread_condattr_t ca;
    struct timespec until;
    pthread_t t;
    int done;

    if (!j || pthread_condattr_init(&ca) != 0) {
        free(j);
        rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
        return 0;
    }
    j->rk = rk;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&t, NULL, destroy_thread, j) != 0) {
        destroy_job_free(j);
        rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
        return 0;
    }
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&j->mu);
    while (!j->done && pthread_cond_timedwait(&j->cv, &j->mu, &until) == 0)
        ;
    done = j->done;
    j->abandoned = !done;
    pthread_mutex_unlock(&j->mu);
    if (!done) {
        pthread_detach(t);
        return -ETIMEDOUT;
    }
    pthread_join(t, NULL);
    destroy_job_free(j);
    return 0;
}

void sf_kafka_consumer_free(rd_kafka_t *consumer)
{
    consumer_hooks *h;
    rd_kafka_queue_t *q = NULL;
    rd_kafka_error_t *e;
    int64_t until;

    if (!consumer)
        return;
    h = rd_kafka_opaque(consumer);
    until = sf_mono_ms() + SF_KAFKA_CLOSE_MS;
    if (broker_answers(consumer) && (q = rd_kafka_queue_new(consumer))) {
        if ((e = rd_kafka_consumer_close_queue(consumer, q)))
            rd_kafka_error_destroy(e);
        while (!rd_kafka_consumer_closed(consumer) && sf_mono_ms() < until) {
            rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 50);
            if (ev && rd_kafka_event_type(ev) == RD_KAFKA_EVENT_REBALANCE)
                on_rebalance(consumer, rd_kafka_event_error(ev),
                             rd_kafka_event_topic_partition_list(ev), NULL);
            if (ev)
                rd_kafka_event_destroy(ev);
        }
        rd_kafka_queue_destroy(q);
    }
    if (destroy_bounded(consumer, SF_KAFKA_DESTROY_MS) == 0)
        free(h); /* (else the handle's threads may still call its hooks: h stays) */
}

void sf_kafka_producer_free(rd_kafka_t *producer)
{
    if (!producer)
        return;
    if (rd_kafka_outq_len(producer) > 0 && broker_answers(producer))
        rd_kafka_flush(producer, 2000);
    /* what could not be delivered (a broker that is gone) still gets its delivery report,
     * so every per-message callback (sf_kafka_produce_cb) runs once */
    rd_kafka_purge(producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    for (int i = 0; i < 10 && rd_kafka_outq_len(producer) > 0; i++)
        rd_kafka_poll(producer, 50);
    rd_kafka_poll(producer, 0);
    rd_kafka_destroy(producer);
}

/* Partition count of topic from a metadata request (which also auto-creates it where
 * topics are created on first use), once each partition has a leader. */
static int topic_partitions(rd_kafka_t *rk, const char *topic, int timeout_ms)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    int n = -ENOENT;

    if (!rkt)
        return -ENOMEM;
    for (int64_t until = sf_mono_ms() + timeout_ms; n < 0 && sf_mono_ms() < until;) {
        if (rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            const struct rd_kafka_metadata_topic *t = md->topic_cnt == 1 ? &md->topics[0] : NULL;
            int led = t && t->err == RD_KAFKA_RESP_ERR_NO_ERROR && t->partition_cnt > 0;
            if (t && t->err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) {
                rd_kafka_metadata_destroy(md);
                rd_kafka_topic_destroy(rkt);
                return -EACCES; /* no DESCRIBE right: asking again changes nothing */
            }
            /* a topic just created (Apache Kafka) has its partitions' leaders a moment
             * later: until then nothing can be read or produced there */
            for (int i = 0; led && i < t->partition_cnt; i++)
                led = t->partitions[i].leader >= 0;
            if (led)
                n = t->partition_cnt;
            rd_kafka_metadata_destroy(md);
        }
        if (n < 0) {
            rd_kafka_poll(rk, 0); /* serves its error callback: refused credentials are told */
            usleep(50 * 1000);
        }
    }
    rd_kafka_topic_destroy(rkt);
    return n;
}

rd_kafka_topic_t *sf_kafka_topic(rd_kafka_t *producer, const char *topic)
{
    return rd_kafka_topic_new(producer, topic, NULL);
}

/* h (may be NULL) becomes librdkafka's when the message is queued, else stays the caller's. */
static int produce(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                   size_t n, rd_kafka_headers_t *h, delivery_cb *d)
{
    rd_kafka_topic_t *rkt = sf_kafka_topic(producer, topic);
    rd_kafka_resp_err_t err;

    if (!rkt)
        return -ENOMEM;
    if (h)
        err = rd_kafka_producev(producer, RD_KAFKA_V_RKT(rkt),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_KEY(key, key ? strlen(key) : 0),
                                RD_KAFKA_V_VALUE((void *)p, n), RD_KAFKA_V_HEADERS(h),
                                RD_KAFKA_V_OPAQUE(d), RD_KAFKA_V_END);
    else
        err = rd_kafka_producev(producer, RD_KAFKA_V_RKT(rkt),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_KEY(key, key ? strlen(key) : 0),
                                RD_KAFKA_V_VALUE((void *)p, n), RD_KAFKA_V_OPAQUE(d),
                                RD_KAFKA_V_END);
    rd_kafka_topic_destroy(rkt);

    switch (err) {
    case RD_KAFKA_RESP_ERR_NO_ERROR:
        return 0;
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
        return -ENOBUFS;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
        return -E2BIG;
    default:
        return -EIO;
    }
}

int sf_kafka_produce(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                     size_t n)
{
    return produce(producer, topic, key, p, n, NULL, NULL);
}

int sf_kafka_produce_h(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                       size_t n, rd_kafka_headers_t *h, void (*fn)(void *arg, int err), void *arg)
{
    delivery_cb *d = NULL;
    int rc;

    if (fn && !(d = malloc(sizeof(*d))))
        return -ENOMEM;
    if (d) {
        d->fn = fn;
        d->arg = arg;
    }
    if ((rc = produce(producer, topic, key, p, n, h, d)) < 0)
        free(d);
    return rc;
}

int sf_kafka_produce_cb(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                        size_t n, void (*fn)(void *arg, int err), void *arg)
{
    return sf_kafka_produce_h(producer, topic, key, p, n, NULL, fn, arg);
}

int sf_kafka_subscribe(rd_kafka_t *consumer, const char *topic)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_resp_err_t err;

    rd_kafka_topic_partition_list_add(l, topic, RD_KAFKA_PARTITION_UA);
    err = rd_kafka_subscribe(consumer, l);
    rd_kafka_topic_partition_list_destroy(l);
    return err ? -EIO : 0;
}

/* Assigns every partition at its committed offset (none: the beginning), asked here
 * rather than by librdkafka: an OffsetFetch its assign() sends that meets a group
 * coordinator still moving (Apache Kafka creating __consumer_offsets on a group's first
 * use, or a broker just lost) is answered NOT_COORDINATOR, and librdkafka 2.x never asks
 * again, so that partition is never read (librdkafka #5586). rd_kafka_committed is asked
 * again until it answers or timeout_ms ends. */
static int assign_committed(rd_kafka_t *consumer, const char *topic, int n, int timeout_ms)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    int64_t until = sf_mono_ms() + timeout_ms;
    rd_kafka_resp_err_t err;
    int ok = 0;

    for (int i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, topic, i);
    while (!ok && sf_mono_ms() < until) {
        int64_t left = until - sf_mono_ms();
        ok = rd_kafka_committed(consumer, l, (int)(left < 2000 ? left : 2000)) ==
             RD_KAFKA_RESP_ERR_NO_ERROR;
        for (int i = 0; ok && i < n; i++)
            ok = l->elems[i].err == RD_KAFKA_RESP_ERR_NO_ERROR;
        if (!ok)
            usleep(100 * 1000);
    }
    for (int i = 0; ok && i < n; i++)
        if (l->elems[i].offset < 0) /* nothing committed yet: auto.offset.reset's earliest */
            l->elems[i].offset = RD_KAFKA_OFFSET_BEGINNING;
    err = ok ? rd_kafka_assign(consumer, l) : RD_KAFKA_RESP_ERR__TIMED_OUT;
    rd_kafka_topic_partition_list_destroy(l);
    return err ? -EIO : 0;
}

int sf_kafka_topic_create(rd_kafka_t *rk, const char *topic, int timeout_ms)
{
    char errstr[256];
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, -1, -1, errstr, sizeof(errstr));
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *o = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    rd_kafka_event_t *ev = NULL;
    int rc = -EIO;

    if (!nt || !q || !o)
        goto out;
    rd_kafka_AdminOptions_set_request_timeout(o, timeout_ms, errstr, sizeof(errstr));
    rd_kafka_AdminOptions_set_operation_timeout(o, timeout_ms, errstr, sizeof(errstr));
    /* a gateway's or producer's answers matter for minutes: a day is plenty, and a topic
     * whose gateway is gone for good does not stay forever */
    if (!strncmp(topic, SF_TOPIC_REPLY_PREFIX, strlen(SF_TOPIC_REPLY_PREFIX)))
        rd_kafka_NewTopic_set_config(nt, "retention.ms", SF_KAFKA_REPLY_RETENTION_MS);
    rd_kafka_CreateTopics(rk, &nt, 1, o, q);
    if ((ev = rd_kafka_queue_poll(q, timeout_ms + 1000)) &&
        rd_kafka_event_type(ev) == RD_KAFKA_EVENT_CREATETOPICS_RESULT) {
        size_t n = 0;
        const rd_kafka_topic_result_t **res =
            rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
        rd_kafka_resp_err_t err = n == 1 ? rd_kafka_topic_result_error(res[0])
                                         : rd_kafka_event_error(ev);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
            rc = 0;
        else if (err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
                 err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED)
            rc = -EPERM; /* the operator creates it (ACLs): it may well exist */
    }
out:
    if (ev)
        rd_kafka_event_destroy(ev);
    if (o)
        rd_kafka_AdminOptions_destroy(o);
    if (q)
        rd_kafka_queue_destroy(q);
    if (nt)
        rd_kafka_NewTopic_destroy(nt);
    return rc;
}

int sf_kafka_assign_all(rd_kafka_t *consumer, rd_kafka_t *producer, const char *topic,
                        int64_t start_offset, int timeout_ms)
{
    rd_kafka_topic_partition_list_t *l;
    rd_kafka_resp_err_t err;
    int n;

    /* the topic may not exist yet where topics are not created on first use (Apache Kafka
     * with auto.create.topics.enable=false, as ops/RUNBOOK.md advises): this reader makes it.
     * Refused (no CREATE right): it must exist already, as the metadata below tells. */
    (void)sf_kafka_topic_create(producer, topic, timeout_ms < 5000 ? timeout_ms : 5000);
    n = topic_partitions(producer, topic, timeout_ms);

    if (n < 0)
        return n;
    if (start_offset == RD_KAFKA_OFFSET_STORED)
        return assign_committed(consumer, topic, n, timeout_ms);
    l = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++) {
        int64_t off = start_offset, lo, hi;
        /* "the end" is resolved now, not at the first fetch: a message produced between
         * the assignment and that fetch would be skipped */
        if (start_offset == RD_KAFKA_OFFSET_END) {
            /* (a topic just created is known to some brokers a moment before the others:
             * asked again until timeout_ms ends) */
            int64_t until = sf_mono_ms() + timeout_ms;
            rd_kafka_resp_err_t e;
            while ((e = rd_kafka_query_watermark_offsets(consumer, topic, i, &lo, &hi,
                                                         timeout_ms)) !=
                       RD_KAFKA_RESP_ERR_NO_ERROR &&
                   sf_mono_ms() < until)
                usleep(100 * 1000);
            if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
                rd_kafka_topic_partition_list_destroy(l);
                return -EIO;
            }
            off = hi;
        }
        rd_kafka_topic_partition_list_add(l, topic, i)->offset = off;
    }
    err = rd_kafka_assign(consumer, l);
    rd_kafka_topic_partition_list_destroy(l);
    return err ? -EIO : 0;
}

/* ---- pump ---- */

struct sf_kafka_pump {
    rd_kafka_t *consumer, *producer;
    rd_kafka_queue_t *queue, *pqueue; /* the consumer's queue; the producer's (reports) */
    int fds[2];
    struct event *ev_wake, *ev_tick;
    sf_kafka_msg_cb cb;
    void *arg;
};

static void pump_drain(sf_kafka_pump *p)
{
    /* Bounded per turn so other events run; the tick picks up the rest. */
    for (int i = 0; i < 512; i++) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(p->consumer, 0);
        consumer_hooks *h;
        if (!m)
            return;
        if (m->err && (h = rd_kafka_opaque(p->consumer)))
            refused(h->s, m->err, m->rkt ? rd_kafka_topic_name(m->rkt) : NULL);
        p->cb(p->arg, m);
        rd_kafka_message_destroy(m);
    }
    event_active(p->ev_wake, EV_READ, 0);
}

static void pump_on_wake(evutil_socket_t fd, short what, void *arg)
{
    sf_kafka_pump *p = arg;
    char sink[64];

    while (read(fd, sink, sizeof(sink)) > 0)
        ;
    if (p->producer)
        rd_kafka_poll(p->producer, 0);
    pump_drain(p);
}

static void pump_on_tick(evutil_socket_t fd, short what, void *arg)
{
    sf_kafka_pump *p = arg;

    if (p->producer)
        rd_kafka_poll(p->producer, 0);
    pump_drain(p);
}

sf_kafka_pump *sf_kafka_pump_new(struct event_base *base, rd_kafka_t *consumer,
                                 rd_kafka_t *producer, sf_kafka_msg_cb cb, void *arg)
{
    sf_kafka_pump *p = calloc(1, sizeof(*p));
    struct timeval tick = {0, 50 * 1000};

    if (!p)
        return NULL;
    p->consumer = consumer;
    p->producer = producer;
    p->cb = cb;
    p->arg = arg;
    p->fds[0] = p->fds[1] = -1;
    rd_kafka_poll_set_consumer(consumer);
    if (!(p->queue = rd_kafka_queue_get_consumer(consumer)))
        goto fail;
    if (pipe2(p->fds, O_NONBLOCK | O_CLOEXEC) < 0)
        goto fail;
    p->ev_wake = event_new(base, p->fds[0], EV_READ | EV_PERSIST, pump_on_wake, p);
    p->ev_tick = event_new(base, -1, EV_PERSIST, pump_on_tick, p);
    if (!p->ev_wake || !p->ev_tick)
        goto fail;
    rd_kafka_queue_io_event_enable(p->queue, p->fds[1], "w", 1);
    /* delivery reports wake the loop too: a job's offset moves as soon as its forward or
     * reply is confirmed, not at the next tick */
    if (producer && (p->pqueue = rd_kafka_queue_get_main(producer)))
        rd_kafka_queue_io_event_enable(p->pqueue, p->fds[1], "w", 1);
    event_add(p->ev_wake, NULL);
    event_add(p->ev_tick, &tick);
    return p;
fail:
    sf_kafka_pump_free(p);
    return NULL;
}

void sf_kafka_pump_free(sf_kafka_pump *p)
{
    if (!p)
        return;
    if (p->queue) {
        rd_kafka_queue_io_event_enable(p->queue, -1, NULL, 0);
        rd_kafka_queue_destroy(p->queue);
    }
    if (p->pqueue) {
        rd_kafka_queue_io_event_enable(p->pqueue, -1, NULL, 0);
        rd_kafka_queue_destroy(p->pqueue);
    }
    if (p->ev_wake)
        event_free(p->ev_wake);
    if (p->ev_tick)
        event_free(p->ev_tick);
    if (p->fds[0] >= 0)
        close(p->fds[0]);
    if (p->fds[1] >= 0)
        close(p->fds[1]);
    free(p);
}

/* ---- offset tracker ---- */

typedef struct track_part {
    int64_t *offs;  /* in-flight offsets in arrival order; done ones are negated-1 */
    size_t head, len, cap;
} track_part;

#define TRACK_MAX_PARTS 256

struct sf_kafka_track {
    rd_kafka_t *consumer;
    char *topic;
    track_part parts[TRACK_MAX_PARTS];
};

sf_kafka_track *sf_kafka_track_new(rd_kafka_t *consumer, const char *topic)
{
    sf_kafka_track *t = calloc(1, sizeof(*t));

    if (!t || !(t->topic = strdup(topic))) {
        free(t);
        return NULL;
    }
    t->consumer = consumer;
    return t;
}

void sf_kafka_track_free(sf_kafka_track *t)
{
    if (!t)
        return;
    for (int i = 0; i < TRACK_MAX_PARTS; i++)
        free(t->parts[i].offs);
    free(t->topic);
    free(t);
}

int sf_kafka_track_begin(sf_kafka_track *t, int32_t partition, int64_t offset)
{
    track_part *tp;

    if (partition < 0 || partition >= TRACK_MAX_PARTS || offset < 0)
        return -EINVAL;
    tp = &t->parts[partition];
    if (tp->head > 0 && tp->head == tp->len) {
        tp->head = tp->len = 0;
    } else if (tp->len == tp->cap && tp->head > 0) {
        memmove(tp->offs, tp->offs + tp->head, (tp->len - tp->head) * sizeof(int64_t));
        tp->len -= tp->head;
        tp->head = 0;
    }
    if (tp->len == tp->cap) {
        size_t cap = tp->cap ? tp->cap * 2 : 64;
        int64_t *n = realloc(tp->offs, cap * sizeof(int64_t));
        if (!n)
            return -ENOMEM;
        tp->offs = n;
        tp->cap = cap;
    }
    tp->offs[tp->len++] = offset;
    return 0;
}

void sf_kafka_track_end(sf_kafka_track *t, sf_kafka_ticket tk)
{
    track_part *tp;
    int64_t store = -1;

    if (tk.partition < 0 || tk.partition >= TRACK_MAX_PARTS)
        return;
    tp = &t->parts[tk.partition];
    for (size_t i = tp->head; i < tp->len; i++) {
        if (tp->offs[i] == tk.offset) {
            tp->offs[i] = -tk.offset - 1;
            break;
        }
    }
    while (tp->head < tp->len && tp->offs[tp->head] < 0)
        store = -tp->offs[tp->head++] - 1;
    if (store >= 0) {
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, t->topic, tk.partition)->offset = store + 1;
        rd_kafka_offsets_store(t->consumer, l);
        rd_kafka_topic_partition_list_destroy(l);
    }
}

void sf_kafka_track_reset(sf_kafka_track *t, int32_t partition)
{
    if (partition < 0 || partition >= TRACK_MAX_PARTS)
        return;
    t->parts[partition].head = t->parts[partition].len = 0;
}

