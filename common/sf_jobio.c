#include "sf_jobio.h"
#include "sf_trace.h"
#include "sf_jobauth.h"
#include "sf_kafka.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_TOO_LARGE                                                                         \
    "The answer to this call is larger than the 1 MiB message limit; ask for less (a smaller " \
    "limit, a narrower filter or path) and retry."

int sf_jobio_encode_error(const sf_job *job, const char *code, const char *message, sf_buf *out)
{
    return sf_reply_encode_error(job->id, code, message, out);
}

int sf_jobio_encode_result(const sf_job *job, const json_t *result, const sf_claims *claims,
                           sf_buf *out)
{
    sf_reply r;
    int rc;

    sf_reply_init(&r);
    snprintf(r.id, sizeof(r.id), "%s", job->id);
    r.kind = SF_REPLY_RESULT;
    r.result = (json_t *)result;
    if (claims)
        r.claims = *claims;
    rc = sf_reply_encode(&r, out);
    if (rc == -E2BIG) { /* the caller still gets its one answer */
        sf_buf_reset(out);
        rc = sf_reply_encode_error(job->id, SF_ERR_LIMIT, MSG_TOO_LARGE, out);
    }
    return rc;
}

/* (a reply nobody waits on for the offset: progress, a malformed message's answer) */
static int jobio_send(rd_kafka_t *producer, const sf_job *job, const void *p, size_t n)
{
    return sf_kafka_produce(producer, job->reply, job->id, p, n);
}

int sf_jobio_progress(rd_kafka_t *producer, const sf_job *job, const json_t *progress)
{
    sf_reply r;
    sf_buf b;
    int rc;

    sf_reply_init(&r);
    snprintf(r.id, sizeof(r.id), "%s", job->id);
    r.kind = SF_REPLY_PROGRESS;
    r.result = (json_t *)progress;
    sf_buf_init(&b, SF_MSG_MAX);
    rc = sf_reply_encode(&r, &b);
    if (rc == 0)
        rc = jobio_send(producer, job, b.p, b.len);
    sf_buf_fini(&b);
    return rc;
}

void sf_jobio_reject(rd_kafka_t *producer, const rd_kafka_message_t *msg, const char *why)
{
    sf_job job;
    char text[512];
    sf_buf b;

    sf_kafka_produce(producer, SF_TOPIC_DEAD, "malformed", msg->payload, msg->len);
    sf_job_init(&job);
    if (sf_job_peek_reply(msg->payload, msg->len, job.id, job.reply) < 0)
        return;
    snprintf(text, sizeof(text), "The job could not be read (%s); fix the envelope and resend it.",
             why);
    sf_buf_init(&b, SF_MSG_MAX);
    if (sf_jobio_encode_error(&job, SF_ERR_INVALID, text, &b) == 0)
        jobio_send(producer, &job, b.p, b.len);
    sf_buf_fini(&b);
}

struct sf_jobq {
    rd_kafka_t *producer, *consumer;
    sf_kafka_pump *pump;
    sf_kafka_track *track;
    sf_jobq_job_cb on_job;
    sf_jobq_bad_cb on_bad;
    void *arg;
    size_t holds;   /* sf_jobq_hold alive (each send holds one until Kafka confirmed it) */
    int freed;      /* sf_jobq_free ran: the last hold to go frees q */
};

struct sf_jobq_hold {
    sf_jobq *q;
    sf_kafka_ticket tk;
    size_t refs;        /* the holder's (until released), and one per send not confirmed */
    char id[SF_ID_MAX]; /* (for a stage stamp: sf_trace.h) */
};

sf_jobq_hold *sf_jobq_hold_new(sf_jobq *q, sf_kafka_ticket tk, const char *job_id)
{
    sf_jobq_hold *h = malloc(sizeof(*h));

    if (!h)
        return NULL;
    h->q = q;
    h->tk = tk;
    h->refs = 1;
    h->id[0] = 0;
    if (sf_trace_enabled)
        snprintf(h->id, sizeof(h->id), "%s", job_id);
    q->holds++;
    return h;
}

/* Drops one reference; the last ends the ticket (end: 0 when the ticket is to stay the
 * caller's, as sf_jobq_send's failure leaves it). */
static void hold_unref(sf_jobq_hold *h, int end)
{
    sf_jobq *q = h->q;

    if (--h->refs > 0)
        return;
    q->holds--;
    if (!q->freed) {
        if (end)
            sf_kafka_track_end(q->track, h->tk);
    } else if (q->holds == 0) {
        free(q);
    }
    free(h);
}

void sf_jobq_hold_release(sf_jobq_hold *h)
{
    if (h)
        hold_unref(h, 1);
}

