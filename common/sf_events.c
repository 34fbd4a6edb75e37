#include "sf_events.h"
#include "sf_kafka.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sf_event_emit(rd_kafka_t *producer, const char *type, const char *team, const char *sandbox,
                  const char *host, const json_t *extra)
{
    char id[SF_ID_MAX], kind[64];
    json_t *ev;
    char *text;
    int rc;

    if (!producer || !type || !team || !sandbox)
        return -EINVAL;
    if (sf_id_new(id, "ev_") < 0)
        return -EIO;
    snprintf(kind, sizeof(kind), "sandbox.%s", type);
    if (!(ev = json_pack("{s:i, s:s, s:s, s:I, s:s, s:s, s:s}", "v", 1, "id", id, "type", kind,
                         "ts", (json_int_t)sf_now_ms(), "team", team, "sandbox", sandbox, "host",
                         host ? host : "")))
        return -ENOMEM;
    if (extra && json_is_object(extra))
        json_object_update_missing(ev, (json_t *)extra);
    text = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    if (!text)
        return -ENOMEM;
    rc = sf_kafka_produce(producer, SF_TOPIC_EVENTS, sandbox, text, strlen(text));
    free(text);
    return rc;
}
