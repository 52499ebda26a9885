/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_error.c - error texts and the small helpers of lib/error.c.  Programs print these names
 * and sentences in logs and HTTP problem details, so every code of IDEM_ERRNO_MAP must have both,
 * and an unknown code must still produce something printable rather than NULL.
 */
#include "internal.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>

static void test_names_and_texts(void)
{
    static const struct {
        int code;
        const char *name;
        const char *text;
    } known[] = {
        {IDEM_OK, "IDEM_OK", "success"},
        {IDEM_ENOMEM, "IDEM_ENOMEM", "out of memory"},
        {IDEM_EKEY, "IDEM_EKEY", "idempotency key invalid"},
        {IDEM_EDUPKEY, "IDEM_EDUPKEY", "duplicate member name in a JSON object"},
        {IDEM_EMIGRATE, "IDEM_EMIGRATE", "schema migration failed"},
        {-999, "IDEM_UNKNOWN", "unknown error"},
        {1, "IDEM_UNKNOWN", "unknown error"},
        {IDEM_EMOVED, "IDEM_EMOVED",
         "the principal's bucket is not on this cluster (moved or moving)"},
        {-16, "IDEM_UNKNOWN", "unknown error"},
    };
    /* Every code of the map, taken from the map itself so a new one is covered at once. */
    static const struct {
        int code;
        const char *name;
        const char *text;
    } map[] = {
#define ROW(name, code, text) {code, "IDEM_" #name, text},
        IDEM_ERRNO_MAP(ROW)
#undef ROW
    };
    size_t i, j;

    for (i = 0; i < sizeof known / sizeof known[0]; i++) {
        CHECK_STR(idem_err_name(known[i].code), known[i].name);
        CHECK_STR(idem_strerror(known[i].code), known[i].text);
    }
    for (i = 0; i < sizeof map / sizeof map[0]; i++) {
        CHECK(map[i].code < 0);
        CHECK_STR(idem_err_name(map[i].code), map[i].name);
        CHECK_STR(idem_strerror(map[i].code), map[i].text);
        /* Codes are distinct, so a name always maps back to one code. */
        for (j = 0; j < i; j++)
            CHECK(map[i].code != map[j].code);
    }
    CHECK_INT(sizeof map / sizeof map[0], 15);
}

static void test_free(void)
{
    idem_free(NULL);
    idem_free(malloc(16));
    CHECK(1);
}

static void test_fmt_and_strdup(void)
{
    char buf[8], *copy;

    idem__fmt(buf, sizeof buf, "%s=%d", "n", 42);
    CHECK_STR(buf, "n=42");
    /* Truncates and still terminates. */
    idem__fmt(buf, sizeof buf, "%s", "a much longer sentence");
    CHECK_STR(buf, "a much ");
    idem__fmt(buf, 1, "%s", "x");
    CHECK_STR(buf, "");
    /* No buffer, or no room: nothing is written and nothing crashes. */
    idem__fmt(NULL, 10, "%d", 1);
    buf[0] = 'Z';
    idem__fmt(buf, 0, "%d", 1);
    CHECK(buf[0] == 'Z');

    CHECK(idem__strdup(NULL) == NULL);
    copy = idem__strdup("hello");
    CHECK_STR(copy, "hello");
    free(copy);
    copy = idem__strdup("");
    CHECK_STR(copy, "");
    free(copy);
}

/*
 * common/clock.h's clocks and its sleep, which the libraries use: here the pause itself is what
 * is tested (it lasts at least what was asked), not a wait for something else to happen.
 */
static void test_clocks(void)
{
    int64_t wall = clock_wall_ms(), t0, t1;

    /* After 2020-01-01 and before 2200: the wall clock is in milliseconds, not seconds. */
    CHECK(wall > INT64_C(1577836800000));
    CHECK(wall < INT64_C(7258118400000));

    t0 = clock_mono_ms();
    clock_sleep_ms(30);
    t1 = clock_mono_ms();
    CHECK(t1 - t0 >= 30);
    CHECK(t1 - t0 < 5000);

    /*
     * Zero and negative pauses return at once: -10 s taken for its magnitude would last 10 s,
     * and the bound, far below that, still allows for a loaded machine's scheduling delays.
     */
    t0 = clock_mono_ms();
    clock_sleep_ms(0);
    clock_sleep_ms(-10000);
    t1 = clock_mono_ms();
    CHECK(t1 - t0 < 5000);
}

int main(void)
{
    test_names_and_texts();
    test_free();
    test_fmt_and_strdup();
    test_clocks();
    return t_done();
}
