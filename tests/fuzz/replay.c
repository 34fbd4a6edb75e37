/* main() for the fuzz harnesses when they are not built for libFuzzer: replays the files
 * (or directories of files) named on the command line through LLVMFuzzerTestOneInput, which
 * is how CTest runs each corpus. A harness may define sf_fuzz_cleanup() to free what it
 * built at start-up.
 *
 * Like libFuzzer's -malloc_limit_mb, an input that makes the code under test ask for
 * more than ALLOC_LIMIT bytes in one allocation fails the run: a decoder must refuse a
 * hostile count before it reserves memory for it. */
#include "alloc_track.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ALLOC_LIMIT (64u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void sf_fuzz_cleanup(void) __attribute__((weak));

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long len;

    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    if (fseek(f, 0, SEEK_END) < 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) < 0) {
        fclose(f);
        return -1;
    }
    buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    alloc_track_reset();
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    if (alloc_track_largest() > ALLOC_LIMIT) {
        fprintf(stderr, "%s: one allocation of %zu bytes (the limit is %u)\n", path,
                alloc_track_largest(), ALLOC_LIMIT);
        abort();
    }
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, errors = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[a]);
            struct dirent *e;
            if (!d) {
                errors++;
                continue;
            }
            while ((e = readdir(d))) {
                char p[4096];
                if (e->d_name[0] == '.')
                    continue;
                snprintf(p, sizeof(p), "%s/%s", argv[a], e->d_name);
                errors += run_file(p) < 0;
                files++;
            }
            closedir(d);
        } else {
            errors += run_file(argv[a]) < 0;
            files++;
        }
    }
    if (sf_fuzz_cleanup)
        sf_fuzz_cleanup();
    printf("%s: %d inputs run, %d unreadable\n", argv[0], files, errors);
    return errors || files == 0 ? 1 : 0;
}
