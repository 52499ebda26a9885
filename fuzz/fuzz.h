/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz.h - what every libFuzzer harness of fuzz/ shares: the entry point's declaration and
 * CHECK(), which aborts -- so libFuzzer keeps the input as a crash -- when an invariant a harness
 * states besides memory safety does not hold, naming the harness's file and line.
 */
#ifndef IDEM_FUZZ_H
#define IDEM_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond, what)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, what);            \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif /* IDEM_FUZZ_H */
