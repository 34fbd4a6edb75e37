/* Fuzz harness for the msgpack job/reply codec (common/sf_codec.c): every input is
 * decoded as a job, as a reply, and peeked for its reply address; whatever decodes is
 * encoded again and must decode to the same thing.
 *
 * Built with -DSF_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target; otherwise
 * main() replays the files (or directories of files) named on the command line, which is
 * how CTest runs the corpus in tests/fuzz/corpus/codec/. */
#include "sf_codec.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

#ifndef SF_LIBFUZZER
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0;

    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *e;
            while (d && (e = readdir(d))) {
                char p[4096];
                if (e->d_name[0] == '.')
                    continue;
                snprintf(p, sizeof(p), "%s/%s", argv[i], e->d_name);
                if (run_file(p) == 0)
                    files++;
            }
            if (d)
                closedir(d);
        } else if (run_file(argv[i]) == 0) {
            files++;
        }
    }
    printf("fuzz_codec: %d inputs replayed, no crash\n", files);
    return files > 0 ? 0 : 1;
}
#endif
