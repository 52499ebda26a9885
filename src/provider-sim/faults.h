/* SPDX-License-Identifier: Apache-2.0 */
/*
 * faults.h - what can go wrong on purpose.  The settings start from the command line and can be
 * changed at run time (POST /v1/faults), so one test can turn a fault on, watch the client cope,
 * and turn it off again.  Every request reads one consistent snapshot.
 */
#ifndef SIM_FAULTS_H
#define SIM_FAULTS_H

#include <pthread.h>
#include <stdint.h>

#include <jansson.h>

#define FAULTS_MAX_MS 600000
#define FAULTS_MAX_DUP 10

struct fault_settings {
    int64_t latency_ms;        /* added before every /v1 POST is handled */
    int64_t latency_jitter_ms; /* plus a uniform random 0..jitter */
    double fail_rate;          /* share of POSTs answered 503 before anything runs */
    double lost_rate;          /* share of POSTs whose effect commits, then no response */
    int64_t slow_ms;           /* how long a tok_slow charge takes */
    int webhook_dup;           /* each event is delivered this many times (1..10) */
    int64_t webhook_delay_ms;  /* before the first delivery of an event */
};

struct faults {
    pthread_mutex_t mu;
    struct fault_settings s;
};

/* The defaults: no fault, tok_slow takes 3 s, every event delivered once at once. */
void fault_settings_default(struct fault_settings *s);

void faults_init(struct faults *f, const struct fault_settings *initial);
void faults_destroy(struct faults *f);
/* A consistent copy of the current settings. */
void faults_get(struct faults *f, struct fault_settings *out);

/*
 * Applies the members of the JSON object `doc` that name a setting (others are refused).
 * All or nothing: returns 0, or -1 with a sentence in `err` and nothing changed.
 */
int faults_update(struct faults *f, const json_t *doc, char *err, size_t errlen);

/* The settings as a JSON object (new). */
json_t *faults_json(const struct fault_settings *s);

/* Whether an event of probability `rate` happens this time. */
int faults_roll(double rate);

/* The added latency of one request: latency_ms plus a random share of the jitter. */
int64_t faults_latency(const struct fault_settings *s);

#endif /* SIM_FAULTS_H */
