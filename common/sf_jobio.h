/* sf_jobio: answering jobs over Kafka, shared by the scheduler and the workers. */
#ifndef SF_JOBIO_H
#define SF_JOBIO_H

#include "sf_codec.h"
#include "sf_kafka.h"

#include <librdkafka/rdkafka.h>

/* A `progress` reply (schemas/envelope.md: {stream, data} or {message}) for a job that asked for
 * progress; any number may precede its final reply. Not taken over. */
int sf_jobio_progress(rd_kafka_t *producer, const sf_job *job, const json_t *progress);
/* A reply's bytes: an error, or a result naming its claim fields (claims may be NULL;
 * sf_claim.h); a result that does not fit in one message (SF_MSG_MAX) becomes a
 * limit_exceeded error instead, so the caller always gets its answer. Sent through the
 * job's call (sf_call.h), whose offset waits for it. 0 or -errno. */
int sf_jobio_encode_error(const sf_job *job, const char *code, const char *message, sf_buf *out);
int sf_jobio_encode_result(const sf_job *job, const json_t *result, const sf_claims *claims,
                           sf_buf *out);
/* A message that is not a valid job: copies it to the dead-letter topic and, when its
 * id and reply topic can still be read, tells the caller why. */
void sf_jobio_reject(rd_kafka_t *producer, const rd_kafka_message_t *msg, const char *why);

/* A job consumer: drives a consumer from the event loop, decodes each message, rejects
 * malformed ones (sf_jobio_reject) and hands valid jobs over; offsets are stored only
 * when the job is done (sf_jobq_done), in order per partition. */
typedef struct sf_jobq sf_jobq;
/* job: decoded; the callee takes it over (copy the struct, sf_job_fini it when done) and
 * must call sf_jobq_done(q, tk) exactly once when its work is finished. */
typedef void (*sf_jobq_job_cb)(void *arg, sf_job *job, sf_kafka_ticket tk);
/* A message that was not a job (already dead-lettered), or a consumer error (why then
 * is librdkafka's text); for the caller's log. */
typedef void (*sf_jobq_bad_cb)(void *arg, const rd_kafka_message_t *msg, const char *why);

sf_jobq *sf_jobq_new(struct event_base *base, rd_kafka_t *consumer, rd_kafka_t *producer,
                     const char *topic, sf_jobq_job_cb on_job, sf_jobq_bad_cb on_bad, void *arg);
void sf_jobq_done(sf_jobq *q, sf_kafka_ticket tk);
/* Produces p (the job's forward or reply) and ends tk once Kafka confirmed it (or finally
 * refused it), so an offset never moves past a job whose answer could still be lost; h: its
 * Kafka headers (NULL: none; librdkafka's once queued, else still the caller's). 0,
 * or -errno with tk still the caller's (the message was not queued). job_id names the job
 * in stage stamps (sf_trace.h). */
int sf_jobq_send(sf_jobq *q, rd_kafka_t *producer, const char *topic, const char *key,
                 const void *p, size_t n, rd_kafka_headers_t *h, sf_kafka_ticket tk,
                 const char *job_id);
/* A ticket several sends share (sf_call.h: a reply, then the forwards that continue the
 * job): tk ends once the holder released it and Kafka confirmed (or finally refused)
 * every message sent under it. new: NULL when out of memory (tk still the caller's);
 * send: 0, or -errno (not queued, nothing held); release: once, NULL accepted. */
typedef struct sf_jobq_hold sf_jobq_hold;
sf_jobq_hold *sf_jobq_hold_new(sf_jobq *q, sf_kafka_ticket tk, const char *job_id);
int sf_jobq_hold_send(sf_jobq_hold *h, rd_kafka_t *producer, const char *topic,
                      const char *key, const void *p, size_t n, rd_kafka_headers_t *hdrs);
void sf_jobq_hold_release(sf_jobq_hold *h);
/* q lives on after this until the last hold is gone (the producer's flush confirms). */
void sf_jobq_free(sf_jobq *q);

/* Replaces invalid UTF-8 in s[0..n) with U+FFFD; returns a new NUL-terminated string
 * (length in *outlen) or NULL when out of memory. */
char *sf_utf8_clean(const char *s, size_t n, size_t *outlen);

#endif
