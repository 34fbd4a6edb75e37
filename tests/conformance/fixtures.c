/* fixtures.c: the tools the MCP conformance suite (@modelcontextprotocol/conformance)
 * calls, run in the gateway itself (x-sandfleet.runs: gateway; their schemas are
 * tests/conformance/tools/). Tests only: linked into the test binary
 * sandfleet-gateway-test alone, never into sandfleet-gateway (the ctest
 * layering.gateway_no_fixtures checks the product's symbols). They register through the
 * gateway's one handler table (gateway/tools.h), as any gateway tool does. */
#include "session.h"
#include "tools.h"

/* A 1x1 red PNG and a 44-byte silent WAV, base64. */
static const char png_1x1[] =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
static const char wav_silent[] = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=";

static json_t *text_result(const char *text)
{
    return json_pack("{s:[{s:s, s:s}]}", "content", "type", "text", "text", text);
}

/* One handler per tool (tools.h): step 0 starts it, later steps run from the call's timer
 * (gw_call_later). */
static void simple_text(mcp_call *c, int step)
{
    gw_call_result(c, text_result("This is a simple text response for testing."));
}

static void image_content(mcp_call *c, int step)
{
    gw_call_result(c, json_pack("{s:[{s:s, s:s, s:s}]}", "content", "type", "image", "data",
                                png_1x1, "mimeType", "image/png"));
}

static void audio_content(mcp_call *c, int step)
{
    gw_call_result(c, json_pack("{s:[{s:s, s:s, s:s}]}", "content", "type", "audio", "data",
                                wav_silent, "mimeType", "audio/wav"));
}

static void embedded_resource(mcp_call *c, int step)
{
    gw_call_result(c, json_pack("{s:[{s:s, s:{s:s, s:s, s:s}}]}", "content", "type", "resource",
                                "resource", "uri", "test://embedded-resource", "mimeType",
                                "text/plain", "text", "This is an embedded resource content."));
}

static void multiple_content_types(mcp_call *c, int step)
{
    gw_call_result(c, json_pack("{s:[{s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:{s:s, s:s, s:s}}]}",
                                "content", "type", "text", "text", "Multiple content types test:",
                                "type", "image", "data", png_1x1, "mimeType", "image/png", "type",
                                "resource", "resource", "uri", "test://mixed-content-resource",
                                "mimeType", "application/json", "text",
                                "{\"test\":\"data\",\"value\":123}"));
}

static void error_handling(mcp_call *c, int step)
{
    gw_call_result(c, json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text",
                                "This tool intentionally returns an error for testing.",
                                "isError", 1));
}

static void tool_with_logging(mcp_call *c, int step)
{
    static const char *const msgs[] = {"Tool execution started", "Tool processing data",
                                       "Tool execution completed"};

    gw_call_log(c, GW_LOG_INFO, msgs[step]);
    if (step < 2)
        gw_call_later(c, 50, step + 1);
    else
        gw_call_result(c, text_result("Tool with logging executed successfully."));
}

static void tool_with_progress(mcp_call *c, int step)
{
    gw_call_progress(c, step * 50, 100, NULL);
    if (step < 2)
        gw_call_later(c, 50, step + 1);
    else
        gw_call_result(c, text_result("Tool with progress executed successfully."));
}

/* json-schema-2020-12: only its listing is checked ($schema, $defs, additionalProperties
 * kept); a call echoes what it got. */
static void json_schema_2020_12(mcp_call *c, int step)
{
    gw_call_result(c, text_result("JSON Schema 2020-12 tool called."));
}

/* server-sse-polling (SEP-1699) calls it to see a POST stream closed mid-call and resumed;
 * the gateway answers a call without a progress token with JSON, so the suite finds the
 * stream tests not applicable. It answers after a short wait, as a long call would. */
static void reconnection(mcp_call *c, int step)
{
    if (step == 0)
        gw_call_later(c, 100, 1);
    else
        gw_call_result(c, text_result("Reconnection test completed successfully."));
}

static const gw_tool fixtures[] = {
    {"json_schema_2020_12_tool", json_schema_2020_12},
    {"test_reconnection", reconnection},
    {"test_simple_text", simple_text},
    {"test_image_content", image_content},
    {"test_audio_content", audio_content},
    {"test_embedded_resource", embedded_resource},
    {"test_multiple_content_types", multiple_content_types},
    {"test_error_handling", error_handling},
    {"test_tool_with_logging", tool_with_logging},
    {"test_tool_with_progress", tool_with_progress},
};
GW_TOOL(fixtures)