/* (on the thread that polls the producer: the event loop, or the producer's flush) */
static void on_sent(void *arg, int err)
{
    sf_jobq_hold *h = arg;

    /* refused for good (30 s of retries) ends it too: an answer that cannot be sent must
     * not hold back every later offset of its partition */
    SF_TRACE(h->id, "dr", err);
    hold_unref(h, 1);
}

int sf_jobq_hold_send(sf_jobq_hold *h, rd_kafka_t *producer, const char *topic,
                      const char *key, const void *p, size_t n, rd_kafka_headers_t *hdrs)
{
    int rc;

    h->refs++;
    if ((rc = sf_kafka_produce_h(producer, topic, key, p, n, hdrs, on_sent, h)) < 0) {
        h->refs--;
        return rc;
    }
    SF_TRACE(h->id, "out", 0);
    return 0;
}

int sf_jobq_send(sf_jobq *q, rd_kafka_t *producer, const char *topic, const char *key,
                 const void *p, size_t n, rd_kafka_headers_t *hdrs, sf_kafka_ticket tk,
                 const char *job_id)
{
    sf_jobq_hold *h = sf_jobq_hold_new(q, tk, job_id);
    int rc;

    if (!h)
        return -ENOMEM;
    rc = sf_jobq_hold_send(h, producer, topic, key, p, n, hdrs);
    hold_unref(h, rc == 0); /* not queued: tk stays the caller's */
    return rc;
}

static void jobq_on_message(void *arg, rd_kafka_message_t *msg)
{
    sf_jobq *q = arg;
    sf_kafka_ticket tk = {msg->partition, msg->offset};
    const char *why = NULL;
    sf_job job;

    if (msg->err) {
        if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            q->on_bad(q->arg, msg, rd_kafka_message_errstr(msg));
        return;
    }
    sf_kafka_track_begin(q->track, msg->partition, msg->offset);
    if (sf_job_decode(msg->payload, msg->len, &job, &why) < 0) {
        sf_jobio_reject(q->producer, msg, why);
        q->on_bad(q->arg, msg, why);
        sf_kafka_track_end(q->track, tk);
        return;
    }
    sf_jobauth_read(msg, &job.auth);
    SF_TRACE(job.id, "in", msg->partition);
    q->on_job(q->arg, &job, tk);
}

static void jobq_on_revoke(void *arg, int32_t partition)
{
    sf_jobq *q = arg;
    sf_kafka_track_reset(q->track, partition);
}

sf_jobq *sf_jobq_new(struct event_base *base, rd_kafka_t *consumer, rd_kafka_t *producer,
                     const char *topic, sf_jobq_job_cb on_job, sf_jobq_bad_cb on_bad, void *arg)
{
    sf_jobq *q = calloc(1, sizeof(*q));

    if (!q)
        return NULL;
    q->producer = producer;
    q->on_job = on_job;
    q->on_bad = on_bad;
    q->arg = arg;
    if (!(q->track = sf_kafka_track_new(consumer, topic)) ||
        !(q->pump = sf_kafka_pump_new(base, consumer, producer, jobq_on_message, q))) {
        sf_jobq_free(q);
        return NULL;
    }
    q->consumer = consumer;
    sf_kafka_on_revoke(consumer, jobq_on_revoke, q);
    return q;
}

void sf_jobq_done(sf_jobq *q, sf_kafka_ticket tk)
{
    sf_kafka_track_end(q->track, tk);
}

void sf_jobq_free(sf_jobq *q)
{
    if (!q)
        return;
    if (q->consumer)
        sf_kafka_on_revoke(q->consumer, NULL, NULL);
    sf_kafka_pump_free(q->pump);
    sf_kafka_track_free(q->track);
    q->pump = NULL;
    q->track = NULL;
    if (q->holds > 0) { /* confirmations still to come (the producer's flush) */
        q->freed = 1;
        return;
    }
    free(q);
}

/* Length of the valid UTF-8 sequence at s (max n bytes), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    size_t len;
    uint32_t cp;

    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xe0) == 0xc0)
        len = 2, cp = s[0] & 0x1f;
    else if ((s[0] & 0xf0) == 0xe0)
        len = 3, cp = s[0] & 0x0f;
    else if ((s[0] & 0xf8) == 0xf0)
        len = 4, cp = s[0] & 0x07;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

char *sf_utf8_clean(const char *s, size_t n, size_t *outlen)
{
    const unsigned char *u = (const unsigned char *)s;
    char *out = malloc(n * 3 + 1), *o = out;

    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq(u + i, n - i);
        if (l == 0 || (l == 1 && u[i] == 0)) {
            memcpy(o, "\xef\xbf\xbd", 3); /* U+FFFD; NUL too, so the text stays a C string */
            o += 3;
            i++;
        } else {
            memcpy(o, u + i, l);
            o += l;
            i += l;
        }
    }
    *o = '\0';
    if (outlen)
        *outlen = (size_t)(o - out);
    return out;
}
