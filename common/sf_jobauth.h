/* sf_jobauth: how a producer authenticates the jobs it puts on sf.jobs
 * (schemas/envelope.md, "Producer authentication"). Three Kafka headers beside the
 * envelope: sf-key (the producer id, or "gateway"), sf-iat (ms since the epoch when it was
 * signed) and sf-mac (hex HMAC-SHA256 under the producer's credential over
 * "sandfleet-job-v1\n" + sf-key + "\n" + sf-iat + "\n" + hex SHA-256 of the value).
 * The credential follows from the API key (never the key itself on the queue); the CLI
 * stores it sealed under the deployment's auth secret when it creates the key, so the
 * scheduler can check it. Gateways sign with a credential derived from the auth secret. */
#ifndef SF_JOBAUTH_H
#define SF_JOBAUTH_H

#include "sf_codec.h"

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#define SF_JOBAUTH_HDR_KEY "sf-key"
#define SF_JOBAUTH_HDR_IAT "sf-iat"
#define SF_JOBAUTH_HDR_MAC "sf-mac"
#define SF_JOBAUTH_GATEWAY "gateway" /* sf-key of a gateway's jobs */
#define SF_PRODUCER_ID_LEN 21        /* "p" + 20 hex characters */
#define SF_PSK_SEALED_HEX 145        /* hex of nonce (24) + credential (32) + tag (16), NUL */
/* Where the credentials and the replay marks live in Redis: the state module (state/). */
/* A signed job is taken only this long after it was signed (and this far ahead of the
 * scheduler's clock); its MAC is remembered as long, so a copy put on the queue again is
 * refused as a replay. */
#define SF_JOBAUTH_WINDOW_MS (10 * 60 * 1000)
#define SF_JOBAUTH_SKEW_MS (60 * 1000)
/* Host jobs (sf.host.<host>): the scheduler signs every job it hands a worker as
 * "scheduler" with that host's own key (sf_host_job_key); the worker takes one only this
 * long after it was signed: as long as its job guard answers a repeat of the same job id
 * (job_deadline_max_ms, 1 h by default), so a copy put back on the topic is either a
 * repeat the guard answers or refused as stale. */
#define SF_JOBAUTH_SCHEDULER "scheduler"
#define SF_HOSTJOB_WINDOW_MS (3600 * 1000)

/* The producer id and credential of an API key:
 * id = "p" + first 20 hex chars of HMAC-SHA256(key, "sandfleet producer id v1"),
 * psk = HMAC-SHA256(key, "sandfleet producer key v1"). 0 or -EINVAL (not one of ours). */
int sf_producer_derive(const char *api_key, char id[SF_PRODUCER_ID_LEN + 1], uint8_t psk[32]);
/* The gateways' credential: HMAC-SHA256(auth secret, "sandfleet gateway job key v1"). */
void sf_gateway_job_key(const uint8_t auth_secret[32], uint8_t key[32]);

/* psk sealed for Redis (XChaCha20-Poly1305 under a key derived from the auth secret,
 * bound to the producer id), as hex; and back. 0, or -EINVAL (unsealing: not ours). */
int sf_psk_seal(const uint8_t auth_secret[32], const char *id, const uint8_t psk[32],
                char out[SF_PSK_SEALED_HEX]);
int sf_psk_unseal(const uint8_t auth_secret[32], const char *id, const char *sealed,
                  uint8_t psk[32]);

/* The MAC of a message value signed by key id at iat (ms). */
void sf_jobauth_mac(const uint8_t psk[32], const char *id, int64_t iat, const uint8_t digest[32],
                    uint8_t mac[32]);
/* Reads the headers of msg into a (with the SHA-256 of its value). a->state: 0 no
 * header at all, 1 read, -1 present but malformed (a->why says which). */
void sf_jobauth_read(const rd_kafka_message_t *msg, sf_job_auth *a);
/* 0 when a's MAC is the one psk makes, else -EPERM (constant time). */
int sf_jobauth_check(const sf_job_auth *a, const uint8_t psk[32]);
/* Headers signing p as id with psk at iat (ms), for sf_kafka_produce_h; NULL when out of
 * memory. */
rd_kafka_headers_t *sf_jobauth_headers(const void *p, size_t n, const char *id,
                                       const uint8_t psk[32], int64_t iat);
/* Host `host`'s key for the jobs the scheduler hands it:
 * HMAC-SHA256(auth secret, "sandfleet host job key v1\n" + host). A worker holds only its
 * own (host_key_file, written by `sandfleet hosts key HOST`), never the auth secret. */
void sf_host_job_key(const uint8_t auth_secret[32], const char *host, uint8_t key[32]);
/* Reads a 32-byte key (64 hex characters) from path, never creating it. 0 or -errno (why). */
int sf_key_file_read(const char *path, uint8_t key[32], char *why, size_t whylen);
/* Produces p to topic signed by id with psk at the current time (the payload is copied).
 * 0 or a negative errno (queue full: -ENOBUFS; too large: -E2BIG). */
int sf_jobauth_produce(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                       size_t n, const char *id, const uint8_t psk[32]);

#endif
