/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_method_override.c - every source of a method override, as src/gateway/method_override.c
 * reads it: each header field (duplicates too), values trimmed and split at commas, `_method` in
 * the query and in a form (names decoded and PHP-mangled, a body without a Content-Type read as a
 * form), in a JSON body, inside gzip and deflate bodies; unknown codings, bodies that inflate too
 * far or not at all.  One table of cases: request in, status and problem code out.
 */
#include "method_override.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "t.h"

/* What die() (src/util) calls this program, as every program linking idem_util defines it. */
const char program_name[] = "gateway_test_method_override";

static char h1[] = "X-HTTP-Method-Override", h2[] = "X-HTTP-Method", h3[] = "X-Method-Override";
static char *override_headers[] = {h1, h2, h3};

enum coding { PLAIN, GZIP, GZIP_TWICE, DEFLATE, RAW_DEFLATE, GZIP_TWO_MEMBERS };

struct tcase {
    const char *method;
    const char *target;
    const char *headers; /* "Name: value\n" each, values as sent */
    const char *body;
    enum coding coding;
    int status; /* 0: not refused */
    const char *code;
};

static const struct tcase cases[] = {
    /* Headers: trimmed, comma lists, duplicates, case of the method ignored. */
    {"POST", "/t", "X-HTTP-Method-Override: PUT\n", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t", "X-HTTP-Method-Override: post\n", "", PLAIN, 0, NULL},
    {"POST", "/t", "X-HTTP-Method-Override:  POST \t\n", "", PLAIN, 0, NULL},
    {"POST", "/t", "X-HTTP-Method-Override: PUT \n", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t", "X-HTTP-Method-Override: PUT, POST\n", "", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "X-HTTP-Method-Override: POST,PUT\n", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t", "X-HTTP-Method-Override: POST, ,POST\n", "", PLAIN, 0, NULL},
    {"POST", "/t", "X-HTTP-Method-Override: POST\nx-http-method-override: PUT\n", "", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "X-Method-Override: POST\nX-HTTP-Method: DELETE\n", "", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "X-Other: PUT\n", "", PLAIN, 0, NULL},
    /* CGI, PHP and Rack read '_' in a header's name as '-'. */
    {"POST", "/t", "X_HTTP_Method_Override: PUT\n", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t", "X-HTTP_METHOD: PUT\n", "", PLAIN, 400, "method-override-refused"},
    /* A header naming the method itself hides nothing behind it. */
    {"POST", "/t?_method=PUT", "X-HTTP-Method-Override: POST\n", "", PLAIN, 400,
     "method-override-refused"},
    /* The query: every duplicate, names decoded and mangled, ';' as a separator. */
    {"POST", "/t?_method=POST&_method=PUT", "", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t?%5Fmethod=PUT", "", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t?a=1;_method=PUT", "", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t?.method=PUT", "", "", PLAIN, 400, "method-override-refused"},
    {"POST", "/t?_method=post", "", "", PLAIN, 0, NULL},
    {"POST", "/t?method=PUT&x_method=PUT", "", "", PLAIN, 0, NULL},
    /* Forms: decoded names, PHP's mangling, arrays, duplicates, '+' and trimming. */
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "a=1&_method=PUT", PLAIN,
     400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "%5Fmethod=PUT", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "_%6Dethod=PUT", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "_method[]=PUT", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "+method=PUT", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "%20method=PUT", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "_method%00x=PUT", PLAIN,
     400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "_method=POST&_method=PUT",
     PLAIN, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "_method=PUT+", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "_method=POST+", PLAIN, 0,
     NULL},
    {"POST", "/t", "Content-Type: Application/X-WWW-Form-Urlencoded; charset=utf-8\n",
     "_method=PUT", PLAIN, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\n", "a=_method&b=PUT", PLAIN, 0,
     NULL},
    /* No Content-Type: Rack reads a form. */
    {"POST", "/t", "", "_method=PUT", PLAIN, 400, "method-override-refused"},
    /* A body of another type is not a form. */
    {"POST", "/t", "Content-Type: text/plain\n", "_method=PUT", PLAIN, 0, NULL},
    /* JSON: the top-level member, duplicates, escapes; a body that does not parse. */
    {"POST", "/t", "Content-Type: application/json\n", "{\"_method\": \"PUT\"}", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/vnd.api+json\n", "{\"\\u005fmethod\":\"put\"}", PLAIN,
     400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/json\n", "{\"_method\": \"POST\", \"n\": 1}", PLAIN,
     0, NULL},
    {"POST", "/t", "Content-Type: application/json\n", "{\"_method\":\"PUT\",\"_method\":\"POST\"}",
     PLAIN, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/json\n", "{\"_method\": [\"PUT\"]}", PLAIN, 400,
     "method-override-refused"},
    {"POST", "/t", "Content-Type: application/json\n", "{\"a\": {\"_method\": \"PUT\"}}", PLAIN, 0,
     NULL},
    {"POST", "/t", "Content-Type: application/json\n", "{\"n\": 1, \"x\": \"\xff\"}", PLAIN, 0,
     NULL},
    {"POST", "/t", "Content-Type: application/json\n", "{\"x\": \"\xff\", \"_method\": \"PUT\"}",
     PLAIN, 400, "bad-request"},
    /* Compressed bodies: inflated and read; unknown codings refused. */
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\nContent-Encoding: gzip\n",
     "_method=PUT", GZIP, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/json\nContent-Encoding: gzip\n",
     "{\"_method\":\"PUT\"}", GZIP, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/json\nContent-Encoding: gzip\n",
     "{\"_method\":\"POST\"}", GZIP, 0, NULL},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\nContent-Encoding: deflate\n",
     "_method=PUT", DEFLATE, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\nContent-Encoding: deflate\n",
     "_method=PUT", RAW_DEFLATE, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\nContent-Encoding: gzip\n",
     "a=1", GZIP_TWO_MEMBERS, 400, "method-override-refused"},
    {"POST", "/t",
     "Content-Type: application/x-www-form-urlencoded\nContent-Encoding: gzip\n"
     "Content-Encoding: gzip\n",
     "_method=PUT", GZIP_TWICE, 400, "method-override-refused"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\nContent-Encoding: gzip\n",
     "_method=PUT", PLAIN, 400, "bad-request"},
    {"POST", "/t", "Content-Type: application/x-www-form-urlencoded\nContent-Encoding: br\n",
     "_method=PUT", PLAIN, 415, "unsupported-media-type"},
    {"POST", "/t", "Content-Type: application/octet-stream\nContent-Encoding: zstd\n", "xyz", PLAIN,
     415, "unsupported-media-type"},
    {"POST", "/t", "Content-Type: application/json\nContent-Encoding: identity\n", "{}", PLAIN, 0,
     NULL},
};

/* `in` compressed as `coding` into a new buffer. */
static char *compress_as(const char *in, size_t len, enum coding coding, size_t *olen)
{
    z_stream zs;
    size_t cap = len + 128;
    char *out = malloc(cap * 2);
    int bits = coding == DEFLATE ? 15 : coding == RAW_DEFLATE ? -15 : 15 + 16;

    memset(&zs, 0, sizeof zs);
    CHECK(out != NULL && deflateInit2(&zs, 9, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    zs.next_in = (unsigned char *)(uintptr_t)in;
    zs.avail_in = (uInt)len;
    zs.next_out = (unsigned char *)out;
    zs.avail_out = (uInt)cap;
    CHECK_INT(deflate(&zs, Z_FINISH), Z_STREAM_END);
    *olen = zs.total_out;
    deflateEnd(&zs);
    if (coding == GZIP_TWICE) {
        size_t n;
        char *twice = compress_as(out, *olen, GZIP, &n);
        free(out);
        *olen = n;
        return twice;
    }
    if (coding == GZIP_TWO_MEMBERS) {
        size_t n;
        char *second = compress_as("&_method=PUT", 12, GZIP, &n);
        memcpy(out + *olen, second, n);
        *olen += n;
        free(second);
    }
    return out;
}

/* Runs one request through method_override_refuse: its status (0: passed). */
static int run(const char *method, const char *target, const char *headers, const char *body,
               size_t body_len, size_t max_body, struct response *resp)
{
    struct request_field fields[16];
    struct request rq;
    char *copy = strdup(headers), *line = copy;
    size_t n = 0;
    int rc;

    memset(&rq, 0, sizeof rq);
    while (line && *line && n < 16) {
        char *nl = strchr(line, '\n'), *colon = strchr(line, ':');
        *nl = '\0';
        *colon = '\0';
        fields[n].name = line;
        fields[n].value = colon + 1;
        fields[n].value_len = strlen(colon + 1);
        n++;
        line = nl + 1;
    }
    rq.method = method;
    rq.target = target;
    rq.fields = fields;
    rq.nfields = n;
    rq.body = body_len ? body : NULL;
    rq.body_len = body_len;
    response_init(resp);
    rc = method_override_refuse(&rq, override_headers, 3, max_body, resp);
    free(copy);
    return rc;
}

static void test_cases(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct tcase *c = &cases[i];
        struct response resp;
        size_t len = strlen(c->body);
        char *body =
            c->coding == PLAIN ? strdup(c->body) : compress_as(c->body, len, c->coding, &len);
        int rc = run(c->method, c->target, c->headers, body, len, 1 << 20, &resp);

        if (rc != c->status || (c->code && (!resp.problem || strcmp(resp.problem, c->code) != 0)))
            fprintf(stderr, "case %zu (%s %s, %s): got %d %s\n", i, c->method, c->target, c->body,
                    rc, resp.problem ? resp.problem : "-");
        CHECK_INT(rc, c->status);
        if (c->status)
            CHECK_INT(resp.status, c->status);
        response_release(&resp);
        free(body);
    }
}

/* A body that inflates past the bound is refused before it is read whole: 413. */
static void test_inflation_is_bounded(void)
{
    size_t big = 4 << 20, len;
    char *plain = malloc(big + 1), *gz;
    struct response resp;

    memset(plain, 'a', big);
    memcpy(plain, "_method=PUT&x=", 14);
    gz = compress_as(plain, big, GZIP, &len);
    CHECK(len < 64 * 1024);
    CHECK_INT(run("POST", "/t", "Content-Encoding: gzip\n", gz, len, 1 << 20, &resp), 413);
    CHECK_STR(resp.problem, "body-too-large");
    response_release(&resp);
    /* Within the bound it is read. */
    CHECK_INT(run("POST", "/t", "Content-Encoding: gzip\n", gz, len, 8 << 20, &resp), 400);
    CHECK_STR(resp.problem, "method-override-refused");
    response_release(&resp);
    free(gz);
    free(plain);
}

/* PHP reads a field name up to a NUL byte, sent as it is or escaped. */
static void test_nul_in_a_name(void)
{
    static const char body[] = "a=1&_method\0x=PUT";
    struct response resp;

    CHECK_INT(run("POST", "/t", "", body, sizeof body - 1, 1024, &resp), 400);
    CHECK_STR(resp.problem, "method-override-refused");
    response_release(&resp);
}

/* The detail names the source and what it asked for. */
static void test_detail(void)
{
    struct response resp;

    CHECK_INT(run("POST", "/t", "X-HTTP-Method: put , post\n", "", 0, 1024, &resp), 400);
    CHECK(resp.body &&
          strstr(resp.body, "X-HTTP-Method asks the upstream to run this POST as PUT"));
    response_release(&resp);
    CHECK_INT(run("POST", "/t?_method=DELETE", "", "", 0, 1024, &resp), 400);
    CHECK(resp.body && strstr(resp.body, "a _method query argument"));
    response_release(&resp);
}

int main(void)
{
    test_cases();
    test_inflation_is_bounded();
    test_nul_in_a_name();
    test_detail();
    return t_done();
}
