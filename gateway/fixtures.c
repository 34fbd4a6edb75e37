/* fixtures.c: the tools the MCP conformance suite (@modelcontextprotocol/conformance)
 * calls, run in-process. They exist only when the gateway starts with test_fixtures 1
 * (tests only): a production gateway neither lists nor runs them. Each is a small state
 * machine: step 0 starts it, later steps run from the call's timer (gw_call_later). */
#include "gateway.h"

#include <string.h>

/* A 1x1 red PNG and a 44-byte silent WAV, base64. */
static const char png_1x1[] =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
static const char wav_silent[] = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=";

static const struct {
    const char *name, *description;
} fixtures[] = {
    {"test_simple_text", "Returns a simple text response (conformance fixture)."},
    {"test_image_content", "Returns a 1x1 PNG image (conformance fixture)."},
    {"test_audio_content", "Returns a short WAV clip (conformance fixture)."},
    {"test_embedded_resource", "Returns an embedded text resource (conformance fixture)."},
    {"test_multiple_content_types", "Returns text, image and resource (conformance fixture)."},
    {"test_tool_with_logging", "Sends three log messages 50 ms apart (conformance fixture)."},
    {"test_error_handling", "Always fails with isError (conformance fixture)."},
    {"test_tool_with_progress", "Reports progress 0, 50, 100 of 100 (conformance fixture)."},
};

json_t *gw_fixtures_list(void)
{
    json_t *a = json_array();

    for (size_t i = 0; i < SF_ARRAY_LEN(fixtures); i++)
        json_array_append_new(a, json_pack("{s:s, s:s, s:{s:s, s:{}}}", "name", fixtures[i].name,
                                           "description", fixtures[i].description, "inputSchema",
                                           "type", "object", "properties"));
    return a;
}

int gw_fixture_is(const char *name)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(fixtures); i++)
        if (!strcmp(name, fixtures[i].name))
            return 1;
    return 0;
}

static json_t *text_result(const char *text)
{
    return json_pack("{s:[{s:s, s:s}]}", "content", "type", "text", "text", text);
}

void gw_fixture_step(mcp_call *c, const char *name, int step)
{
    if (!strcmp(name, "test_simple_text")) {
        gw_call_result(c, text_result("This is a simple text response for testing."));
    } else if (!strcmp(name, "test_image_content")) {
        gw_call_result(c, json_pack("{s:[{s:s, s:s, s:s}]}", "content", "type", "image", "data",
                                    png_1x1, "mimeType", "image/png"));
    } else if (!strcmp(name, "test_audio_content")) {
        gw_call_result(c, json_pack("{s:[{s:s, s:s, s:s}]}", "content", "type", "audio", "data",
                                    wav_silent, "mimeType", "audio/wav"));
    } else if (!strcmp(name, "test_embedded_resource")) {
        gw_call_result(c, json_pack("{s:[{s:s, s:{s:s, s:s, s:s}}]}", "content", "type",
                                    "resource", "resource", "uri", "test://embedded-resource",
                                    "mimeType", "text/plain", "text",
                                    "This is an embedded resource content."));
    } else if (!strcmp(name, "test_multiple_content_types")) {
        gw_call_result(c, json_pack("{s:[{s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:{s:s, s:s, s:s}}]}",
                                    "content", "type", "text", "text",
                                    "Multiple content types test:", "type", "image", "data",
                                    png_1x1, "mimeType", "image/png", "type", "resource",
                                    "resource", "uri", "test://mixed-content-resource",
                                    "mimeType", "application/json", "text",
                                    "{\"test\":\"data\",\"value\":123}"));
    } else if (!strcmp(name, "test_error_handling")) {
        gw_call_result(c, json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text",
                                    "This tool intentionally returns an error for testing.",
                                    "isError", 1));
    } else if (!strcmp(name, "test_tool_with_logging")) {
        static const char *const msgs[] = {"Tool execution started", "Tool processing data",
                                           "Tool execution completed"};
        gw_call_log(c, GW_LOG_INFO, msgs[step]);
        if (step < 2)
            gw_call_later(c, 50, step + 1);
        else
            gw_call_result(c, text_result("Tool with logging executed successfully."));
    } else if (!strcmp(name, "test_tool_with_progress")) {
        gw_call_progress(c, step * 50, 100, NULL);
        if (step < 2)
            gw_call_later(c, 50, step + 1);
        else
            gw_call_result(c, text_result("Tool with progress executed successfully."));
    }
}
