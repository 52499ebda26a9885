/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_limits_options.c - the HTTP limit flags as rows of a program's option table: each value is
 * checked and kept by http_limits_flag(), so the flags and the gateway config's `limits:` say the
 * same thing of a bad value.
 */
#include "http_limits_options.h"

#include "banned.h"

int http_limits_option(struct options *o, const struct option_row *row, const char *arg)
{
    const struct option_row *group = row;
    char err[320];
    int rc;

    while (group->kind == OPTION_CALLBACK && group->callback == http_limits_option)
        group++;
    rc = http_limits_flag(group->value, row->name, arg, err, sizeof err);
    if (rc == 0)
        return options_error(o, "internal error: --%s is no HTTP limit", row->name);
    if (rc < 0)
        return options_error(o, "%s", err);
    return OPTIONS_CONTINUE;
}
