/* sf_call: one job's deadline, answer and offset (sf_call.h). */
#include "sf_call.h"

#include <errno.h>

int sf_call_init(sf_call *c, sf_jobq *q, rd_kafka_t *producer, const sf_job *job,
                 sf_kafka_ticket tk)
{
    sf_jobq_hold *h = sf_jobq_hold_new(q, tk, job->id);

    if (!h)
        return -ENOMEM;
    *c = (sf_call){.job = job, .producer = producer, .ticket = tk, .hold = h};
    return 0;
}

int sf_call_expired(const sf_call *c, int64_t now_ms)
{
    return c->job->deadline_ms < now_ms;
}

int sf_call_answer(sf_call *c, const void *p, size_t n)
{
    if (c->answered || c->silent) {
        c->answered = 1;
        return -EALREADY;
    }
    c->answered = 1;
    if (!c->hold)
        return -EALREADY; /* ended: nothing may be sent for it any more */
    return sf_jobq_hold_send(c->hold, c->producer, c->job->reply, c->job->id, p, n, NULL);
}

static int answer_buf(sf_call *c, sf_buf *b, int rc)
{
    if (rc == 0)
        rc = sf_call_answer(c, b->p, b->len);
    else
        c->answered = 1; /* (encode failed: no other answer either) */
    sf_buf_fini(b);
    return rc;
}

int sf_call_error(sf_call *c, const char *code, const char *message)
{
    sf_buf b;

    if (c->answered || c->silent)
        return sf_call_answer(c, NULL, 0);
    sf_buf_init(&b, SF_MSG_MAX);
    return answer_buf(c, &b, sf_jobio_encode_error(c->job, code, message, &b));
}

int sf_call_result(sf_call *c, const json_t *result, const sf_claims *claims)
{
    sf_buf b;

    if (c->answered || c->silent)
        return sf_call_answer(c, NULL, 0);
    sf_buf_init(&b, SF_MSG_MAX);
    return answer_buf(c, &b, sf_jobio_encode_result(c->job, result, claims, &b));
}

int sf_call_send(sf_call *c, const char *topic, const char *key, const void *p, size_t n,
                 rd_kafka_headers_t *h)
{
    if (!c->hold)
        return -EALREADY;
    return sf_jobq_hold_send(c->hold, c->producer, topic, key, p, n, h);
}

void sf_call_end(sf_call *c)
{
    sf_jobq_hold_release(c->hold);
    c->hold = NULL;
}
