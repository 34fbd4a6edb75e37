/* sf_kafka: thin librdkafka helpers: producer/consumer set-up from one settings
 * struct, a libevent pump that drains a consumer when its queue wakes, and an
 * offset tracker so offsets are stored only after the work is done, in order. */
#ifndef SF_KAFKA_H
#define SF_KAFKA_H

#include <event2/event.h>
#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#define SF_TOPIC_JOBS "sf.jobs"
#define SF_TOPIC_HOST_PREFIX "sf.host."
#define SF_TOPIC_REPLY_PREFIX "sf.reply."
#define SF_TOPIC_DEAD "sf.dead"

/* The password file's content: at most this many bytes (one line; a final newline is
 * dropped). */
#define SF_KAFKA_PASSWORD_MAX 512

typedef struct sf_kafka_settings {
    const char *brokers;       /* bootstrap.servers */
    /* Credentials (sf_kafka_security_set fills them): security.protocol (NULL: plaintext),
     * sasl.mechanism, sasl.username and sasl.password, for producers, consumers and the
     * admin calls alike. */
    const char *security_protocol;
    const char *sasl_mechanism;
    const char *sasl_username;
    char sasl_password[SF_KAFKA_PASSWORD_MAX + 1];
    int fetch_wait_ms;         /* fetch.wait.max.ms: the broker holds an idle fetch this long
                                * (long-poll: data is answered at once), 100-500 */
    int session_timeout_ms;    /* session.timeout.ms (3000-6000 for the embedded broker) */
    int linger_ms;             /* linger.ms for producers (0-5) */
    /* Called (from the pump's poll) for each message Kafka finally refused; may be NULL. */
    void (*on_delivery_error)(const char *topic, const char *err);
    /* Called (from the producer's poll) when no broker can be reached; may be NULL. */
    void (*on_brokers_down)(void *arg);
    void *down_arg;
    /* Called (from a poll of any client made with these settings) when Kafka refused this
     * client's credentials or its ACLs refused an operation: sentence is what to fix
     * (sf_kafka_err_hint), detail librdkafka's words (a topic, a reason); may be NULL. */
    void (*on_refused)(const char *sentence, const char *detail);
} sf_kafka_settings;

/* Fills s's credentials from the kafka_* settings (common/sf_daemon.h): protocol
 * plaintext, sasl_plaintext or sasl_ssl (any case); with SASL, mechanism PLAIN,
 * SCRAM-SHA-256 or SCRAM-SHA-512, a username and the password read from password_file
 * (never from the environment or argv). s keeps pointers to the strings given. 0, or
 * -EINVAL (a bad value) or a negative errno (the file) with one sentence in why naming the
 * setting; s is touched only on success. */
int sf_kafka_security_set(sf_kafka_settings *s, const char *protocol, const char *mechanism,
                          const char *username, const char *password_file, char *why,
                          size_t whylen);
/* One actionable sentence for an error the operator must fix (credentials refused, an ACL
 * missing: it names the setting or the ACL to check), NULL for any other error. */
const char *sf_kafka_err_hint(rd_kafka_resp_err_t err);

/* why gets librdkafka's own message. NULL on failure. s must outlive the producer. */
rd_kafka_t *sf_kafka_producer_new(const sf_kafka_settings *s, char *why, size_t whylen);
/* A consumer in group `group`; offsets are stored by the application (sf_kafka_track)
 * and committed automatically every 200 ms. */
rd_kafka_t *sf_kafka_consumer_new(const sf_kafka_settings *s, const char *group, char *why,
                                  size_t whylen);
/* fn runs for each partition the group takes away from this consumer (eager rebalance). */
void sf_kafka_on_revoke(rd_kafka_t *consumer, void (*fn)(void *arg, int32_t partition),
                        void *arg);
