/* sf_call: the life of one job a daemon took off its queue (sf_jobq), the part the
 * scheduler and the workers share: its deadline, its one answer (encoded, sent to the
 * job's reply topic), the other messages that continue it (a forward), and its offset,
 * which moves only once the call ended and Kafka confirmed every message it sent. What a
 * daemon adds (its context, its log lines, the worker's job guard and claims) stays in
 * its own call module (scheduler/call.c, worker/call.c).
 *
 * Exactly once: the first answer wins; any later one is refused (-EALREADY) and sends
 * nothing. A silent call (an internal message such as sf.cancel) is never answered: its
 * answer counts as given and nothing is sent.
 *
 * The worker's wk_call embeds one beside its sf_job (sf_call_init in wk_on_job) and
 * answers with the guard's encoded bytes (sf_call_answer); the scheduler's sch_call uses
 * the encoding ones. Neither calls sf_jobq_send or sf_jobq_done for a call directly.
 *
 * Threads: the event loop's only (the producer's delivery reports run there too).
 * Library code: nothing here logs; the caller logs the -errno it gets. */
#ifndef SF_CALL_H
#define SF_CALL_H

#include "sf_codec.h"
#include "sf_jobio.h"

typedef struct sf_call {
    const sf_job *job;      /* the caller's (it lives beside this struct, as long) */
    rd_kafka_t *producer;
    sf_kafka_ticket ticket; /* the job's message: partition and offset */
    sf_jobq_hold *hold;     /* its offset, until sf_call_end */
    int answered;           /* the one answer was sent (or, silent, given up) */
    int silent;             /* an internal message: never answered */
} sf_call;

/* Takes over tk for job (which the caller keeps, unchanged, until sf_call_end). 0, or
 * -ENOMEM with tk still the caller's (sf_jobq_done it). */
int sf_call_init(sf_call *c, sf_jobq *q, rd_kafka_t *producer, const sf_job *job,
                 sf_kafka_ticket tk);
/* 1 when the job's deadline (wall clock, ms) is before now_ms: nobody waits for it. */
int sf_call_expired(const sf_call *c, int64_t now_ms);
/* The one answer, as encoded bytes (the worker keeps them in its guard first), an error,
 * or a result (not taken over; claims may be NULL). 0: queued, the offset waits for
 * Kafka's confirmation; -EALREADY: answered before, or silent (nothing sent); another
 * -errno: not queued (encode failed, or Kafka's queue refused it): the call counts as
 * answered all the same, so a caller never tries a second, different answer. */
int sf_call_answer(sf_call *c, const void *p, size_t n);
int sf_call_error(sf_call *c, const char *code, const char *message);
int sf_call_result(sf_call *c, const json_t *result, const sf_claims *claims);
/* Another message the job's offset waits for (a forward to a host: topic, key, and its
 * Kafka headers, librdkafka's once queued, else still the caller's). 0 or -errno. */
int sf_call_send(sf_call *c, const char *topic, const char *key, const void *p, size_t n,
                 rd_kafka_headers_t *h);
/* The call's work is over: the offset moves once every message it sent is confirmed.
 * Once; later calls do nothing. Does not touch the job. */
void sf_call_end(sf_call *c);

#endif
