/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_record.c - the stored response headers: only the allow list (the default one or an
 * operation's own) is kept, values that could
 * split a header line are refused, and what is stored decodes back to the same pairs.
 */
#include "internal.h"
#include "t.h"

#include <stdlib.h>

int main(void)
{
    struct idem_header in[] = {
        {"content-type", "application/json"},   {"Set-Cookie", "session=secret"},
        {"LOCATION", "/api/orders/ord_1"},      {"Date", "Tue, 01 Dec 2026 10:00:00 GMT"},
        {"Location", "/evil\r\nX-Injected: 1"}, {NULL, "x"},
    };
    struct idem_header *out = NULL;
    size_t n = 0;
    char *text = NULL;

    CHECK_INT(idem__headers_encode(in, 6, NULL, 0, &text), 0);
    CHECK_STR(text, "Content-Type: application/json\nLocation: /api/orders/ord_1\n");
    CHECK_INT(idem__headers_decode(text, &out, &n), 0);
    CHECK_INT(n, 2);
    if (n == 2) {
        CHECK_STR(out[0].name, "Content-Type");
        CHECK_STR(out[0].value, "application/json");
        CHECK_STR(out[1].name, "Location");
        CHECK_STR(out[1].value, "/api/orders/ord_1");
    }
    free(out);
    free(text);

    /* Nothing allowed: an empty text, and no headers back. */
    CHECK_INT(idem__headers_encode(in + 1, 1, NULL, 0, &text), 0);
    CHECK_STR(text, "");
    CHECK_INT(idem__headers_decode(text, &out, &n), 0);
    CHECK_INT(n, 0);
    CHECK(out == NULL);
    free(text);
    CHECK_INT(idem__headers_decode(NULL, &out, &n), 0);
    CHECK_INT(n, 0);

    /* An operation's own list (idem-gateway's store_headers) replaces the default one. */
    {
        static const char *const allow[] = {"ETag", "Content-Type"};
        struct idem_header etag[] = {
            {"etag", "\"v1\""}, {"Location", "/x"}, {"Content-Type", "text/plain"}};
        CHECK_INT(idem__headers_encode(etag, 3, allow, 2, &text), 0);
        CHECK_STR(text, "ETag: \"v1\"\nContent-Type: text/plain\n");
        free(text);
    }
    return t_done();
}
