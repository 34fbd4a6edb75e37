/* sf_jobio: answering jobs over Kafka, shared by the scheduler and the workers. */
#ifndef SF_JOBIO_H
#define SF_JOBIO_H

#include "sf_codec.h"

#include <librdkafka/rdkafka.h>

/* Produce an error / result reply to the job's reply topic (keyed by job id).
 * 0 or negative errno. sf_jobio_result does not take ownership of result. */
int sf_jobio_error(rd_kafka_t *producer, const sf_job *job, const char *code, const char *message);
int sf_jobio_result(rd_kafka_t *producer, const sf_job *job, const json_t *result);
/* A message that is not a valid job: copies it to the dead-letter topic and, when its
 * id and reply topic can still be read, tells the caller why. */
void sf_jobio_reject(rd_kafka_t *producer, const rd_kafka_message_t *msg, const char *why);

/* Replaces invalid UTF-8 in s[0..n) with U+FFFD; returns a new NUL-terminated string
 * (length in *outlen) or NULL when out of memory. */
char *sf_utf8_clean(const char *s, size_t n, size_t *outlen);

#endif
