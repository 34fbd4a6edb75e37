/* Kafka credentials: the SF_KAFKA_SECURITY_PROTOCOL / _SASL_* settings (the common table
 * every daemon and the batch CLI load) mapped onto librdkafka's properties, and every bad
 * value refused with one sentence naming the setting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sf_daemon.h"
#include "sf_kafka.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/sf_kafka_cfg_XXXXXX";

static const char *file_with(const char *name, const char *content, size_t n)
{
    static char path[256];
    int fd;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, n), (ssize_t)n);
    close(fd);
    return path;
}

/* The property name of a producer made from s, as librdkafka holds it. */
static void prop(rd_kafka_t *rk, const char *name, char *out, size_t n)
{
    size_t len = n;

    assert_int_equal(rd_kafka_conf_get(rd_kafka_conf(rk), name, out, &len), RD_KAFKA_CONF_OK);
}

static void unset_all(void)
{
    unsetenv("SF_KAFKA_SECURITY_PROTOCOL");
    unsetenv("SF_KAFKA_SASL_MECHANISM");
    unsetenv("SF_KAFKA_SASL_USERNAME");
    unsetenv("SF_KAFKA_SASL_PASSWORD_FILE");
}

/* The environment through the common table, onto a producer's and a consumer's
 * properties. */
static void env_to_librdkafka(void **state)
{
    const char *pwf = file_with("pw", "s3cret-pw\n", 10);
    sf_common_cfg c;
    sf_kafka_settings s = {.brokers = "127.0.0.1:1", .fetch_wait_ms = 100,
                           .session_timeout_ms = 3000};
    char why[512] = "", v[600];
    rd_kafka_t *p, *k;

    setenv("SF_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT", 1);
    setenv("SF_KAFKA_SASL_MECHANISM", "scram-sha-512", 1);
    setenv("SF_KAFKA_SASL_USERNAME", "worker-fleet-1", 1);
    setenv("SF_KAFKA_SASL_PASSWORD_FILE", pwf, 1);
    assert_int_equal(sf_common_config_load(&c, why, sizeof(why)), 0);
    assert_int_equal(sf_kafka_security_set(&s, c.kafka_security_protocol, c.kafka_sasl_mechanism,
                                           c.kafka_sasl_username, c.kafka_sasl_password_file,
                                           why, sizeof(why)),
                     0);
    assert_non_null(p = sf_kafka_producer_new(&s, why, sizeof(why)));
    assert_non_null(k = sf_kafka_consumer_new(&s, "g", why, sizeof(why)));
    for (rd_kafka_t **rk = (rd_kafka_t *[]){p, k, NULL}; *rk; rk++) {
        prop(*rk, "security.protocol", v, sizeof(v));
        assert_string_equal(v, "sasl_plaintext");
        prop(*rk, "sasl.mechanisms", v, sizeof(v));
        assert_string_equal(v, "SCRAM-SHA-512");
        prop(*rk, "sasl.username", v, sizeof(v));
        assert_string_equal(v, "worker-fleet-1");
        prop(*rk, "sasl.password", v, sizeof(v));
        assert_string_equal(v, "s3cret-pw"); /* (the file's newline dropped) */
    }
    sf_kafka_consumer_free(k);
    sf_kafka_producer_free(p);
    sf_common_config_free(&c);

    /* the defaults: plaintext, no credentials at all */
    unset_all();
    memset(&s, 0, sizeof(s));
    s.brokers = "127.0.0.1:1";
    assert_int_equal(sf_common_config_load(&c, why, sizeof(why)), 0);
    assert_string_equal(c.kafka_security_protocol, "plaintext");
    assert_int_equal(sf_kafka_security_set(&s, c.kafka_security_protocol, c.kafka_sasl_mechanism,
                                           c.kafka_sasl_username, c.kafka_sasl_password_file,
                                           why, sizeof(why)),
                     0);
    assert_null(s.security_protocol);
    assert_non_null(p = sf_kafka_producer_new(&s, why, sizeof(why)));
    prop(p, "security.protocol", v, sizeof(v));
    assert_string_equal(v, "plaintext");
    sf_kafka_producer_free(p);
    sf_common_config_free(&c);

    /* sasl_ssl with PLAIN */
    assert_int_equal(sf_kafka_security_set(&s, "sasl_ssl", "PLAIN", "gw", pwf, why, sizeof(why)),
                     0);
    assert_string_equal(s.security_protocol, "sasl_ssl");
    assert_string_equal(s.sasl_mechanism, "PLAIN");
}

