/* sandfleet-kafka-acl: the Kafka ACLs of one role (ops/RUNBOOK.md, "Kafka ACLs"), the one
 * place that lists them; ops/dev-cluster grants with it.
 *
 *   sandfleet-kafka-acl print ROLE USER [ID]   the role's ACL bindings, one a line
 *   sandfleet-kafka-acl grant ROLE USER [ID]   creates them (CreateAcls) on SF_KAFKA_BROKERS
 *
 * ROLE: gateway GATEWAY_ID | scheduler | worker HOST_ID | batch PRODUCER_ID. USER is the
 * role's Kafka user (its principal User:USER). `grant` connects with the SF_KAFKA_* settings
 * of the daemons (a user allowed to alter ACLs: a super user), through the same librdkafka
 * set-up as they use. Exit 0, or 1 with one sentence. */
#include "sf_daemon.h"
#include "sf_kafka.h"
#include "sf_util.h"

#include <stdio.h>
#include <string.h>

typedef struct acl {
    rd_kafka_ResourceType_t type;
    rd_kafka_ResourcePatternType_t pattern;
    const char *name_fmt; /* %s: the role's ID */
    rd_kafka_AclOperation_t op;
} acl;

#define T RD_KAFKA_RESOURCE_TOPIC
#define G RD_KAFKA_RESOURCE_GROUP
#define LIT RD_KAFKA_RESOURCE_PATTERN_LITERAL
#define PRE RD_KAFKA_RESOURCE_PATTERN_PREFIXED
#define READ RD_KAFKA_ACL_OPERATION_READ
#define WRITE RD_KAFKA_ACL_OPERATION_WRITE
#define CREATE RD_KAFKA_ACL_OPERATION_CREATE

/* Gateways (gateway_id ID): write jobs; read, create and write (its liveness probe) its
 * reply topics sf.reply.ID-<thread>, whose consumer groups are sf-ID-<thread>. */
static const acl gateway[] = {
    {T, LIT, "sf.jobs", WRITE},          {T, PRE, "sf.reply.%s-", READ},
    {T, PRE, "sf.reply.%s-", WRITE},     {T, PRE, "sf.reply.%s-", CREATE},
    {G, PRE, "sf-%s-", READ},
};
/* Schedulers: read jobs (group sf-scheduler); write every host's topic, every reply topic
 * (errors they answer themselves), dead letters and events. The only writers of sf.host.*. */
static const acl scheduler[] = {
    {T, LIT, "sf.jobs", READ},    {G, LIT, "sf-scheduler", READ}, {T, PRE, "sf.host.", WRITE},
    {T, PRE, "sf.reply.", WRITE}, {T, LIT, "sf.dead", WRITE},     {T, LIT, "sf.events", WRITE},
};
/* A worker (host_id ID): read and create its own host topic (group sf-worker-ID); write
 * every reply topic, events and dead letters. */
static const acl worker[] = {
    {T, LIT, "sf.host.%s", READ},    {T, LIT, "sf.host.%s", CREATE},
    {G, LIT, "sf-worker-%s", READ},  {T, PRE, "sf.reply.", WRITE},
    {T, LIT, "sf.events", WRITE},    {T, LIT, "sf.dead", WRITE},
};
/* A batch producer (producer id ID, from its API key): write jobs; read and create its
 * reply topic; its consumer groups are batch_<random> (they hold no offsets of worth). */
static const acl batch[] = {
    {T, LIT, "sf.jobs", WRITE},
    {T, LIT, "sf.reply.%s", READ},
    {T, LIT, "sf.reply.%s", CREATE},
    {G, PRE, "batch_", READ},
};

static const struct role {
    const char *name;
    const acl *acls;
    size_t n;
    int needs_id;
} roles[] = {
    {"gateway", gateway, SF_ARRAY_LEN(gateway), 1},
    {"scheduler", scheduler, SF_ARRAY_LEN(scheduler), 0},
    {"worker", worker, SF_ARRAY_LEN(worker), 1},
    {"batch", batch, SF_ARRAY_LEN(batch), 1},
};

static const char *op_name(rd_kafka_AclOperation_t op)
{
    return op == READ ? "READ" : op == WRITE ? "WRITE" : "CREATE";
}

static int usage(void)
{
    fprintf(stderr, "usage: sandfleet-kafka-acl print|grant gateway USER GATEWAY_ID | scheduler "
                    "USER | worker USER HOST_ID | batch USER PRODUCER_ID\n");
    return 2;
}

