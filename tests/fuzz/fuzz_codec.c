/* Fuzz harness for the msgpack job/reply codec (common/sf_codec.c): every input is
 * decoded as a job, as a reply, and peeked for its reply address; whatever decodes is
 * encoded again and must decode to the same thing.
 *
 * Built with -DSF_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target; otherwise
 * tests/fuzz/replay.c gives it a main() that replays files (or directories), which is
 * how CTest runs the corpus in tests/fuzz/corpus/codec/. */
#include "sf_codec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_job j, j2;
    sf_reply r, r2;
    sf_buf b;
    const char *why = NULL;
    char id[SF_ID_MAX], reply[SF_TOPIC_MAX];

    sf_buf_init(&b, SF_MSG_MAX * 2);
    if (sf_job_decode(data, size, &j, &why) == 0) {
        if (sf_job_encode(&j, &b) == 0) {
            if (sf_job_decode(b.p, b.len, &j2, &why) != 0 || strcmp(j.id, j2.id) != 0 ||
                !json_equal(j.args, j2.args))
                abort();
            sf_job_fini(&j2);
        }
        sf_job_fini(&j);
    } else if (!why) {
        abort(); /* a rejection always says why */
    }
    sf_buf_reset(&b);
    why = NULL;
    if (sf_reply_decode(data, size, &r, &why) == 0) {
        if (sf_reply_encode(&r, &b) == 0) {
            if (sf_reply_decode(b.p, b.len, &r2, &why) != 0 || r.kind != r2.kind)
                abort();
            sf_reply_fini(&r2);
        }
        sf_reply_fini(&r);
    } else if (!why) {
        abort();
    }
    sf_job_peek_reply(data, size, id, reply);
    sf_buf_fini(&b);
    return 0;
}