/* Each bad value: refused, with a sentence naming the setting, the settings untouched. */
static void bad_values(void **state)
{
    char big[SF_KAFKA_PASSWORD_MAX + 10];
    const struct {
        const char *proto, *mech, *user, *file, *content;
        size_t n;
        int rc;
        const char *says;
    } cases[] = {
        {"tls", "PLAIN", "", "", NULL, 0, -EINVAL, "SF_KAFKA_SECURITY_PROTOCOL"},
        {"plaintext", "PLAIN", "gw", "", NULL, 0, -EINVAL, "plaintext, which sends no credentials"},
        {"plaintext", "PLAIN", "", "pw", "x", 1, -EINVAL, "plaintext, which sends no credentials"},
        {"sasl_plaintext", "GSSAPI", "gw", "pw", "x", 1, -EINVAL, "SF_KAFKA_SASL_MECHANISM"},
        {"sasl_plaintext", "PLAIN", "", "pw", "x", 1, -EINVAL, "SF_KAFKA_SASL_USERNAME"},
        {"sasl_plaintext", "PLAIN", "g\tw", "pw", "x", 1, -EINVAL, "SF_KAFKA_SASL_USERNAME"},
        {"sasl_plaintext", "PLAIN", "gw", "", NULL, 0, -EINVAL, "SF_KAFKA_SASL_PASSWORD_FILE"},
        {"sasl_plaintext", "PLAIN", "gw", "missing", NULL, 0, -ENOENT,
         "SF_KAFKA_SASL_PASSWORD_FILE"},
        {"sasl_plaintext", "PLAIN", "gw", "pw", "\n", 1, -EINVAL, "on one line"},
        {"sasl_plaintext", "PLAIN", "gw", "pw", "a\nb\n", 4, -EINVAL, "on one line"},
        {"sasl_plaintext", "PLAIN", "gw", "pw", big, sizeof(big), -EINVAL, "on one line"},
    };

    memset(big, 'p', sizeof(big));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sf_kafka_settings s = {.brokers = "b"};
        char why[512] = "", path[256] = "";
        if (cases[i].content)
            snprintf(path, sizeof(path), "%s", file_with(cases[i].file, cases[i].content,
                                                         cases[i].n));
        else if (*cases[i].file)
            snprintf(path, sizeof(path), "%s/%s", dir, cases[i].file);
        assert_int_equal(sf_kafka_security_set(&s, cases[i].proto, cases[i].mech, cases[i].user,
                                               path, why, sizeof(why)),
                         cases[i].rc);
        if (!strstr(why, cases[i].says))
            fail_msg("case %zu: '%s' does not say '%s'", i, why, cases[i].says);
        assert_null(s.security_protocol);
        assert_int_equal(s.sasl_password[0], 0);
    }
}

/* Credentials and ACL refusals have a sentence naming what to check; other errors none. */
static void hints(void **state)
{
    assert_non_null(strstr(sf_kafka_err_hint(RD_KAFKA_RESP_ERR__AUTHENTICATION),
                           "SF_KAFKA_SASL_USERNAME"));
    assert_non_null(strstr(sf_kafka_err_hint(RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED),
                           "kafka_sasl_password_file"));
    assert_non_null(strstr(sf_kafka_err_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED),
                           "ops/RUNBOOK.md"));
    assert_non_null(strstr(sf_kafka_err_hint(RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED),
                           "consumer group"));
    assert_null(sf_kafka_err_hint(RD_KAFKA_RESP_ERR__TRANSPORT));
    assert_null(sf_kafka_err_hint(RD_KAFKA_RESP_ERR_NO_ERROR));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(env_to_librdkafka),
        cmocka_unit_test(bad_values),
        cmocka_unit_test(hints),
    };
    int rc;

    if (!mkdtemp(dir))
        return 1;
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (const char *f = "pw\0missing\0"; *f; f += strlen(f) + 1) {
        char p[256];
        snprintf(p, sizeof(p), "%s/%s", dir, f);
        unlink(p);
    }
    rmdir(dir);
    return rc;
}