/* Leaves the group (committing stored offsets) and destroys; NULL-safe. */
void sf_kafka_consumer_free(rd_kafka_t *consumer);
/* Delivers what is queued (up to 2 s) and destroys; NULL-safe. */
void sf_kafka_producer_free(rd_kafka_t *producer);
/* The producer's handle of topic, for rd_kafka_producev's RD_KAFKA_V_RKT (release it with
 * rd_kafka_topic_destroy; NULL when out of memory). Every produce goes through one:
 * rd_kafka_topic_new() asks a topic new to the producer for its leader at once, while
 * librdkafka 2.0's producev given a topic name waits for its 1 s metadata timer (fixed in
 * 2.10.1, librdkafka #5032), so a worker's first reply to a new gateway or batch reply
 * topic waited up to 1 s. */
rd_kafka_topic_t *sf_kafka_topic(rd_kafka_t *producer, const char *topic);
/* Copies the payload; never blocks. 0 or a negative errno (queue full: -ENOBUFS). */
int sf_kafka_produce(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                     size_t n);
/* The same, and fn(arg, 0 or -EIO) once Kafka confirmed or finally refused the message
 * (from the producer's poll; also when the producer is destroyed). */
int sf_kafka_produce_cb(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                        size_t n, void (*fn)(void *arg, int err), void *arg);
/* The same with Kafka headers h (NULL: none; librdkafka's once queued, still the caller's
 * when this fails) and fn optional (NULL: no confirmation wanted). */
int sf_kafka_produce_h(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                       size_t n, rd_kafka_headers_t *h, void (*fn)(void *arg, int err), void *arg);
/* Subscribes to one topic (group-managed), or assigns all partitions of it from
 * start_offset (no rebalance: for per-host and per-gateway topics; RD_KAFKA_OFFSET_END is
 * resolved before it returns, so nothing produced after it is skipped). */
int sf_kafka_subscribe(rd_kafka_t *consumer, const char *topic);
/* _assign_all first creates the topic (CreateTopics with the broker's partition count and
 * replication factor) when it does not exist: per-instance topics (sf.host.<host>,
 * sf.reply.<id>) are made by their reader, since production brokers do not create topics
 * on first use. */
int sf_kafka_assign_all(rd_kafka_t *consumer, rd_kafka_t *producer, const char *topic,
                        int64_t start_offset, int timeout_ms);
/* (-EACCES when Kafka's ACLs refuse this client's principal the topic: the caller says so
 * with sf_kafka_err_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED).) */

/* Creates topic with the broker's defaults unless it exists (0 then too); a reply topic
 * (sf.reply.*) gets retention.ms SF_KAFKA_REPLY_RETENTION_MS. -EPERM when the broker's
 * ACLs refuse it, -EIO otherwise. */
#define SF_KAFKA_REPLY_RETENTION_MS "3600000"
int sf_kafka_topic_create(rd_kafka_t *rk, const char *topic, int timeout_ms);

typedef void (*sf_kafka_msg_cb)(void *arg, rd_kafka_message_t *msg);
typedef struct sf_kafka_pump sf_kafka_pump;
/* Drives consumer from base: cb gets each message (destroyed after cb returns; errors
 * are logged by the caller via msg->err). Also polls producer (if not NULL) for
 * delivery reports. */
sf_kafka_pump *sf_kafka_pump_new(struct event_base *base, rd_kafka_t *consumer,
                                 rd_kafka_t *producer, sf_kafka_msg_cb cb, void *arg);
void sf_kafka_pump_free(sf_kafka_pump *p);

/* Offset tracker: begin when a message is taken, end when its work is done; the
 * stored offset only moves past a message once it and all before it are done. Partitions
 * 0-255 are tracked (begin fails with -EINVAL above: such a partition's offset is then
 * never stored, so a restart redelivers rather than loses). reset forgets a partition
 * (revoked: whatever still ends there must not move its offset). */
typedef struct sf_kafka_track sf_kafka_track;
typedef struct sf_kafka_ticket {
    int32_t partition;
    int64_t offset;
} sf_kafka_ticket;
sf_kafka_track *sf_kafka_track_new(rd_kafka_t *consumer, const char *topic);
void sf_kafka_track_free(sf_kafka_track *t);
int sf_kafka_track_begin(sf_kafka_track *t, int32_t partition, int64_t offset);
void sf_kafka_track_end(sf_kafka_track *t, sf_kafka_ticket tk);
void sf_kafka_track_reset(sf_kafka_track *t, int32_t partition);

#endif
