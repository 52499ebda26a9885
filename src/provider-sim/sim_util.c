/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sim_util.c - the helpers of sim_util.h, kept apart so each concept file (charges, webhooks,
 * faults) reads as that concept only.
 */
#include "sim_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "banned.h"

/* The word die() and the log lines begin with (src/util/util.h). */
const char program_name[] = "provider-sim";

/* provider-sim's log lines: the text form of log.h, escaped like every program's. */
const struct logger sim_log = {LOG_TEXT};

void new_id(const char *prefix, char *out, size_t cap)
{
    unsigned char raw[12];
    char hex[2 * sizeof raw + 1];

    random_bytes(raw, sizeof raw);
    hex_encode(raw, sizeof raw, hex);
    snprintf(out, cap, "%s%s", prefix, hex);
}

double random_unit(void)
{
    uint64_t v = 0;

    random_bytes((unsigned char *)&v, sizeof v);
    return (double)(v >> 11) / 9007199254740992.0; /* 53 random bits / 2^53 */
}

int json_whole(const json_t *v, int64_t min, int64_t max, int64_t *out)
{
    double d;

    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < min || i > max)
            return -1;
        *out = (int64_t)i;
        return 0;
    }
    if (!json_is_real(v))
        return -1;
    d = json_real_value(v);
    if (!isfinite(d) || d < (double)min || d > (double)max || (double)(int64_t)d != d)
        return -1;
    *out = (int64_t)d;
    return 0;
}
