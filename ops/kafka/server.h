/* kb_server: the broker's connections and request handlers on one libevent loop. Speaks
 * the non-flexible versions of the Kafka APIs librdkafka needs (and ApiVersions v0-v3),
 * advertising exactly those; one request per connection at a time, answers in order (a
 * Fetch or a group request that waits holds its connection's later requests, as Kafka's
 * brokers do). Fetch long-polls: answered as soon as a partition it names has data (or
 * min_bytes), else when its max_wait ends. */
#ifndef KB_SERVER_H
#define KB_SERVER_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_server_cfg {
    const char *host;        /* the address listened on and advertised */
    int port;
    int32_t partitions;      /* sf.jobs's partitions */
    int32_t auto_partitions; /* partitions of topics created on first use */
    size_t part_cap;         /* bytes kept per partition */
    size_t max_request;      /* the largest request accepted */
} kb_server_cfg;

typedef struct kb_server kb_server;

/* Serves connections accepted on fd (listening, non-blocking; the server owns it; -1: none,
 * for the fuzz harness). NULL on failure (errno). */
kb_server *kb_server_new(struct event_base *base, const kb_server_cfg *cfg, int fd);
void kb_server_free(kb_server *s);
/* One log line of counts: requests per API, fetches answered with data / empty at their
 * wait's end, bytes in and out, CPU time. */
void kb_server_log_stats(const kb_server *s);

#endif
