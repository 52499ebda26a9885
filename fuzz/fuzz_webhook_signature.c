/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_webhook_signature.c - libFuzzer harness for orderd's webhook signature check
 * (src/orderd/signature.c): the Provider-Signature header and the raw body come from whoever can
 * reach POST /webhooks/provider.  The input is split at its first NUL: the header's value, then
 * the body.
 *
 * Besides memory errors it checks the one property that matters: an input is accepted only when
 * one of its v1 values really is the HMAC-SHA256 of "<t>.<body>" under the harness's secret, with
 * t within the tolerance -- computed here independently of the code under test.  When the input
 * holds a second NUL, the harness signs the body itself with the timestamp that follows, so that
 * the accepting path is fuzzed too.
 */
#include "signature.h"
#include "fuzz.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/hmac.h>

const char program_name[] = "fuzz_webhook_signature";

#define SECRET "whsec_fuzz_0123456789abcdef"
#define NOW 1764700000
#define TOLERANCE 300

static void hmac_hex(long long t, const char *body, size_t len, char hex[65])
{
    unsigned char mac[32];
    unsigned int mlen = 0;
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "%lld.", t);
    unsigned char *msg = malloc((size_t)plen + len + 1);

    CHECK(msg != NULL, "malloc");
    memcpy(msg, prefix, (size_t)plen);
    if (len)
        memcpy(msg + plen, body, len);
    CHECK(HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), msg, (size_t)plen + len, mac, &mlen) &&
              mlen == 32,
          "HMAC");
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    free(msg);
}

/*
 * Whether `header` carries a valid signature of `body`, read by the documented format: members
 * split at ',', leading spaces dropped, exactly one "t=<digits>" within the tolerance, and a
 * "v1=<hex>" member (either case) that is the HMAC of "<t>.<body>".
 */
static int really_signed(const char *header, const char *body, size_t len)
{
    char *copy = strdup(header), *item, *save = NULL;
    long long t = -1;
    int nt = 0, ok = 0;
    char want[65];

    CHECK(copy != NULL, "strdup");
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        if (strncmp(item, "t=", 2) == 0) {
            char *end = NULL;
            nt++;
            t = strtoll(item + 2, &end, 10);
            if (end == item + 2 || *end != '\0' || item[2] == '-' || item[2] == '+')
                t = -1;
        }
    }
    free(copy);
    if (nt != 1 || t < NOW - TOLERANCE || t > NOW + TOLERANCE)
        return 0;
    hmac_hex(t, body, len, want);
    copy = strdup(header);
    CHECK(copy != NULL, "strdup");
    for (item = strtok_r(copy, ",", &save); item && !ok; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        if (strncmp(item, "v1=", 3) == 0 && strlen(item + 3) == 64) {
            ok = 1;
            for (int i = 0; i < 64 && ok; i++) {
                char c = item[3 + i];
                if (c >= 'A' && c <= 'F')
                    c = (char)(c + 32);
                ok = c == want[i];
            }
        }
    }
    free(copy);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *nul = memchr(data, '\0', size);
    size_t hlen = nul ? (size_t)(nul - (const char *)data) : size;
    char *header = malloc(hlen + 200);
    const char *body = nul ? (const char *)data + hlen + 1 : "";
    size_t blen = nul ? size - hlen - 1 : 0;
    const char *second = nul ? memchr(body, '\0', blen) : NULL;
    const char *why;

    CHECK(header != NULL, "malloc");
    memcpy(header, data, hlen);
    header[hlen] = '\0';
    if (second) {
        /* Sign the body up to the second NUL ourselves, at an offset taken from the header. */
        char hex[65];
        long long t = NOW - TOLERANCE + (long long)(hlen % (2 * TOLERANCE + 3));
        blen = (size_t)(second - body);
        hmac_hex(t, body, blen, hex);
        snprintf(header, hlen + 200, "t=%lld,v1=%s", t, hex);
    }
    why = webhook_signature_check(SECRET, header, body, blen, NOW, TOLERANCE);
    if (why == NULL)
        CHECK(really_signed(header, body, blen), "only a real signature is accepted");
    else
        CHECK(why[0] != '\0', "a refusal says why");
    free(header);
    return 0;
}