static int grant(rd_kafka_AclBinding_t **b, size_t n)
{
    sf_common_cfg c;
    sf_kafka_settings s = {.fetch_wait_ms = 100, .session_timeout_ms = 6000};
    char why[512] = "";
    rd_kafka_t *rk = NULL;
    rd_kafka_queue_t *q = NULL;
    rd_kafka_AdminOptions_t *o = NULL;
    rd_kafka_event_t *ev = NULL;
    int rc = 1;

    if (sf_common_config_load(&c, why, sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet-kafka-acl: %s\n", why);
        return 1;
    }
    s.brokers = c.kafka_brokers;
    if (sf_kafka_security_set(&s, c.kafka_security_protocol, c.kafka_sasl_mechanism,
                              c.kafka_sasl_username, c.kafka_sasl_password_file, why,
                              sizeof(why)) < 0 ||
        !(rk = sf_kafka_producer_new(&s, why, sizeof(why)))) {
        fprintf(stderr, "sandfleet-kafka-acl: %s\n", why);
        goto out;
    }
    q = rd_kafka_queue_new(rk);
    o = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATEACLS);
    rd_kafka_AdminOptions_set_request_timeout(o, 15000, why, sizeof(why));
    rd_kafka_CreateAcls(rk, b, n, o, q);
    if (!(ev = rd_kafka_queue_poll(q, 20000)) ||
        rd_kafka_event_type(ev) != RD_KAFKA_EVENT_CREATEACLS_RESULT) {
        fprintf(stderr, "sandfleet-kafka-acl: Kafka at %s did not answer CreateAcls within 20 s; "
                "check SF_KAFKA_BROKERS and the SF_KAFKA_SASL_* settings.\n", s.brokers);
        goto out;
    }
    if (rd_kafka_event_error(ev)) {
        const char *hint = sf_kafka_err_hint(rd_kafka_event_error(ev));
        fprintf(stderr, "sandfleet-kafka-acl: CreateAcls failed: %s%s%s\n",
                rd_kafka_event_error_string(ev), hint ? ". " : "", hint ? hint : "");
        goto out;
    }
    {
        size_t cnt = 0;
        const rd_kafka_acl_result_t **res =
            rd_kafka_CreateAcls_result_acls(rd_kafka_event_CreateAcls_result(ev), &cnt);
        rc = cnt == n ? 0 : 1;
        for (size_t i = 0; i < cnt; i++) {
            const rd_kafka_error_t *e = rd_kafka_acl_result_error(res[i]);
            if (e) {
                fprintf(stderr, "sandfleet-kafka-acl: Kafka refused ACL %zu: %s; the user in "
                        "SF_KAFKA_SASL_USERNAME must be a super user (or have ALTER on the "
                        "cluster).\n", i + 1, rd_kafka_error_string(e));
                rc = 1;
            }
        }
    }
out:
    if (ev)
        rd_kafka_event_destroy(ev);
    if (o)
        rd_kafka_AdminOptions_destroy(o);
    if (q)
        rd_kafka_queue_destroy(q);
    sf_kafka_producer_free(rk);
    explicit_bzero(s.sasl_password, sizeof(s.sasl_password));
    sf_common_config_free(&c);
    return rc;
}

int main(int argc, char **argv)
{
    const struct role *r = NULL;
    rd_kafka_AclBinding_t *b[16] = {0};
    char principal[300], name[300], why[256];
    size_t n = 0;
    int rc = 1;

    if (argc < 4 || (strcmp(argv[1], "print") && strcmp(argv[1], "grant")))
        return usage();
    for (size_t i = 0; i < SF_ARRAY_LEN(roles); i++)
        if (!strcmp(argv[2], roles[i].name))
            r = &roles[i];
    if (!r || argc != 4 + r->needs_id)
        return usage();
    if (strlen(argv[3]) > 255 || (r->needs_id && (strlen(argv[4]) > 200 || !*argv[4] ||
                                                   strspn(argv[4], "abcdefghijklmnopqrstuvwxyz"
                                                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                   "0123456789._-") !=
                                                       strlen(argv[4])))) {
        fprintf(stderr, "sandfleet-kafka-acl: the user (at most 255 bytes) or the id (1-200 of "
                        "[A-Za-z0-9._-]) is not valid.\n");
        return 1;
    }
    snprintf(principal, sizeof(principal), "User:%s", argv[3]);
    for (; n < r->n; n++) {
        const acl *a = &r->acls[n];
        snprintf(name, sizeof(name), a->name_fmt, r->needs_id ? argv[4] : "");
        if (!strcmp(argv[1], "print"))
            printf("%s ALLOW %s on %s %s %s\n", principal, op_name(a->op),
                   a->pattern == PRE ? "PREFIXED" : "LITERAL", a->type == T ? "TOPIC" : "GROUP",
                   name);
        else if (!(b[n] = rd_kafka_AclBinding_new(a->type, name, a->pattern, principal, "*", a->op,
                                                  RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW, why,
                                                  sizeof(why)))) {
            fprintf(stderr, "sandfleet-kafka-acl: %s\n", why);
            goto out;
        }
    }
    rc = strcmp(argv[1], "grant") ? 0 : grant(b, n);
out:
    for (size_t i = 0; i < SF_ARRAY_LEN(b); i++)
        if (b[i])
            rd_kafka_AclBinding_destroy(b[i]);
    return rc;
}
