/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sim_util.h - the helpers only provider-sim needs, on top of the ones it shares with orderd
 * (src/util/util.h, included here): the log on stderr, random ids and rates from OpenSSL, and
 * the number checks of its command line and JSON bodies.
 */
#ifndef SIM_UTIL_H
#define SIM_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "log.h"
#include "util.h"

/* Its log (log.h): "provider-sim: LEVEL: message" lines on stderr, escaped. */
extern const struct logger sim_log;

/* `prefix` and 24 random hex digits: "ch_3f9c...".  `out` holds at least strlen(prefix) + 25. */
void new_id(const char *prefix, char *out, size_t cap);

/* A uniform random number in [0, 1) from OpenSSL's CSPRNG. */
double random_unit(void);

/* A JSON number that is a whole number in [min, max] (jansson integers or reals). */
int json_whole(const json_t *v, int64_t min, int64_t max, int64_t *out);

#endif /* SIM_UTIL_H */
