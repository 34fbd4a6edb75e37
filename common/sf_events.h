/* sf_events: sandbox lifecycle events on the sf.events topic (audit, billing): one JSON
 * object per event, keyed by sandbox id (so one sandbox's events stay in order), at least
 * once (a consumer drops repeats by `id`). schemas/events.md is the contract. */
#ifndef SF_EVENTS_H
#define SF_EVENTS_H

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#define SF_TOPIC_EVENTS "sf.events"

/* type: "created", "paused", "resumed", "killed", "lost" or "failed" (sent as
 * "sandbox.<type>"). extra: more fields (borrowed; NULL for none). 0 or -errno (the
 * producer's queue is full: -ENOBUFS). */
int sf_event_emit(rd_kafka_t *producer, const char *type, const char *team, const char *sandbox,
                  const char *host, const json_t *extra);

#endif
