/* Fuzz harness for the worker <-> agent frames (worker/agent/proto/sf_agentproto.c), which both
 * sides treat as untrusted. The input is a stream of frames as it arrives on the socket:
 * each complete frame is checked and decoded; a decoded message is encoded again and
 * must decode to the same op and id. Every refusal must say why.
 *
 * Built with -DSF_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target; otherwise
 * tests/fuzz/replay.c gives it a main() that replays files (or directories). */
#include "sf_agentproto.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void roundtrip(const sf_ap_msg *m)
{
    sf_buf b;
    sf_ap_msg back;
    const char *why = NULL;

    sf_buf_init(&b, SF_AP_FRAME_MAX + SF_AP_HDR_LEN);
    if (sf_ap_encode(&b, m, &why) == 0) {
        if (sf_ap_decode(b.p + SF_AP_HDR_LEN, b.len - SF_AP_HDR_LEN, &back, &why) != 0 ||
            back.op != m->op || back.id != m->id)
            abort();
        sf_ap_msg_fini(&back);
    } else if (!why) {
        abort();
    }
    sf_buf_fini(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    while (size > 0) {
        size_t frame = 0;
        const char *why = NULL;
        sf_ap_msg m;

        if (sf_ap_frame_check(data, size, &frame, &why) < 0) {
            if (!why)
                abort();
            return 0; /* the worker drops the link here */
        }
        if (frame == 0)
            return 0; /* incomplete: waits for more bytes */
        if (sf_ap_decode(data + SF_AP_HDR_LEN, frame - SF_AP_HDR_LEN, &m, &why) == 0)
            roundtrip(&m);
        else if (!why)
            abort();
        sf_ap_msg_fini(&m);
        data += frame;
        size -= frame;
    }
    return 0;
}
