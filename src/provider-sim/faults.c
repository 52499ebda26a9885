/* SPDX-License-Identifier: Apache-2.0 */
/*
 * faults.c - the fault settings behind --latency-ms, --fail-rate, ... and POST /v1/faults.  An
 * update is validated completely before anything changes, so a half-applied fault profile never
 * exists.
 */
#include "faults.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sim_util.h"
#include "banned.h"

void fault_settings_default(struct fault_settings *s)
{
    memset(s, 0, sizeof *s);
    s->slow_ms = 3000;
    s->webhook_dup = 1;
}

void faults_init(struct faults *f, const struct fault_settings *initial)
{
    if (pthread_mutex_init(&f->mu, NULL) != 0)
        die("pthread_mutex_init failed");
    f->s = *initial;
}

void faults_destroy(struct faults *f)
{
    pthread_mutex_destroy(&f->mu);
}

void faults_get(struct faults *f, struct fault_settings *out)
{
    pthread_mutex_lock(&f->mu);
    *out = f->s;
    pthread_mutex_unlock(&f->mu);
}

static int rate_member(const json_t *v, const char *name, double *out, char *err, size_t errlen)
{
    double d = json_is_number(v) ? json_number_value(v) : NAN;

    if (!isfinite(d) || d < 0.0 || d > 1.0) {
        snprintf(err, errlen, "%s must be a number from 0 to 1", name);
        return -1;
    }
    *out = d;
    return 0;
}

static int ms_member(const json_t *v, const char *name, int64_t *out, char *err, size_t errlen)
{
    if (json_whole(v, 0, FAULTS_MAX_MS, out) != 0) {
        snprintf(err, errlen, "%s must be an integer from 0 to %d", name, FAULTS_MAX_MS);
        return -1;
    }
    return 0;
}

int faults_update(struct faults *f, const json_t *doc, char *err, size_t errlen)
{
    struct fault_settings next;
    const char *name;
    json_t *v;
    int64_t n = 0;
    int rc = 0;

    if (!json_is_object(doc)) {
        snprintf(err, errlen, "the body must be a JSON object of settings");
        return -1;
    }
    pthread_mutex_lock(&f->mu);
    next = f->s;
    json_object_foreach((json_t *)doc, name, v)
    {
        if (strcmp(name, "latency_ms") == 0)
            rc = ms_member(v, name, &next.latency_ms, err, errlen);
        else if (strcmp(name, "latency_jitter_ms") == 0)
            rc = ms_member(v, name, &next.latency_jitter_ms, err, errlen);
        else if (strcmp(name, "slow_ms") == 0)
            rc = ms_member(v, name, &next.slow_ms, err, errlen);
        else if (strcmp(name, "webhook_delay_ms") == 0)
            rc = ms_member(v, name, &next.webhook_delay_ms, err, errlen);
        else if (strcmp(name, "fail_rate") == 0)
            rc = rate_member(v, name, &next.fail_rate, err, errlen);
        else if (strcmp(name, "lost_rate") == 0)
            rc = rate_member(v, name, &next.lost_rate, err, errlen);
        else if (strcmp(name, "webhook_dup") == 0) {
            rc = json_whole(v, 1, FAULTS_MAX_DUP, &n);
            if (rc != 0)
                snprintf(err, errlen, "webhook_dup must be an integer from 1 to %d",
                         FAULTS_MAX_DUP);
            else
                next.webhook_dup = (int)n;
        } else {
            snprintf(err, errlen, "unknown setting '%.64s'", name);
            rc = -1;
        }
        if (rc != 0)
            break;
    }
    if (rc == 0)
        f->s = next;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

json_t *faults_json(const struct fault_settings *s)
{
    return xcheck(
        json_pack("{s:I, s:I, s:f, s:f, s:I, s:i, s:I}", "latency_ms", (json_int_t)s->latency_ms,
                  "latency_jitter_ms", (json_int_t)s->latency_jitter_ms, "fail_rate", s->fail_rate,
                  "lost_rate", s->lost_rate, "slow_ms", (json_int_t)s->slow_ms, "webhook_dup",
                  s->webhook_dup, "webhook_delay_ms", (json_int_t)s->webhook_delay_ms));
}

int faults_roll(double rate)
{
    if (rate <= 0.0)
        return 0;
    if (rate >= 1.0)
        return 1;
    return random_unit() < rate;
}

int64_t faults_latency(const struct fault_settings *s)
{
    int64_t ms = s->latency_ms;

    if (s->latency_jitter_ms > 0)
        ms += (int64_t)(random_unit() * (double)(s->latency_jitter_ms + 1));
    return ms;
}
