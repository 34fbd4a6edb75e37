/* sf_codec: the msgpack job and reply envelopes (schemas/envelope.md).
 * Decoding is strict: unknown version, missing or mistyped fields, oversized
 * fields and trailing bytes are rejected with a reason, never a crash; lengths, counts,
 * nesting and the number of values are checked on the raw bytes before msgpack-c
 * allocates anything (sf_mpscan.h), so memory use is bounded by the message size. */
#ifndef SF_CODEC_H
#define SF_CODEC_H

#include "sf_buf.h"
#include "sf_mpjson.h"
#include "sf_util.h"

#include <jansson.h>
#include <stdint.h>

#define SF_ENVELOPE_VERSION 1
#define SF_MSG_MAX (1024 * 1024) /* largest envelope accepted (claim check above) */
/* Decoding bounds, checked on the raw bytes before anything is allocated: nesting (the
 * envelope, then args/result as deep as sf_mpjson allows) and values in one message. */
#define SF_MSG_MAX_DEPTH (SF_MPJSON_MAX_DEPTH + 1)
#define SF_MSG_MAX_VALUES (256 * 1024)
#define SF_TOPIC_MAX 200
#define SF_MESSAGE_MAX 1000

/* Fields that travel by claim check (sf_claim.h): the names of the job's arguments, or of
 * the reply's result fields, whose value is in Redis instead (the value in the envelope is
 * then the empty string). */
#define SF_CLAIMS_MAX 4
#define SF_CLAIM_NAME_MAX 32  /* [a-z0-9_]{1,31} */
typedef struct sf_claims {
    int n;
    char name[SF_CLAIMS_MAX][SF_CLAIM_NAME_MAX];
} sf_claims;

/* How the job's producer signed it: Kafka headers beside the envelope, never encoded in it
 * (sf_jobauth.h; read by sf_jobq). state: 0 no header, 1 read, -1 malformed (why). */
typedef struct sf_job_auth {
    int state;
    char key[SF_ID_MAX];        /* sf-key: producer id, or "gateway" */
    int64_t iat;                /* sf-iat: when it was signed (ms) */
    uint8_t mac[32];            /* sf-mac */
    uint8_t digest[32];         /* SHA-256 of the message value */
    const char *why;            /* state -1: what is wrong (static text) */
} sf_job_auth;

typedef struct sf_job {
    char id[SF_ID_MAX];         /* job id, unique per call */
    char team[SF_ID_MAX];       /* caller's team, set by the gateway from the API key */
    char tool[SF_ID_MAX];       /* MCP tool name */
    char sandbox[SF_ID_MAX];    /* target sandbox ("" for create/list) */
    char host[SF_ID_MAX];       /* owning host, set by the scheduler when it forwards ("" before) */
    char reply[SF_TOPIC_MAX];   /* topic the final reply goes to */
    char trace[SF_ID_MAX];      /* request id for logs ("" if none) */
    int64_t deadline_ms;        /* wall-clock ms after which nobody waits for the answer */
    int progress;               /* caller wants progress messages */
    json_t *args;               /* tool arguments (an object, owned) */
    sf_claims claims;           /* arguments whose value is a claim */
    sf_job_auth auth;           /* the producer's signature (not part of the envelope) */
} sf_job;

enum { SF_REPLY_RESULT = 0, SF_REPLY_ERROR = 1, SF_REPLY_PROGRESS = 2 };

typedef struct sf_reply {
    char id[SF_ID_MAX];  /* the job id it answers */
    int kind;            /* SF_REPLY_* */
    json_t *result;      /* RESULT: the structured result (object); PROGRESS: the chunk (object) */
    char code[32];       /* ERROR: a machine code (sf_err_*) */
    char *message;       /* ERROR: one actionable sentence (owned; encoded at most
                            SF_MESSAGE_MAX bytes, cut at a character boundary) */
    sf_claims claims;    /* RESULT: result fields whose value is a claim */
} sf_reply;

/* Error codes carried in replies. */
#define SF_ERR_INVALID "invalid_argument"
#define SF_ERR_NOT_FOUND "not_found"
#define SF_ERR_UNAVAILABLE "unavailable"
#define SF_ERR_TIMEOUT "deadline_exceeded"
#define SF_ERR_LIMIT "limit_exceeded"
#define SF_ERR_INTERNAL "internal"
#define SF_ERR_CANCELLED "cancelled" /* the caller cancelled the call (sf.cancel) */
#define SF_ERR_UNAUTH "unauthenticated" /* a job's producer signature failed (sf_jobauth.h) */

void sf_job_init(sf_job *j);
void sf_job_fini(sf_job *j);
/* Appends the encoded job to out. 0, -EINVAL (bad field), -E2BIG. */
int sf_job_encode(const sf_job *j, sf_buf *out);
/* 0 and a filled job (sf_job_fini it), or -EINVAL / -E2BIG with *why. */
int sf_job_decode(const void *p, size_t n, sf_job *j, const char **why);

void sf_reply_init(sf_reply *r);
void sf_reply_fini(sf_reply *r);
int sf_reply_encode(const sf_reply *r, sf_buf *out);
int sf_reply_decode(const void *p, size_t n, sf_reply *r, const char **why);

/* Adds name to c: 0, -EEXIST, -E2BIG (full), -EINVAL (not [a-z0-9_]{1,31}). */
int sf_claims_add(sf_claims *c, const char *name);
int sf_claims_has(const sf_claims *c, const char *name);

/* Convenience: encode an error or result reply for job id in one call. */
int sf_reply_encode_error(const char *id, const char *code, const char *message, sf_buf *out);
int sf_reply_encode_result(const char *id, const json_t *result, sf_buf *out);



/* For a job that failed to decode: pulls out just its id and reply topic so the
 * caller can still be told. 0 if both were found. */
int sf_job_peek_reply(const void *p, size_t n, char id[SF_ID_MAX], char reply[SF_TOPIC_MAX]);
/* For a reply that failed to decode: its job id, so the waiting call can still be
 * answered. 0 if found. */
int sf_reply_peek_id(const void *p, size_t n, char id[SF_ID_MAX]);
/* True when topic is a reply topic we may write to: "sf.reply." + [a-z0-9_-]+. */
int sf_reply_topic_valid(const char *topic);
#endif
